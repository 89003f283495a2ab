"""Training config: the model preset (shapes in ``tasks/model_config.py``) and its overrides, parallel
layout, optimizer, data, checkpoints.

Plain dataclasses with no torch import, so the planner (``infra/``) and the CLI can read the same
config the trainer builds. Every value is checked when the config is built (``__post_init__``), so a
mistake is one sentence at load time, before anything launches; what needs the world size or the
data (layout divisibility, vocabulary) is checked by ``tasks.train.node_launch.preflight``.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from tasks.errors import UserError
from tasks.storage import normalize_url
from tasks.model_config import PRESETS, ModelConfig, preset
from tasks.train import hf_folder

# The option values the trainer implements; one home for the CLI, the planner and the trainer.
PP_SCHEDULES = {"1F1B": 1, "Interleaved1F1B": 2, "ZBVZeroBubble": 2}  # schedule -> stages per pp rank
AC_MODES = ("none", "selective", "full")
MIXED_PRECISION = ("auto", "fp32", "bf16")
FLOAT8_RECIPES = ("none", "tensorwise", "rowwise")  # torchao Float8Linear recipes (tasks/train/float8.py)
ASYNC_MODES = ("off", "thread", "process")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise UserError(message)


def _choice(key: str, value: str, choices) -> None:
    _require(value in choices, f"{key} is {value!r}; choose one of {', '.join(choices)}")


@dataclass
class ModelOverrides:
    """``[train.model]``: fields of the preset to change; unset (None) keeps the preset's value."""

    dim: int | None = None
    n_layers: int | None = None
    n_heads: int | None = None
    n_kv_heads: int | None = None
    ffn_hidden: int | None = None
    vocab_size: int | None = None
    max_seq_len: int | None = None
    rope_theta: float | None = None
    norm_eps: float | None = None
    tie_embeddings: bool | None = None

    def given(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass
class ParallelConfig:
    """Mesh degrees ``pp × dp_replicate × dp_shard × tp``; ``dp_shard = -1`` takes the rest of the world."""

    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = -1
    tp: int = 1
    pp_schedule: str = "1F1B"  # 1F1B | Interleaved1F1B | ZBVZeroBubble
    pp_microbatches: int = 0  # 0: one per pipeline stage
    zero2: bool = False  # keep params unsharded after forward (no reshard)
    # one FSDP2 group per block (each block's all-gather overlaps the one before); false: one group for the whole
    # model, 3 collectives a step instead of 3 per block: 10% of the demo model's CPU step (bench/demo_train_cost.py)
    fsdp_per_block: bool = True
    activation_checkpoint: str = "none"  # none | full | selective
    compile: bool = False
    mixed_precision: str = "auto"  # auto: bf16 params + fp32 reduce on GPU, fp32 on CPU; fp32 | bf16
    float8: str = "none"  # none | tensorwise | rowwise: the blocks' matmuls in FP8 (tasks/train/float8.py)

    def __post_init__(self) -> None:
        for name in ("pp", "dp_replicate", "tp"):
            _require(getattr(self, name) >= 1, f"parallel.{name} must be at least 1, got {getattr(self, name)}")
        _require(self.dp_shard == -1 or self.dp_shard >= 1,
                 f"parallel.dp_shard must be -1 (the rest of the world) or at least 1, got {self.dp_shard}")
        _require(self.pp_microbatches >= 0, f"parallel.pp_microbatches must be >= 0, got {self.pp_microbatches}")
        _choice("parallel.pp_schedule", self.pp_schedule, PP_SCHEDULES)
        _choice("parallel.activation_checkpoint", self.activation_checkpoint, AC_MODES)
        _choice("parallel.mixed_precision", self.mixed_precision, MIXED_PRECISION)
        _choice("parallel.float8", self.float8, FLOAT8_RECIPES)


@dataclass
class OptimConfig:
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 5
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0

    def __post_init__(self) -> None:
        _require(self.lr > 0, f"optim.lr must be positive, got {self.lr}")
        _require(0 <= self.min_lr_ratio <= 1, f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        _require(self.warmup_steps >= 0, f"optim.warmup_steps must be >= 0, got {self.warmup_steps}")
        _require(self.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {self.weight_decay}")
        _require(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "optim.beta1 and optim.beta2 must be in [0, 1)")
        _require(self.eps > 0 and self.grad_clip > 0, "optim.eps and optim.grad_clip must be positive")


@dataclass
class DataConfig:
    """Fixed global batch (sequences) and sequence length: the run's contract (docs/design.md §4)."""

    seq_len: int = 128
    global_batch: int = 8
    micro_batch: int = 0  # 0: global_batch / dp world size (no accumulation)
    seed: int = 1234
    prefetch: int = 2
    mixture: dict[str, float] = field(default_factory=dict)  # dataset name -> weight; empty: one dataset

    def __post_init__(self) -> None:
        _require(self.seq_len >= 1, f"data.seq_len must be at least 1, got {self.seq_len}")
        _require(self.global_batch >= 1, f"data.global_batch must be at least 1, got {self.global_batch}")
        _require(self.micro_batch >= 0, f"data.micro_batch must be >= 0 (0: no accumulation), got {self.micro_batch}")
        _require(not self.micro_batch or self.global_batch % self.micro_batch == 0,
                 f"data.micro_batch ({self.micro_batch}) must divide data.global_batch ({self.global_batch})")
        _require(self.prefetch >= 0, f"data.prefetch must be >= 0, got {self.prefetch}")
        bad = [name for name, w in self.mixture.items() if not isinstance(w, (int, float)) or w <= 0]
        _require(not bad, f"data.mixture weights must be positive numbers; fix {', '.join(map(repr, bad))}")


@dataclass
class CheckpointConfig:
    interval_steps: int = 10
    interval_minutes: float = 0.0  # 0: steps only
    keep_last: int = 2
    keep_every: int = 0  # also keep every N-th step (0: none)
    eval_hold_minutes: float = 30.0  # a published checkpoint outlives retention this long for its eval (eval_holds.py)
    async_mode: str = "thread"  # off | thread | process

    def __post_init__(self) -> None:
        _require(self.interval_steps >= 0 and self.interval_minutes >= 0 and self.keep_every >= 0,
                 "checkpoint.interval_steps, interval_minutes and keep_every must be >= 0 (0: off)")
        _require(self.keep_last >= 1, "checkpoint.keep_last must be at least 1: the newest checkpoint is never deleted")
        _choice("checkpoint.async_mode", self.async_mode, ASYNC_MODES)


@dataclass
class SnapshotConfig:
    """In-memory snapshots of every step on this node and a peer node (tasks/train/snapshot.py)."""

    enabled: str = "auto"  # auto: on when there is more than one rank | on | off
    interval_steps: int = 1  # a snapshot after every N-th step
    keep: int = 2  # newest snapshots each rank keeps, of its own state and of the replica it holds
    dir: str = ""  # the node-local store; empty: $SMELT_SNAPSHOT_DIR, else /dev/shm/smelt-snapshots

    def __post_init__(self) -> None:
        _choice("snapshot.enabled", self.enabled, ("auto", "on", "off"))
        _require(self.interval_steps >= 1, f"snapshot.interval_steps must be at least 1, got {self.interval_steps}")
        _require(self.keep >= 1, f"snapshot.keep must be at least 1, got {self.keep}")

    def active(self, world_size: int) -> bool:
        return self.enabled == "on" or (self.enabled == "auto" and world_size > 1)


@dataclass
class WatchdogConfig:
    """Hangs become failures that torchrun restarts (tasks/train/watchdog.py)."""

    collective_timeout_s: float = 1800.0  # the default process group's collective timeout
    hang_timeout_s: float = 600.0  # no step finished for this long: the rank exits for a restart
    startup_timeout_s: float = 1800.0  # instead, before the first step, over rollbacks and the final commit

    def __post_init__(self) -> None:
        if min(self.collective_timeout_s, self.hang_timeout_s, self.startup_timeout_s) <= 0:
            raise ValueError("watchdog timeouts must be positive seconds")


@dataclass
class LossGuardConfig:
    """NaN/Inf or spiking loss rolls back to the last good checkpoint (tasks/train/loss_guard.py)."""

    enabled: bool = True
    window: int = 50  # recent accepted losses the spike test looks at
    min_history: int = 10  # no spike test before this many losses are known
    z_threshold: float = 6.0  # robust z-score (median/MAD) above which a loss is a spike
    skip_batches: int = 8  # global batches skipped, ending with the one that tripped the guard

    def __post_init__(self) -> None:
        if self.window < 3 or not 3 <= self.min_history <= self.window:
            raise ValueError("loss_guard needs window >= 3 and 3 <= min_history <= window")
        if self.skip_batches < 1 or self.z_threshold <= 0:
            raise ValueError("loss_guard.skip_batches must be >= 1 and loss_guard.z_threshold > 0")


@dataclass
class StragglerConfig:
    """Per-rank step timing and slow-rank flags (tasks/train/stragglers.py)."""

    every_steps: int = 20  # steps per window; rank 0 gathers every rank's times once per window
    margin: float = 0.25  # flagged when a rank's compute exceeds the median by this fraction ...
    consecutive_windows: int = 3  # ... in this many windows in a row
    write_exclude_list: bool = False  # also write <run_dir>/exclude_hosts.json for the next launch

    def __post_init__(self) -> None:
        if self.every_steps < 1 or self.consecutive_windows < 1 or self.margin <= 0:
            raise ValueError("stragglers.every_steps and consecutive_windows must be >= 1 and margin > 0")


@dataclass
class FaultConfig:
    """Fault injection for tests, off by default; same syntax as SMELT_FAULTS (tasks/train/faults.py),
    e.g. "kill:rank=1,step=7;nan:step=6"."""

    inject: str = ""


@dataclass
class ReplicaConfig:
    """``[train.ft]``: ``parallel.dp_replicate`` fault-tolerant replica groups on torchft (tasks/train/replicas.py).
    Off: the replicate dim is part of one job's mesh (HSDP). On: each group is a job of its own (FSDP/TP
    inside), joined by torchft's Lighthouse and a Manager per group; a lost group drops out and the others
    keep stepping at the same global batch, and it heals from a live peer when it is back."""

    enabled: bool = False
    min_replicas: int = 1  # groups a step needs to commit
    heartbeat_timeout_ms: int = 1000  # the Lighthouse drops a group silent this long (a survivor's pause)
    join_timeout_ms: int = 1000  # the Lighthouse waits this long for heartbeating groups to join a quorum
    quorum_tick_ms: int = 100
    timeout_s: float = 30.0  # collectives across groups, the commit vote and healing transfers
    quorum_timeout_s: float = 60.0  # one quorum; a Lighthouse away longer than this fails the step's retries
    quorum_retries: int = 20  # each group's manager server retries the Lighthouse this often in one quorum
    lighthouse_port: int = 0  # 0: a free port on 127.0.0.1
    max_group_restarts: int = 3  # restarts of each group by the local launcher

    def __post_init__(self) -> None:
        _require(self.min_replicas >= 1, f"ft.min_replicas must be at least 1, got {self.min_replicas}")
        _require(min(self.heartbeat_timeout_ms, self.join_timeout_ms, self.quorum_tick_ms) > 0
                 and min(self.timeout_s, self.quorum_timeout_s) > 0, "ft timeouts must be positive")
        _require(min(self.lighthouse_port, self.max_group_restarts, self.quorum_retries) >= 0,
                 "ft.lighthouse_port, ft.max_group_restarts and ft.quorum_retries must be >= 0")


@dataclass
class TrainConfig:
    model_preset: str = "tiny"
    model: ModelOverrides = field(default_factory=ModelOverrides)
    steps: int = 40
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    snapshot: SnapshotConfig = field(default_factory=SnapshotConfig)
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    loss_guard: LossGuardConfig = field(default_factory=LossGuardConfig)
    stragglers: StragglerConfig = field(default_factory=StragglerConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)
    ft: ReplicaConfig = field(default_factory=ReplicaConfig)  # fault-tolerant replica groups (torchft)
    seed: int = 0
    log_every: int = 1
    init_from: str = ""  # a Hugging Face Llama folder to start from (continued pretraining); its shape wins

    def __post_init__(self) -> None:
        _choice("train.model_preset", self.model_preset, PRESETS)
        _require(self.steps >= 1, f"train.steps must be at least 1, got {self.steps}")
        _require(self.log_every >= 1, f"train.log_every must be at least 1, got {self.log_every}")
        self.model_config()  # the preset with its overrides must be a valid shape

    def model_config(self, vocab_size: int | None = None) -> ModelConfig:
        """The model to build; ``vocab_size`` (the tokenizer's) fills a vocabulary neither preset nor overrides set."""
        overrides = self.model.given()
        if vocab_size is not None and not overrides.get("vocab_size") and not PRESETS[self.model_preset].vocab_size:
            overrides["vocab_size"] = vocab_size
        return preset(self.model_preset, **overrides)

    def model_for_data(self, data_vocab_size: int) -> ModelConfig:
        """The model for data tokenized with a ``data_vocab_size`` vocabulary; refuses one too small for its ids.
        With ``init_from`` it is the Hugging Face folder's shape (tasks/train/hf_folder.py)."""
        if self.init_from:
            folder = hf_folder.local_folder(self.init_from)
            return hf_folder.model_config(hf_folder.read_config(folder), vocab_size=data_vocab_size)
        model = self.model_config(vocab_size=data_vocab_size)
        _require(model.vocab_size >= data_vocab_size,
                 f"the model's vocabulary ({model.vocab_size}, from train.model.vocab_size or preset "
                 f"{self.model_preset!r}) is smaller than the data's tokenizer ({data_vocab_size}); set "
                 f"train.model.vocab_size = 0 to take the tokenizer's, or at least {data_vocab_size}")
        return model


# -- the data a run trains on ----------------------------------------------------------------------

_NAMED = re.compile(r"^([A-Za-z_][\w.-]*)=(.+)$")


def parse_data(items: list[str]) -> dict[str, str]:
    """``["URL"]`` or ``["web=URL", "code=URL"]`` → {name: normalised URL}; a lone unnamed URL is "main".

    The one parser of a run's data list (CLI, flow, torchrun entry point).
    """
    items = [item.strip() for item in items if item.strip()]
    out: dict[str, str] = {}
    for item in items:
        match = _NAMED.match(item)
        if match and "://" not in match.group(1):
            name, url = match.groups()
        elif len(items) == 1:
            name, url = "main", item
        else:
            raise UserError(f"data item {item!r} needs a name when several datasets are given: name=URL")
        _require(name not in out, f"data names dataset {name!r} twice; give each dataset its own name")
        out[name] = normalize_url(url)
    _require(bool(out), "no data given; pass a tokens dataset URL")
    return out
