"""One fault-tolerant replica group (``[train.ft]``): a torchrun job of its own that steps with the other
groups through torchft's Manager, at a fixed global batch, every sample exactly once.

    torchrun ... -m tasks.train.replica_group --config URL --data URL --run-dir URL --replica-id N

Each optimizer step (read ``ReplicaGroup.step`` top to bottom):

1. **Quorum** (``Manager.start_quorum``, synchronous): the Lighthouse names the groups of this step; a
   group that is behind (restarted) first heals — it fetches the model, optimizer and step from a live
   peer — so every participant holds the same state and the same step number.
2. **Its share of the global batch** (``batch_shares``): the step's global batch ``[step·B, (step+1)·B)``
   is cut into micro-batches of ``M`` sequences, and participant ``r`` of ``n`` takes a contiguous run of
   them. With a group away, the survivors take its micro-batches by accumulation: the batch never shrinks.
3. **Gradients weighted by samples**: each micro-batch's loss is a token *sum* over the global batch's
   token count, so the groups' gradients *sum* (not average) across groups to the fault-free per-token mean,
   whatever share each processed; one flat all-reduce carries every gradient and the loss.
4. **Commit vote** (``should_commit``): a step a failure interrupted (a peer lost mid all-reduce, a failed
   heal or quorum) is discarded and retried with the next quorum; it consumes nothing, because the data
   position is the committed step number (``step · B``), which is exactly what healing transfers.

Rank 0 of the group writes ``<run>/replicas/group-<id>/metrics.jsonl``: one record per committed step with
the whole assignment (``shares``: every participant's sample range) and what this group's loader read
(``read``); ``replicas.merge_records`` turns the groups' records into the run's ``metrics.jsonl``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import socket
import sys
import time
import urllib.parse
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from tasks import contract, storage
from tasks.lease import Fence
from tasks.llama import Transformer
from tasks.train import metrics as train_metrics
from tasks.train.checkpoint_writer import CheckpointManager, ModelOptimState
from tasks.train.config import TrainConfig
from tasks.train.cross_entropy import token_sum_cross_entropy
from tasks.train.data import TokenLoader
from tasks.train.faults import FaultInjector
from tasks.train.heal_transport import Frame, FramedHTTPTransport
from tasks.train.identity import config_fingerprint
from tasks.train.optim import Optimizers, clip_grad_norm_, lr_at
from tasks.train.parallel_dims import ParallelDims
from tasks.train.parallelize import check_model_fits, materialize, parallelize_model
from tasks.train.replica_records import group_dir, last_committed_step, mark_up, newest_record, restarted_and_up
from tasks.train.snapshot import Snapshotter, folder_instance, load_into

log = logging.getLogger(__name__)

REPLICA_ENV = "SMELT_REPLICA_ID"
RESTARTED_ENV = "SMELT_REPLICA_RESTARTED"  # "1": the supervisor restarted this group mid-run (it heals from a peer)
QUORUM_RETRY_S = 0.2  # between quorum attempts while the Lighthouse is away


def heal_host() -> str:
    """The address this rank serves its state on to a healing peer: ``SMELT_HEAL_HOST``, else loopback when the
    Lighthouse is on this host's loopback (one-host runs and tests), else this host's name."""
    if os.environ.get("SMELT_HEAL_HOST"):
        return os.environ["SMELT_HEAL_HOST"]
    lighthouse = urllib.parse.urlsplit(os.environ.get("TORCHFT_LIGHTHOUSE", "")).hostname or ""
    return "127.0.0.1" if lighthouse in ("127.0.0.1", "localhost", "::1") else socket.getfqdn()


def micro_batch(global_batch: int, micro: int, groups: int) -> int:
    """Sequences per micro-batch: ``data.micro_batch``, else the fault-free share of one group (no accumulation
    while every group is there)."""
    micro = micro or global_batch // groups
    if micro < 1 or global_batch % micro or (global_batch // micro) < groups:
        raise ValueError(f"data.global_batch ({global_batch}) must split into at least parallel.dp_replicate "
                         f"({groups}) micro-batches of data.micro_batch ({micro}) sequences; change one of them")
    return micro


def batch_shares(step: int, global_batch: int, micro: int, participants: int) -> list[tuple[int, int]]:
    """Sample range ``[start, end)`` of each participant (by participant rank) for optimizer step ``step``
    (1-based): step s trains the global batch ``[(s-1)·B, s·B)``, its ``B / micro`` micro-batches dealt out
    in contiguous runs as even as they can be. The ranges tile the global batch exactly once."""
    n_micro = global_batch // micro
    base = (step - 1) * global_batch
    shares = []
    for r in range(participants):
        first, last = r * n_micro // participants, (r + 1) * n_micro // participants
        shares.append((base + first * micro, base + last * micro))
    return shares


class GroupProgress:
    """The replica group's place in the run, for storage checkpoints: the committed step (the data position is
    ``step × global batch``, so no loader state is kept) and the tokens seen."""

    def __init__(self, tokens_per_step: int) -> None:
        self.tokens_per_step, self.step = tokens_per_step, 0

    def state_dict(self) -> dict:
        return {"step": self.step, "tokens": self.step * self.tokens_per_step}

    def load_state_dict(self, state: dict) -> None:
        self.step = int(state["step"])


class ReplicaGroup:
    """This rank of one replica group: the model (FSDP/TP inside the group), its loader and torchft's Manager."""

    def __init__(self, cfg: TrainConfig, datasets: dict[str, str], run_dir: str, replica_id: int) -> None:
        from torchft import Manager, ProcessGroupGloo

        if cfg.parallel.pp > 1:
            raise ValueError("[train.ft] replica groups do not run pipeline parallelism (parallel.pp = 1): "
                             "torchft's commit vote and healing cover one model per group rank")
        self.cfg, self.replica_id = cfg, replica_id
        self.run_dir = storage.normalize_url(run_dir)
        self.device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timedelta(seconds=cfg.watchdog.collective_timeout_s))
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(cfg.seed)

        # The group's own mesh: the replicate dim is torchft's, across jobs.
        self.dims = ParallelDims(pp=1, dp_replicate=1, dp_shard=cfg.parallel.dp_shard, tp=cfg.parallel.tp,
                                 world_size=self.world_size)
        self.dims.build_mesh(self.device.type)
        data = cfg.data
        self.groups = cfg.parallel.dp_replicate
        self.micro = micro_batch(data.global_batch, data.micro_batch, self.groups)
        # A loader whose "global batch" is one micro-batch: batch_at(start) is this rank's slice of the
        # micro-batch starting at any global sample index.
        self.loader = TokenLoader(datasets, dict(data.mixture) or None, split="train", seq_len=data.seq_len,
                                  global_batch=self.micro, dp_rank=self.dims.dp_rank, dp_size=self.dims.dp_size,
                                  seed=data.seed, prefetch=0)
        self.global_tokens = data.global_batch * data.seq_len

        self.model_cfg = cfg.model_for_data(self.loader.vocab_size)
        with torch.device("meta"):
            model = Transformer(self.model_cfg)
        check_model_fits(model, self.dims, data.seq_len, cfg.parallel.float8)
        parallelize_model(model, self.dims, cfg.parallel, self.device.type)
        materialize(model, self.device, cfg.seed)  # every group starts from the same weights
        model.train()
        self.model = model
        self.params = list(model.parameters())
        self.optimizers = Optimizers([model], cfg.optim, self.device.type)

        ft = cfg.ft
        self.manager = Manager(
            pg=ProcessGroupGloo(timeout=timedelta(seconds=ft.timeout_s)),
            load_state_dict=self._load_state_dict, state_dict=self._state_dict,
            min_replica_size=ft.min_replicas, use_async_quorum=False,  # heal before the forward pass
            replica_id=f"smelt_{replica_id}", timeout=timedelta(seconds=ft.timeout_s),
            quorum_timeout=timedelta(seconds=ft.quorum_timeout_s), connect_timeout=timedelta(seconds=ft.timeout_s),
            heartbeat_interval=timedelta(milliseconds=max(10, ft.heartbeat_timeout_ms // 5)),
            init_sync=False,  # materialize() gives every group the same weights
            quorum_retries=ft.quorum_retries,
            checkpoint_transport=FramedHTTPTransport(heal_host(), timedelta(seconds=ft.timeout_s)),  # no pickles
        )
        self.metrics = train_metrics.MetricsLogger(group_dir(self.run_dir, replica_id), enabled=self.rank == 0)
        self.discarded = 0
        # Storage checkpoints: the quorum's first participant saves (one writer per step, whichever groups are
        # there), for evals and exports, and for the case healing cannot cover: every group lost.
        self.datasets = datasets
        fingerprints = {name: contract.open_dataset(url, kind="tokens").fingerprint for name, url in datasets.items()}
        fence = Fence.from_env(self.run_dir)
        self.checkpointer = CheckpointManager(
            self.run_dir, cfg.checkpoint, rank=self.rank, world_size=self.world_size,
            config_fingerprint=config_fingerprint(self.model_cfg, data, fingerprints, seed=cfg.seed,
                                                  init_from=cfg.init_from), fence=fence)
        # In-memory snapshots on this node (snapshot.py), for when every group is lost but their nodes are not: the
        # newest is restored instead of the older storage checkpoint. No copy on another node: the other groups
        # hold the same state live, and a group whose node is lost heals from them.
        self.snapshots = None
        if cfg.snapshot.active(self.world_size * self.groups):
            folder = [folder_instance(self.run_dir) if self.rank == 0 else None]
            if self.world_size > 1:
                dist.broadcast_object_list(folder, src=0)
            self.snapshots = Snapshotter(
                group_dir(self.run_dir, replica_id), rank=self.rank, world_size=self.world_size,
                local_world_size=self.world_size, replicate=False, interval_steps=cfg.snapshot.interval_steps,
                keep=cfg.snapshot.keep, directory=cfg.snapshot.dir, fence=fence,
                identity={"fingerprint": self.checkpointer.config_fingerprint, "world_size": self.world_size,
                          "layout": self.dims.describe(), "folder": folder[0]})
        self._resume_mark: dict | None = None  # written with the first step committed after a resume
        self.progress = GroupProgress(self.global_tokens)
        self.app_state = {"model_optim": ModelOptimState([model], self.optimizers.optimizers), "train": self.progress}
        self.faults = FaultInjector.from_config(cfg.faults, self.run_dir, replica_id * self.world_size + self.rank)
        # A group the supervisor restarted mid-run heals from a live peer (``joining``); the groups of a launch all
        # resume from the newest storage checkpoint, if any, and step together (``starting``: ``_wait_for_peers``).
        run_step = self._run_step_on_rank0()
        self.joining = os.environ.get(RESTARTED_ENV) == "1" and run_step > 0
        self.starting = not self.joining
        self._launch_step, self._waiting_since = 0, None
        self.behind, self._since = False, time.time()
        if self.starting and run_step > 0:
            self._resume_from_storage("a new launch of the run")
        if self.rank == 0:
            mark_up(self.run_dir, replica_id)

    # -- what healing moves --------------------------------------------------------------------------

    def _state_dict(self) -> dict:
        """What a healing peer receives (heal_transport.py): the model, optimizer and progress, tensors and JSON."""
        return {key: value.state_dict() for key, value in self.app_state.items()}

    def _load_state_dict(self, frame: Frame) -> None:
        load_into(self.app_state, frame.header, frame.tensors, template=self._live_state)
        log.info("group %d healed from a peer at step %d", self.replica_id, self.manager.current_step())

    def _live_state(self) -> dict:
        """The state dicts a received frame or a snapshot is loaded into: pending gradients discarded first (they
        would keep a fresh optimizer without state: ModelOptimState.discard_gradients), optimizer state made."""
        if self.snapshots is not None:
            self.snapshots.wait_for_copy()  # a load overwrites the tensors a snapshot may still be copying
        model_optim = self.app_state["model_optim"]
        model_optim.discard_gradients()
        model_optim.init_optimizer_state()
        return {key: value.state_dict() for key, value in self.app_state.items()}

    # -- one step ------------------------------------------------------------------------------------------

    def _quorum(self) -> None:
        """The step's quorum; retried while the Lighthouse is away (restarted by the launcher), within
        ``ft.quorum_timeout_s``. A failed quorum leaves its exception in the Manager's future, which the
        next ``start_quorum`` would raise again: it is dropped here (torchft 0.2.0, manager.py)."""
        deadline = time.monotonic() + self.cfg.ft.quorum_timeout_s
        while True:
            try:
                self.manager.start_quorum()
                return
            except Exception as e:  # noqa: BLE001 - the Lighthouse or a peer's manager unreachable
                self.manager._quorum_future = None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no quorum within ft.quorum_timeout_s ({self.cfg.ft.quorum_timeout_s} s): "
                                       f"{e}") from e
                log.warning("group %d: quorum failed (%s); retrying", self.replica_id, str(e).splitlines()[0])
                time.sleep(QUORUM_RETRY_S)

    def _context(self) -> contextlib.AbstractContextManager:
        return loss_parallel() if self.dims.tp_enabled else contextlib.nullcontext()

    def step(self) -> dict | None:
        """Try the next optimizer step; its record if the group committed it, None if it was discarded."""
        start = time.perf_counter()
        self.faults.on_step_start(self.manager.current_step() + 1, self.checkpointer)
        self.faults.on_hold(self.manager.current_step() + 1, lambda g: restarted_and_up(self.run_dir, g))
        self._quorum()
        step = self.manager.current_step() + 1  # after healing: the peers' step
        if step > self.cfg.steps:  # healed from a peer that has finished the run
            return None
        participants, rank = self.manager.num_participants(), self.manager.participating_rank()
        ready = self._ready(participants, step)
        shares = batch_shares(step, self.cfg.data.global_batch, self.micro, participants)
        mine = shares[rank] if rank is not None and ready else (0, 0)

        lr = lr_at(step, self.cfg.optim, self.cfg.steps)
        self.optimizers.set_lr(lr)
        self.optimizers.zero_grad()
        # token sum × (ranks averaging it in FSDP) / the global batch's tokens: groups' gradients then *sum*
        scale = self.dims.dp_size / self.global_tokens
        loss_sum = torch.zeros((), dtype=torch.float64)
        with self._context():
            for first in range(mine[0], mine[1], self.micro):
                inputs, targets = self.loader.batch_at(first)
                loss = token_sum_cross_entropy(self.model(inputs), targets)
                (loss * scale).backward()
                local = loss.full_tensor() if isinstance(loss, DTensor) else loss
                loss_sum += local.detach().double()
        if self.dims.dp_size > 1:  # the group's token sum: each dp rank summed its own rows
            dist.all_reduce(loss_sum)
        loss, everyone_ready = self._allreduce(loss_sum, ready)
        if not everyone_ready:  # the whole quorum votes this step down, each group from the same sum
            self.manager.report_error(RuntimeError("a participant is waiting for its peers (joining or starting)"))
        grad_norm = clip_grad_norm_(self.params, self.cfg.optim.grad_clip)
        if not self.manager.should_commit():
            # Rebuild the replica process group at the next quorum. torchft 0.2.0 skips it when the quorum id
            # is unchanged, but keeps the id of a configure that failed, and a restarted Lighthouse counts ids
            # from 1 again: without this, groups disagree on whether to reconfigure and wait out ft.timeout_s
            # on each other at every step.
            self.manager._quorum_id = -1
            if not everyone_ready:
                return self._wait_for_peers()
            self.discarded += 1
            log.warning("group %d: step %d discarded (commit vote failed); retrying it", self.replica_id, step)
            return None
        if self.snapshots is not None:
            self.snapshots.wait_for_copy()  # the previous snapshot's copy reads the tensors the step changes
        self.optimizers.step()
        self.progress.step = step
        if self.snapshots is not None:
            self.snapshots.take(step, self.app_state)
        if rank == 0:  # the quorum's first participant writes the run's storage checkpoint
            self.faults.on_save_start(step)
            meta = {"tokens": step * self.global_tokens, "loss": loss, "layout": f"ft{participants}·"
                    + self.dims.describe(), "model": dataclasses.asdict(self.model_cfg),
                    "config": dataclasses.asdict(self.cfg), "data": self.datasets, "seq_len": self.cfg.data.seq_len}
            saved = self.checkpointer.maybe_save(step, self.app_state, meta, force=step == self.cfg.steps)
            self.faults.on_save_end(step, saved, self.checkpointer)
        elapsed = time.perf_counter() - start
        return {"step": step, "loss": loss, "grad_norm": grad_norm.item(), "lr": lr, "replica": self.replica_id,
                "participants": participants, "participant_rank": rank, "shares": [list(s) for s in shares],
                "read": list(mine), "samples": [shares[0][0], shares[-1][1]],
                "tokens": step * self.global_tokens, "step_time_s": elapsed, "time": time.time(),
                "discarded_before": self.discarded}

    def _allreduce(self, loss_sum: torch.Tensor, ready: bool) -> tuple[float, bool]:
        """Sum every gradient, the loss and a not-ready flag across the quorum's groups in one flat all-reduce;
        (the global batch's mean per-token loss, whether every participant was ready). The flag rides the same
        collective, so every group reaches the same verdict; a group that is not ready sends zero gradients. A
        failure leaves garbage here, which the commit vote then discards."""
        grads = []
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            g = p.grad
            grads.append(g._local_tensor if isinstance(g, DTensor) else g)
        # float32 whatever the gradients' dtype: half the bytes of float64, and the groups' sum is exact enough
        # (the fault tests hold the result to the fault-free run's within 1e-5)
        flags = torch.tensor([float(loss_sum), 0.0 if ready else 1.0], dtype=torch.float32)
        flat = torch.cat([g.reshape(-1).to(torch.float32) for g in grads] + [flags])
        self.manager.allreduce(flat, reduce_op=ReduceOp.SUM).wait()
        offset = 0
        for g in grads:
            g.copy_(flat[offset: offset + g.numel()].view_as(g))
            offset += g.numel()
        return float(flat[-2]) / self.global_tokens, float(flat[-1]) == 0.0

    def _run_step_on_rank0(self) -> int:
        """The run's newest committed step as rank 0 of the group read it, so the group's ranks act alike."""
        step = [last_committed_step(self.run_dir, self.cfg.parallel.dp_replicate) if self.rank == 0 else 0]
        if self.world_size > 1:
            dist.broadcast_object_list(step, src=0)
        return step[0]

    def _ready(self, participants: int, step: int) -> bool:
        """Whether this group trains this quorum's step. Not while

        - *joining* (restarted into a run that has committed steps): no peer ahead of this group is in the quorum
          (peers mid-step, or held) to heal from. A live peer joins within ``ft.timeout_s``; past that, every
          group was lost, and this one resumes from the newest storage checkpoint (``_wait_for_peers``);
        - *starting* (a launch, or after that resume): not every group is in the quorum yet. Without this, the
          first group up trains the first steps alone, and one lost before the others are up leaves them nobody
          to heal from. Past ``ft.quorum_timeout_s`` the run starts with the groups that are there; a group that
          healed from a peer meanwhile joined a running run.

        - *behind* (``_committed_elsewhere``): in a quorum without every group, a group that is not in it has
          committed this step since this group started. Training it here would commit the step a second time with
          other shares (a split step: a group left alone at the run's end, or by a Lighthouse that forgot it). It
          waits for a peer to heal from, or ends if the run is done (``train``).

        A group that is not ready still takes part in the step's all-reduce, so the whole quorum discards it."""
        if self.joining:
            if self.manager.current_step() == 0:
                return False
            self.joining = False  # healed
        if self.starting:
            waited = 0.0 if self._waiting_since is None else time.monotonic() - self._waiting_since
            if (participants < self.groups and waited <= self.cfg.ft.quorum_timeout_s
                    and self.manager.current_step() == self._launch_step):
                return False
            if participants < self.groups and self.manager.current_step() == self._launch_step:
                log.warning("group %d: starting without every replica group after %.0f s", self.replica_id, waited)
            self.starting = False
        self.behind = participants < self.groups and self._committed_elsewhere(step)
        if self.behind:
            return False
        self._waiting_since = None
        return True

    def _committed_elsewhere(self, step: int) -> bool:
        """Whether a group other than this one recorded ``step`` (or a later one) as committed since this group
        started or resumed (older records belong to a trajectory a resume replaced); read on rank 0."""
        found = [False]
        if self.rank == 0:
            for g in range(self.groups):
                record = None if g == self.replica_id else newest_record(self.run_dir, g)
                found[0] |= record is not None and record["step"] >= step and record["time"] > self._since
        if self.world_size > 1:
            dist.broadcast_object_list(found, src=0)
        return found[0]

    def _wait_for_peers(self) -> None:
        """After a step voted down because a participant was not ready (``_ready``): time the wait, fall back to
        storage when joining found no live peer within ``ft.timeout_s``, and let the peers' next quorum form."""
        if self._waiting_since is None:
            self._waiting_since = time.monotonic()
        if (self.joining or self.behind) and time.monotonic() - self._waiting_since > self.cfg.ft.timeout_s:
            done = last_committed_step(self.run_dir, self.groups)
            self._resume_from_storage(f"no live peer to heal from: every group was lost at step {done}")
        else:
            time.sleep(self.cfg.ft.join_timeout_ms / 4000)  # well inside the Lighthouse's wait for a healthy joiner
        return None

    def _resume_from_storage(self, why: str) -> None:
        """A launch, or no live peer: load the newest in-memory snapshot at least as new as the newest storage
        checkpoint, else that checkpoint (else start over from step 0) and step on from there. The steps committed
        after it are redone, and ``replicas.merge_records`` keeps only their new records: the group's first commit
        after this writes a ``resumed_from`` mark naming the step it really went on from (a group that resumed
        behind a peer heals to the peer's step first, and its mark must not disown the peer's steps)."""
        stored = self.checkpointer.latest_step()
        done = last_committed_step(self.run_dir, self.groups)
        restored = None
        if self.snapshots is not None:
            restored = self.snapshots.restore(self.app_state, not_before=stored, template=self._live_state)
        if restored is not None:
            self.checkpointer.mark_loaded(restored.step)
            source, step = "snapshot", restored.step
        elif stored is not None:
            if self.snapshots is not None:
                self.snapshots.wait_for_copy()  # the load overwrites what an in-flight snapshot is copying
            self.checkpointer.load(self.app_state, step=stored)  # it discards pending gradients itself
            source, step = "storage", stored
        else:
            source, step = "start", 0
        if step:
            self.manager.load_state_dict({"step": step, "batches_committed": step})
        log.warning("group %d (%s): resumed from %s", self.replica_id, why,
                    {"snapshot": f"the in-memory snapshot of step {step}",
                     "storage": f"the storage checkpoint of step {step}", "start": "the start"}[source])
        self._resume_mark = {"lost_at": done, "replica": self.replica_id, "source": source, "time": time.time()}
        self.joining, self.starting = False, True  # the groups resuming with it step together from here
        self.behind, self._since = False, time.time()
        self._launch_step, self._waiting_since = self.manager.current_step(), None

    def train(self) -> int:
        """Step until the run's last step is committed; returns the steps this group committed."""
        committed = 0
        while self.manager.current_step() < self.cfg.steps:
            if (self.joining or self.behind) and self._run_step_on_rank0() >= self.cfg.steps:
                log.info("group %d: the run finished while this group was away", self.replica_id)
                return 0
            record = self.step()
            if record is None:
                continue
            committed += 1
            if self._resume_mark is not None:
                self.metrics.log({**self._resume_mark, "resumed_from": record["step"] - 1})
                self._resume_mark = None
            self.metrics.log(record)
            if self.rank == 0:
                log.info("group %d step %d/%d loss %.5f participants %d read %s", self.replica_id, record["step"],
                         self.cfg.steps, record["loss"], record["participants"], record["read"])
        return committed

    def close(self) -> None:
        if self.snapshots is not None:
            self.snapshots.close()
        self.checkpointer.close()
        self.metrics.close()
        self.loader.close()
        self.manager.shutdown(wait=False)
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    from tasks.config import load
    from tasks.train.config import parse_data

    parser = argparse.ArgumentParser(prog="python -m tasks.train.replica_group", description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--data", action="append", required=True)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--replica-id", type=int, default=int(os.environ.get(REPLICA_ENV, 0)))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if int(os.environ.get("RANK", 0)) == 0 else logging.WARNING,
                        format=f"%(asctime)s [group{args.replica_id}] %(name)s %(levelname)s: %(message)s",
                        stream=sys.stderr)
    cfg = load(TrainConfig, args.config, [], section="train")
    group = ReplicaGroup(cfg, parse_data(args.data), args.run_dir, args.replica_id)
    try:
        committed = group.train()
    finally:
        group.close()
    print(json.dumps({"replica": args.replica_id, "committed": committed}), flush=True)
    return 0


if __name__ == "__main__":
    status = main()
    # Everything is written and closed. torchft's quorum thread is not a daemon and may still sit in a gloo connect
    # to a group that has left (its quorum timeout, seconds); the interpreter would wait for it at exit, and the
    # supervisor would see a group lingering behind the run's last step and kill it as hung.
    sys.stderr.flush()
    os._exit(status)
