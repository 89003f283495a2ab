"""Writing checkpoints: async torch.distributed.checkpoint saves, a commit protocol, retention, resume.

The layout, what *committed* and *good* mean, verification and every read (``load_state``) are
the shared core's (``tasks/checkpoint_reader.py``); this module writes: ``<run_dir>/checkpoints/
step-NNNNNNNN/`` gets DCP's files, then rank 0 commits its ``manifest.json`` once every rank's files
are on storage.

Saving (``CheckpointManager.maybe_save``): ``app_state`` values are Stateful objects. Their
state dicts are taken on the calling thread, copied to host memory by a background stager, then
written by DCP on a thread or a separate process over a dedicated gloo group, so training blocks
only for the call itself and for ``wait_for_staging()`` before the next optimizer step (the
staging copy reads the live parameters: changing them before it finishes corrupts the save).
One save is in flight at a time: a save starts only after the previous one committed, because the
staging buffers are reused.

Resharding: DCP loads model and optimizer state into whatever mesh the current run built.
``RNGState`` is per rank; it is restored only when the world size matches the checkpoint's and is
otherwise reseeded deterministically from (seed, step, rank).

Nothing pickled: ``SavePlanner`` stores non-tensor values as the core's JSON (``encode_object``).

``on_written(step)``, if given, runs on the commit thread once this rank's files of a step are on
storage and before the manifest (fault injection's crash_in_save exits there: tasks/train/faults.py).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import io
import json
import logging
import random
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
# The fsspec storage classes are not re-exported by torch.distributed.checkpoint (torch 2.13).
from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.planner import WriteItemType
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    _init_optim_state,  # what DCP's own optimizer load calls first; no public equivalent in torch 2.13
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType, AsyncSaveResponse
from torch.distributed.checkpoint.stateful import Stateful

from tasks import contract, eval_holds, storage
from tasks.checksums import file_checksum
from tasks.checkpoint_reader import (
    DCP_METADATA,
    KIND,
    checkpoint_problems,
    checkpoints_url,
    encode_object,
    is_committed,
    load_state,
    single_process_quietly,
    step_dirs,
    step_url,
)
from tasks.lease import Fence, Fenced
from tasks.objectstore import remote_options
from tasks.train.config import CheckpointConfig

log = logging.getLogger(__name__)



@contextlib.contextmanager
def _save_quietly() -> Iterator[None]:
    """Around DCP's save calls: rewriting a step (after a rollback) is intended and logged by _uncommit, and a
    single process is a supported setup (tasks/checkpoint_reader.py single_process_quietly)."""
    with single_process_quietly(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected an existing checkpoint in")
        yield


# --------------------------------------------------------------------------------------------
# DCP storage


def storage_writer(url: str) -> dcp.StorageWriter:
    """DCP's plain file writer for local paths (it fsyncs), its fsspec writer for any other URL."""
    url = storage.normalize_url(url)
    if url.startswith("file://"):
        return dcp.FileSystemWriter(storage.filesystem(url)[1], sync_files=True, overwrite=True)
    return FsspecWriter(url, sync_files=True, overwrite=True, **remote_options(url))


class SavePlanner(DefaultSavePlanner):
    """DCP's default save plan, with non-tensor values written as JSON instead of torch.save pickles."""

    def transform_object(self, write_item, object: Any):
        if write_item.type == WriteItemType.BYTE_IO:
            return io.BytesIO(encode_object(object, write_item.index.fqn))
        return object


# --------------------------------------------------------------------------------------------
# Stateful wrappers


class ModelOptimState(Stateful):
    """Model and optimizer state through DCP's state_dict helpers, so FSDP2/TP shards reshard on load.

    Accepts one model/optimizer or lists of them (pipeline stages on one rank); the optimizer state
    is flattened to parameter FQNs so stages merge and re-split under any layout. Saved keys:
    ``<app_state key>.model.<fqn>`` and ``<app_state key>.optim.<…>``.
    """

    _OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)

    def __init__(self, model, optimizer) -> None:
        self.models = list(model) if isinstance(model, (list, tuple)) else [model]
        self.optimizers = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
        if len(self.models) != len(self.optimizers):
            raise ValueError(f"ModelOptimState needs one optimizer per model part, got {len(self.models)} models "
                             f"and {len(self.optimizers)} optimizers")

    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = {}, {}
        for model, optimizer in zip(self.models, self.optimizers):
            model_sd.update(get_model_state_dict(model, options=self._OPTIONS))
            optim_sd.update(get_optimizer_state_dict(model, optimizer, options=self._OPTIONS))
        return {"model": model_sd, "optim": optim_sd}

    def init_optimizer_state(self) -> None:
        """Give a fresh optimizer its (zero) state, as DCP's own load does, so ``state_dict`` shows every
        entry a load will fill: an optimizer step with zero gradients at learning rate zero."""
        for optimizer in self.optimizers:
            _init_optim_state(optimizer)

    def discard_gradients(self) -> None:
        """Before a load: a fresh optimizer gets its state from torch's _init_optim_state, which does nothing
        while any gradient is set, and the load then breaks or drops the saved moments (a replica group that
        took part in discarded steps before resuming from storage met this). A load discards pending gradients."""
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        partial = StateDictOptions(flatten_optimizer_state_dict=True, strict=len(self.models) == 1)
        for model, optimizer in zip(self.models, self.optimizers):
            set_model_state_dict(model, state_dict["model"], options=partial)
            set_optimizer_state_dict(model, optimizer, state_dict["optim"], options=partial)


class RNGState(Stateful):
    """This rank's Python, NumPy, torch CPU and CUDA generator states, as tensors (nothing pickled).

    Keys carry the rank (``rank<r>.…``) because each rank's generators differ; DCP would otherwise
    keep one rank's copy. ``CheckpointManager.load`` restores them only when the world size matches
    and calls ``reseed(step)`` otherwise.
    """

    def __init__(self, rank: int, seed: int) -> None:
        self.rank = rank
        self.seed = seed

    def state_dict(self) -> dict[str, Any]:
        version, mt, gauss = random.getstate()
        _, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
        state = {
            "python_mt": torch.tensor(mt, dtype=torch.int64),
            "python_gauss": torch.tensor([gauss is not None, gauss or 0.0, version], dtype=torch.float64),
            "numpy_mt": torch.from_numpy(np_keys.astype(np.int64)),
            "numpy_gauss": torch.tensor([np_pos, np_has_gauss, np_gauss], dtype=torch.float64),
            "torch_cpu": torch.get_rng_state(),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            state["torch_cuda"] = torch.cuda.get_rng_state()
        return {f"rank{self.rank}": state}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = state_dict[f"rank{self.rank}"]
        has_gauss, gauss, version = state["python_gauss"].tolist()
        random.setstate((int(version), tuple(state["python_mt"].tolist()), gauss if has_gauss else None))
        pos, np_has_gauss, np_gauss = state["numpy_gauss"].tolist()
        keys = state["numpy_mt"].numpy().astype(np.uint32)
        np.random.set_state(("MT19937", keys, int(pos), int(np_has_gauss), np_gauss))
        torch.set_rng_state(state["torch_cpu"])
        if "torch_cuda" in state:
            torch.cuda.set_rng_state(state["torch_cuda"])

    def reseed(self, step: int) -> None:
        """Seed every generator from (seed, step, rank): reproducible for a given resume, distinct per rank."""
        blob = f"{self.seed}:{step}:{self.rank}".encode()
        derived = int.from_bytes(hashlib.sha256(blob).digest()[:8], "little") >> 1
        random.seed(derived)
        np.random.seed(derived % 2**32)
        torch.manual_seed(derived)  # also seeds every CUDA device


# --------------------------------------------------------------------------------------------
# The manager


@dataclass
class _PendingSave:
    step: int
    staging: concurrent.futures.Future | None
    commit: concurrent.futures.Future


def _done_future(value: Any = None) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_result(value)
    return future


class CheckpointManager:
    """Saves, commits, prunes and loads one run's checkpoints. Every method is collective: call it on all ranks.

    ``meta`` passed to ``maybe_save`` is stored in the manifest (JSON only); the manager adds
    ``step``, ``world_size``, ``config_fingerprint`` and ``model_prefix`` (where the model's weights
    sit, for export). ``tokens``, ``loss``, ``layout`` and ``model`` (the ModelConfig as a dict,
    which export and eval need) are expected from the trainer; ``config`` (the run config) goes
    to the manifest's lineage. ``config_fingerprint`` must cover what may not change across a
    resume (model, data, tokenizer, global batch) and not the parallel layout. ``blocked_s`` sums
    the seconds training was blocked by checkpointing (metrics, goodput).
    """

    def __init__(self, run_dir_url: str, cfg: CheckpointConfig, *, rank: int, world_size: int,
                 config_fingerprint: str, process_group=None, fence: Fence | None = None,
                 on_written: Callable[[int], None] | None = None) -> None:
        distributed = dist.is_available() and dist.is_initialized()
        if distributed and (dist.get_rank(), dist.get_world_size()) != (rank, world_size):
            raise ValueError(f"CheckpointManager got rank {rank} of {world_size}, but torch.distributed says "
                             f"{dist.get_rank()} of {dist.get_world_size()}")
        if not distributed and world_size != 1:
            raise ValueError(f"world_size is {world_size} but torch.distributed is not initialized; "
                             "initialize the process group first")
        if cfg.async_mode == "process" and not distributed:
            raise ValueError("checkpoint.async_mode 'process' needs torch.distributed initialized (its writer "
                             "process joins a gloo group); run under torchrun or use 'thread'")
        self.run_dir_url = storage.normalize_url(run_dir_url)
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.config_fingerprint = config_fingerprint
        self.fence = fence or Fence(self.run_dir_url, None)  # the lease epoch every commit and deletion checks
        self.blocked_s = 0.0
        self.on_written = on_written or (lambda step: None)  # see the module docstring
        self._distributed = distributed
        # DCP runs its collectives on a background thread (or process): on the default group they
        # would interleave with training's, so checkpoint traffic gets its own gloo group.
        self._group = (process_group or dist.new_group(backend="gloo")) if distributed else None
        # Deciding a time-based save needs all ranks to agree while a write may use self._group.
        self._control_group = (dist.new_group(backend="gloo")
                               if distributed and world_size > 1 and cfg.interval_minutes > 0 else None)
        self._stager = None
        if cfg.async_mode != "off":
            self._stager = DefaultStager(StagingOptions(
                use_pinned_memory=torch.cuda.is_available(),
                use_shared_memory=cfg.async_mode == "process",  # the writer process maps it, no copy
                use_async_staging=True,
                use_non_blocking_copy=torch.cuda.is_available(),
            ))
        self._committer = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="smelt-ckpt-commit")
        self._pending: _PendingSave | None = None
        self._last_step: int | None = None
        self._verified_step: int | None = None
        self._last_time = time.monotonic()

    # ---- saving ----------------------------------------------------------------------------

    def maybe_save(self, step: int, app_state: dict, meta: dict, *, force: bool = False) -> bool:
        """Start a save of ``app_state`` at ``step`` if it is due; True if one started."""
        if not self._due(step, force):
            return False
        started = time.monotonic()
        try:
            meta_json = json.loads(json.dumps(meta))
        except (TypeError, ValueError) as e:
            raise ValueError(f"checkpoint meta must be JSON-able (plain numbers, strings, lists, dicts): {e}") from e
        if self._pending is not None and not self._pending.commit.done():
            log.warning("checkpoint step %d waits for step %d to finish writing; raise checkpoint.interval_steps",
                        step, self._pending.step)
        self._finish_pending()
        self._verified_step = None
        write_started = time.monotonic()
        url = step_url(self.run_dir_url, step)
        if self.rank == 0:
            self._uncommit(url)
        meta_json.update(step=step, world_size=self.world_size, config_fingerprint=self.config_fingerprint,
                         model_prefix=meta_json.get("model_prefix") or _model_prefix(app_state))
        meta_json = self.fence.stamp(meta_json)
        writer = storage_writer(url)
        staging: concurrent.futures.Future | None = None
        if self.cfg.async_mode == "off":
            try:
                with _save_quietly():
                    metadata = dcp.save(app_state, storage_writer=writer, planner=SavePlanner(),
                                        process_group=self._group, no_dist=not self._distributed)
            except CheckpointException as e:  # a non-JSON value: say which, not DCP's per-rank traceback
                raise next((exc for exc, _ in e.failures.values() if isinstance(exc, TypeError)), e) from None
            self._commit(step, url, _done_future(metadata), write_started, meta_json)
            commit = _done_future()
        else:
            with _save_quietly():
                response = dcp.async_save(
                    app_state, storage_writer=writer, planner=SavePlanner(), process_group=self._group,
                    async_checkpointer_type=(AsyncCheckpointerType.PROCESS if self.cfg.async_mode == "process"
                                             else AsyncCheckpointerType.THREAD),
                    async_stager=self._stager, no_dist=not self._distributed,
                )
            if isinstance(response, AsyncSaveResponse):
                staging, upload = response.staging_completion, response.upload_completion
            else:
                upload = response
            commit = self._committer.submit(self._commit, step, url, upload, write_started, meta_json)
        self._pending = _PendingSave(step, staging, commit)
        self._last_step, self._last_time = step, time.monotonic()
        blocked = time.monotonic() - started
        self.blocked_s += blocked
        log.info("checkpoint step %d started (%s), blocked %.3fs", step, self.cfg.async_mode, blocked)
        return True

    def wait_for_staging(self) -> None:
        """Block until the in-flight save has copied the state; call before the next optimizer step."""
        pending = self._pending
        if pending is None or pending.staging is None or pending.staging.done():
            return
        started = time.monotonic()
        pending.staging.result()
        self.blocked_s += time.monotonic() - started

    def wait_for_commit(self) -> None:
        """Block until the in-flight save has committed (or raise why it did not)."""
        started = time.monotonic()
        try:
            self._finish_pending()
        finally:
            self.blocked_s += time.monotonic() - started

    def close(self) -> None:
        """Wait for the in-flight save to commit and release the stager and the commit thread."""
        try:
            self.wait_for_commit()
        finally:
            if self._stager is not None:
                self._stager.close()
                self._stager = None
            self._committer.shutdown(wait=True)

    def abandon(self) -> None:
        """Stop without waiting for the in-flight save: a peer failed, so its commit can only fail (the
        step stays uncommitted, and a later save of it rewrites it)."""
        self._pending = None
        self._committer.shutdown(wait=False, cancel_futures=True)
        if self.cfg.async_mode == "process":
            # DCP keeps one writer process per rank process, joined to the job's ranks at its first save: its
            # group has the failed peer in it, so the next save (in the rebuilt trainer) needs a new one.
            from torch.distributed.checkpoint import _async_process_executor as executor

            writer, executor._CHECKPOINT_PROCESS = executor._CHECKPOINT_PROCESS, None
            if writer is not None and writer._save_process.is_alive():
                writer._save_process.kill()
                writer._save_process.join(timeout=5)

    def _due(self, step: int, force: bool) -> bool:
        if step == self._last_step:
            return False
        if force:
            return True
        if step > 0 and self.cfg.interval_steps > 0 and step % self.cfg.interval_steps == 0:
            return True
        if self.cfg.interval_minutes > 0:
            elapsed = time.monotonic() - self._last_time >= self.cfg.interval_minutes * 60
            if self._control_group is None:
                return elapsed
            flag = torch.tensor([int(elapsed)])
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._control_group)  # clocks differ per rank
            return bool(flag.item())
        return False

    def _finish_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            if pending.staging is not None:
                pending.staging.result()
            pending.commit.result()

    def _uncommit(self, url: str) -> None:
        """Drop a stale manifest of a step about to be rewritten (a rollback or a restarted run)."""
        fs, path = storage.filesystem(storage.join(url, contract.MANIFEST))
        if fs.exists(path):
            self.fence.check()
            log.warning("checkpoint %s exists and is rewritten", url)
            fs.rm(path)

    def _commit(self, step: int, url: str, upload: concurrent.futures.Future, started: float,
                meta: dict[str, Any]) -> None:
        """Runs after this rank's writes: hash own files, gather to rank 0, which writes the manifest last."""
        metadata = upload.result()
        write_s = time.monotonic() - started
        self.on_written(step)
        hash_started = time.monotonic()
        shards = self._hash_own_files(url, metadata)
        if self._distributed and self.world_size > 1:
            gathered: list = [None] * self.world_size
            dist.all_gather_object(gathered, shards, group=self._group)
            shards = [s for rank_shards in gathered for s in rank_shards]
        error = None
        if self.rank == 0:
            try:
                stats = {"checkpoint.write_s": round(write_s, 4),
                         "checkpoint.hash_s": round(time.monotonic() - hash_started, 4),
                         "checkpoint.bytes": sum(s.bytes for s in shards)}
                self.fence.check()  # a writer whose lease epoch is over commits nothing (and deletes nothing)
                self._remove_strays(url, {s.name for s in shards})
                contract.commit(url, KIND, self.config_fingerprint, shards, stats, config=meta.pop("config", None),
                                meta=meta)
                log.info("checkpoint step %d committed at %s (%.1f MB, write %.2fs)", step, url,
                         stats["checkpoint.bytes"] / 1e6, write_s)
                self._apply_retention(step)
            except Fenced as e:
                error = ("fenced", str(e))
            except Exception as e:  # every rank must learn that the commit failed, not wait forever
                error = ("failed", f"{type(e).__name__}: {e}")
        if self._distributed and self.world_size > 1:
            box = [error]
            dist.broadcast_object_list(box, group=self._group, group_src=0)
            error = box[0]
        if error is not None and error[0] == "fenced":
            raise Fenced(f"checkpoint step {step} was not committed: {error[1]}", self.fence.epoch, None)
        if error is not None:
            raise RuntimeError(f"checkpoint step {step} at {url} did not commit: {error[1]}")

    def _hash_own_files(self, url: str, metadata) -> list[contract.ShardInfo]:
        """Size and checksum of the files this rank wrote (``__<rank>_*``, plus ``.metadata`` on rank 0)."""
        rows = Counter(info.relative_path for info in metadata.storage_data.values())
        prefix = f"__{dist.get_rank(self._group) if self._distributed else 0}_"  # DCP names files by group rank
        names = sorted(name for name in rows if name.startswith(prefix))
        if self.rank == 0:
            names.append(DCP_METADATA)
        out = []
        for name in names:
            fs, path = storage.filesystem(storage.join(url, name))
            out.append(contract.ShardInfo(name=name, rows=rows.get(name, 0), bytes=int(fs.size(path)),
                                          checksum=file_checksum(fs, path)))
        return out

    def _remove_strays(self, url: str, keep: set[str]) -> None:
        """Files of an older save of the same step (e.g. from more ranks) that this save did not write."""
        fs, path = storage.filesystem(url)
        for entry in fs.ls(path, detail=False):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if name not in keep and name != contract.MANIFEST:
                fs.rm(entry, recursive=True)

    def _apply_retention(self, newest: int) -> None:
        """Keep the last ``keep_last`` committed steps and every ``keep_every``-th; drop the rest.

        Runs right after ``newest`` committed, so nothing is deleted before a newer one exists.
        Uncommitted folders of older steps are crashed saves; any folder of a later step belongs to
        a trajectory this run abandoned (it restarted or rolled back to an earlier step). A declared
        branch (``--resume-from``, tasks/branches.py) is kept: its folders moved under ``branches/``
        before this trajectory's first save, and retention only lists ``checkpoints/``.
        """
        dirs = step_dirs(self.run_dir_url)
        committed = [s for s, url in dirs.items() if s <= newest and is_committed(url)]
        keep = set(committed[-self.cfg.keep_last:])
        if self.cfg.keep_every > 0:
            keep |= {s for s in committed if s % self.cfg.keep_every == 0}
        keep |= eval_holds.held_steps(self.run_dir_url) & set(committed)  # published, its eval not yet run
        for step, url in dirs.items():
            if step in keep:
                continue
            if step > newest:
                log.warning("deleting checkpoint %s: newer than step %d, from an abandoned trajectory", url, newest)
            fs, path = storage.filesystem(url)
            manifest = storage.join(path, contract.MANIFEST)
            if fs.exists(manifest):
                fs.rm(manifest)  # uncommit first: a half-deleted folder must never look committed
            fs.rm(path, recursive=True)
            log.info("retention: deleted checkpoint step %d", step)

    # ---- resuming --------------------------------------------------------------------------

    def latest_step(self) -> int | None:
        """Newest step whose manifest verifies; ranks share the hashing. Bad ones are logged and skipped."""
        self._finish_pending()
        newest_first = sorted(step_dirs(self.run_dir_url).items(), reverse=True) if self.rank == 0 else None
        candidates = self._broadcast(newest_first)  # one listing: stores may list differently per host
        for step, url in candidates:
            if self._good(url):
                self._verified_step = step
                return step
        return None

    def load(self, app_state: dict, step: int | None = None) -> dict:
        """Load ``step`` (default: latest good) into ``app_state``, resharding to the current mesh; returns its meta."""
        if step is None:
            step = self.latest_step()
            if step is None:
                raise contract.DatasetError(f"no committed checkpoint under {checkpoints_url(self.run_dir_url)}")
            url = step_url(self.run_dir_url, step)
        else:
            self._finish_pending()
            url = step_url(self.run_dir_url, step)
            if step != self._verified_step and not self._good(url):  # latest_step() just verified it
                raise contract.DatasetError(f"checkpoint {url} is missing or corrupt (see the log); load another step")
        manifest = contract.read_manifest(url)
        if manifest.fingerprint != self.config_fingerprint:
            raise ValueError(f"checkpoint {url} was written with config fingerprint {manifest.fingerprint}, this run "
                             f"has {self.config_fingerprint}: model, data, tokenizer or global batch changed "
                             f"(the saved run config is in its manifest); start a new run directory")
        same_world = manifest.meta.get("world_size") == self.world_size
        rng_keys = [k for k, v in app_state.items() if isinstance(v, RNGState)]
        to_load = {k: v for k, v in app_state.items() if same_world or k not in rng_keys}
        for state in to_load.values():
            if isinstance(state, ModelOptimState):
                state.discard_gradients()
        load_state(to_load, url, process_group=self._group, no_dist=not self._distributed)
        if not same_world:
            for key in rng_keys:
                app_state[key].reseed(step)
            if rng_keys:
                log.info("checkpoint %s saved by %s ranks, loaded by %d: RNG states reseeded, not restored",
                         url, manifest.meta.get("world_size"), self.world_size)
        self._last_step, self._last_time = step, time.monotonic()
        log.info("loaded checkpoint step %d from %s", step, url)
        return manifest.meta

    def is_good(self, step: int) -> bool:
        """Whether ``step`` is a committed, intact checkpoint of this run; ranks share the hashing."""
        self._finish_pending()
        good = self._good(step_url(self.run_dir_url, step))
        if good:
            self._verified_step = step
        return good

    def mark_loaded(self, step: int) -> None:
        """The run's state is ``step`` (restored from elsewhere, e.g. a snapshot): the interval counts from it."""
        self._last_step, self._last_time = step, time.monotonic()

    def _good(self, url: str) -> bool:
        problems = checkpoint_problems(url, self.rank, self.world_size)
        if self._distributed and self.world_size > 1:
            gathered: list = [None] * self.world_size
            dist.all_gather_object(gathered, problems, group=self._group)
            problems = [p for rank_problems in gathered for p in rank_problems]
        problems = sorted(set(problems))  # every rank reports an unreadable manifest
        if problems and self.rank == 0:
            log.warning("checkpoint %s skipped: %s", url, "; ".join(problems))
        return not problems

    def _broadcast(self, value: Any) -> Any:
        if not (self._distributed and self.world_size > 1):
            return value
        box = [value]
        dist.broadcast_object_list(box, group=self._group, group_src=0)
        return box[0]


def _model_prefix(app_state: Mapping[str, Any]) -> str | None:
    """Where the model's weights sit among the saved keys, so export needs no knowledge of the trainer.

    A single ``ModelOptimState`` entry ``k`` puts them under ``k.model.``; otherwise an entry named
    ``model`` holding only the model's state dict puts them under ``model.``.
    """
    keys = [k for k, v in app_state.items() if isinstance(v, ModelOptimState)]
    if len(keys) == 1:
        return f"{keys[0]}.model."
    return "model." if "model" in app_state else None
