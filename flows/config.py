"""The run config: one section per stage, each handed only to its own stage (docs/design.md §8, Config)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from tasks.config import load
from tasks.dedup.config import DedupConfig
from tasks.eval.config import EvalConfig
from tasks.ingest.code.config import CodeIngestConfig
from tasks.ingest.config import IngestConfig
from tasks.tokenize.config import TokenizeConfig, TokenizerConfig
from tasks.repo import REPO_ROOT
from tasks.train.config import TrainConfig

CONFIG_DIR = REPO_ROOT / "configs"
DEFAULT_CONFIG = CONFIG_DIR / "demo.toml"


@dataclass
class LaunchConfig:
    """How the train task starts torchrun; not part of the run's fingerprint (any world size resumes)."""

    nproc: int = 2
    max_restarts: int = 1  # failed ranks replaced (in-process), or restarts of all ranks (torchrun), per launch
    task_retries: int = 1  # then Prefect retries the whole launch this many times
    timeout_minutes: float = 120.0
    # in-process: smelt's node agent replaces a failed rank with a warm spare and the others rejoin in their
    # own processes (tasks/train/agent.py); torchrun: every rank restarts (the fallback)
    restart: str = "in-process"
    lease_wait_minutes: float = 0.0  # a run folder another launcher holds: 0 refuses at once, else wait this long
    # a launcher that cannot renew its run folder's lease this long (paused, partitioned) may be taken over, and
    # then stops its ranks; clocks of the hosts must agree to well under it
    lease_timeout_minutes: float = 1.0

    def __post_init__(self) -> None:
        if self.restart not in ("in-process", "torchrun"):
            raise ValueError(f"launch.restart is {self.restart!r}; choose in-process or torchrun")
        if self.nproc < 1:
            raise ValueError(f"launch.nproc must be at least 1, got {self.nproc}")
        if self.max_restarts < 0 or self.task_retries < 0:
            raise ValueError("launch.max_restarts and launch.task_retries must be >= 0")
        if self.lease_wait_minutes < 0:
            raise ValueError(f"launch.lease_wait_minutes must be >= 0, got {self.lease_wait_minutes}")
        if self.lease_timeout_minutes <= 0:
            raise ValueError(f"launch.lease_timeout_minutes must be positive, got {self.lease_timeout_minutes}")
        if self.timeout_minutes <= 0:
            raise ValueError(f"launch.timeout_minutes must be positive, got {self.timeout_minutes}")


@dataclass
class RunConfig:
    ingest: IngestConfig = field(default_factory=IngestConfig)
    ingest_code: CodeIngestConfig = field(default_factory=CodeIngestConfig)
    dedup: DedupConfig = field(default_factory=DedupConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    tokenize: TokenizeConfig = field(default_factory=TokenizeConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    # Weights of the training mixture when the run has both branches (web and code token datasets).
    mixture: dict[str, float] = field(default_factory=lambda: {"web": 0.8, "code": 0.2})


def load_run_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """The run config from ``path`` (default: configs/demo.toml) with ``section.key=value`` overrides."""
    return load(RunConfig, path or DEFAULT_CONFIG, overrides)


def section(cfg: RunConfig, name: str) -> dict:
    return dataclasses.asdict(getattr(cfg, name))
