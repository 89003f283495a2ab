"""In-memory snapshots of every step: a node-local copy, a replica on another node, restore from the closest.

Why: a storage checkpoint every few minutes makes each failure redo half an interval of work and
read the whole model back from storage. A snapshot of each rank's state after every optimizer step
(``snapshot.interval_steps``) in host memory on two nodes makes a failure cost at most one step and
no storage read (docs/design.md §4, issue 40). Storage checkpoints keep their long interval for disasters
(a node and its replica peer lost together), resharding and evals.

The store is a folder in node-local memory (``/dev/shm/smelt-snapshots`` by default; ``snapshot.dir``
or ``SMELT_SNAPSHOT_DIR`` moves it, so tests give each simulated node its own). It outlives the rank
processes; it does not outlive the node. Layout: ``<store>/<run key>/step-NNNNNNNN/rank-RRRRR.snap``,
the run key hashing the run folder's URL. A file holds one rank's state at one step:

    MAGIC | payload (every tensor's bytes, in header order) | header JSON | header length (8 bytes) | MAGIC

The header names the run (config fingerprint), the world size and layout, the owner rank, the step,
each tensor (key, dtype, shape, offset; whether it is a DTensor's local shard) and every non-tensor
value as JSON (loader position, counters, optimizer hyper-parameters), and the payload's xxh3-128
checksum. Nothing is pickled.

One snapshot, off the critical path (``Snapshotter.take`` → a background thread):
1. *copy*: the state dicts are taken on the calling thread (views, no copy); the thread writes every
   tensor into the node store (a memory copy into tmpfs) while hashing it. The trainer calls
   ``wait_for_copy()`` before the next optimizer step, which is the first thing that changes them.
2. *replicate*: each rank sends its file to the rank with the same local rank on the next node and
   receives the previous node's, over a gloo group of its own; the receiver verifies the checksum,
   writes the replica and acknowledges. A rank on a one-node job has no peer: its node is then a
   single point of failure, and storage covers it (logged once).
3. *retention*: once acknowledged, each rank keeps the newest ``keep`` steps of the files it wrote
   (its own and the replica it holds), so an acknowledged, fully replicated step always exists.
The next snapshot waits for the previous one to finish (``blocked_s`` counts any wait).

Restore (``Snapshotter.restore``, collective, at start): every rank lists the snapshots its node
store holds for this run, world size and layout; the ranks pick the newest step for which every
rank's state exists somewhere, each rank reading its own node's copy when there is one and
receiving a peer node's otherwise. Each rank verifies what it got; a copy that fails (corrupt,
truncated) is refused and the next holder (or the next older step) is tried. The restore, with
where each rank's state came from and what was refused, goes to ``events.jsonl``. A different world
size or layout never restores from snapshots: storage reshards.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import os
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch
import torch.distributed as dist
import xxhash
from torch.distributed.tensor import DTensor

from tasks import storage
from tasks.lease import EPOCH_KEY, Fence

log = logging.getLogger(__name__)

MAGIC = b"SMELTSN1"
_TRAILER = struct.Struct("<Q8s")  # header length, magic
DEFAULT_DIR = "/dev/shm/smelt-snapshots"
DIR_ENV = "SMELT_SNAPSHOT_DIR"
FOLDER_INSTANCE = "folder_instance"  # in the run folder: folder_instance()
_SEP = "/"  # joins state-dict keys, which may contain dots


class SnapshotError(RuntimeError):
    """A snapshot file that cannot be used (truncated, corrupt, or of another run); the message says which."""


# --------------------------------------------------------------------------------------------
# The file format


def flatten(state: dict[str, Any], prefix: str = "") -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Nested state dicts → (tensors by path, JSON values by path); paths join keys with ``/``."""
    tensors: dict[str, torch.Tensor] = {}
    objects: dict[str, Any] = {}
    for key, value in state.items():
        if not isinstance(key, str) or _SEP in key:
            raise SnapshotError(f"state key {key!r} under {prefix!r} must be a string without {_SEP!r}")
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            sub_t, sub_o = flatten(value, path + _SEP)
            tensors.update(sub_t)
            objects.update(sub_o)
            if not value:
                objects[path] = {}
        elif isinstance(value, torch.Tensor):
            tensors[path] = value
        else:
            objects[path] = value
    return tensors, objects


def unflatten(values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, value in values.items():
        *parents, leaf = path.split(_SEP)
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        if isinstance(value, dict) and not value:
            node.setdefault(leaf, {})
        else:
            node[leaf] = value
    return out


def _local(t: torch.Tensor) -> torch.Tensor:
    return (t.to_local() if isinstance(t, DTensor) else t).detach()


def _as_bytes(t: torch.Tensor) -> np.ndarray:
    """A tensor's bytes without a copy when it is contiguous on the CPU."""
    t = t.contiguous().reshape(-1)
    return t.view(torch.uint8).numpy() if t.numel() else np.empty(0, np.uint8)


def write_frame(f: BinaryIO, header: dict, tensors: dict[str, torch.Tensor]) -> int:
    """Write one frame to ``f`` as it is read (a file, or a socket healing a replica group: heal_transport.py),
    hashing the payload on the way; returns the bytes written."""
    entries, offset = [], len(MAGIC)
    hasher = xxhash.xxh3_128()
    f.write(MAGIC)
    for key, tensor in tensors.items():
        local = _local(tensor)
        host = local if local.device.type == "cpu" else local.to("cpu")
        buf = _as_bytes(host)
        hasher.update(buf)
        f.write(buf)
        entries.append({"key": key, "dtype": str(local.dtype).removeprefix("torch."), "shape": list(local.shape),
                        "offset": offset, "nbytes": int(buf.nbytes), "dtensor": isinstance(tensor, DTensor)})
        offset += buf.nbytes
    blob = json.dumps({**header, "tensors": entries, "checksum": f"xxh3_128:{hasher.hexdigest()}"},
                      sort_keys=True).encode()
    f.write(blob)
    f.write(_TRAILER.pack(len(blob), MAGIC))
    return offset + len(blob) + _TRAILER.size


def write_file(path: Path, header: dict, tensors: dict[str, torch.Tensor]) -> int:
    """Write a snapshot file (under a temporary name, then renamed); returns its size in bytes."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open_in_shared_folder(tmp) as f:
        size = write_frame(f, header, tensors)
    os.replace(tmp, path)
    return size


def open_in_shared_folder(path: Path, attempts: int = 5) -> BinaryIO:
    """``open(path, "wb")``, making its folder first. The ranks of a node share the step folders and each
    removes one once it has emptied it of its own files, so another rank may remove the folder between
    our ``mkdir`` and ``open``: at a run's end the faster rank discards its files while the slower one still
    writes its last snapshot. Once our file is in it, the folder is not empty and stays."""
    for _ in range(attempts - 1):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return open(path, "wb")
        except FileNotFoundError:
            pass  # removed again in between: make it again
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "wb")


def parse_header(blob: memoryview | bytes) -> dict:
    """The header of a snapshot held in memory; SnapshotError if the frame is broken."""
    if len(blob) < len(MAGIC) + _TRAILER.size or bytes(blob[:len(MAGIC)]) != MAGIC:
        raise SnapshotError("not a snapshot (bad magic or too short)")
    length, magic = _TRAILER.unpack(bytes(blob[-_TRAILER.size:]))
    start = len(blob) - _TRAILER.size - length
    if magic != MAGIC or start < len(MAGIC):
        raise SnapshotError("truncated snapshot (bad trailer)")
    try:
        header = json.loads(bytes(blob[start:len(blob) - _TRAILER.size]))
    except ValueError:
        raise SnapshotError("corrupt snapshot header") from None
    header["_payload_end"] = start
    return header


def read_header(path: Path) -> dict:
    """A snapshot file's header, read from its end (no payload read, no checksum)."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size < len(MAGIC) + _TRAILER.size:
            raise SnapshotError(f"{path}: too short to be a snapshot")
        f.seek(size - _TRAILER.size)
        length, magic = _TRAILER.unpack(f.read(_TRAILER.size))
        if magic != MAGIC or length > size:
            raise SnapshotError(f"{path}: truncated snapshot (bad trailer)")
        f.seek(size - _TRAILER.size - length)
        try:
            return json.loads(f.read(length))
        except ValueError:
            raise SnapshotError(f"{path}: corrupt snapshot header") from None


def verify(blob: memoryview | bytes) -> dict:
    """Check a whole snapshot held in memory against its checksum; its header. SnapshotError if it fails."""
    header = parse_header(blob)
    end = header.pop("_payload_end")
    payload = memoryview(blob)[len(MAGIC):end]
    digest = f"xxh3_128:{xxhash.xxh3_128(payload).hexdigest()}"
    if digest != header["checksum"]:
        raise SnapshotError(f"checksum mismatch (stored {header['checksum']}, computed {digest})")
    return header


def decode(blob: memoryview | bytes) -> tuple[dict, dict[str, torch.Tensor]]:
    """Verify a whole snapshot held in memory; (header, tensors by key). SnapshotError if it fails."""
    header = verify(blob)
    array = np.frombuffer(blob, dtype=np.uint8)
    tensors = {}
    for e in header["tensors"]:
        raw = torch.from_numpy(array[e["offset"]:e["offset"] + e["nbytes"]].copy())
        tensors[e["key"]] = raw.view(getattr(torch, e["dtype"])).reshape(e["shape"])
    return header, tensors


def load_into(app_state: dict, header: dict, tensors: dict[str, torch.Tensor],
              template: Callable[[], dict] | None = None) -> None:
    """Load a decoded frame into ``app_state`` (its Stateful values by key): a shard entry becomes a DTensor
    with the mesh and placements of the live state's (``template()``, else each value's ``state_dict()``)."""
    live = template() if template is not None else {k: v.state_dict() for k, v in app_state.items()}
    live_tensors, _ = flatten(live)
    kinds = {e["key"]: e["dtensor"] for e in header["tensors"]}
    values: dict[str, Any] = dict(header["objects"])
    for key, tensor in tensors.items():
        like = live_tensors.get(key)
        if kinds[key]:
            if not isinstance(like, DTensor):
                raise SnapshotError(f"snapshot entry {key} is a shard but this run holds no DTensor there")
            values[key] = DTensor.from_local(tensor.to(like.device), like.device_mesh, like.placements,
                                             shape=like.shape, stride=like.stride(), run_check=False)
        else:
            values[key] = tensor.to(like.device) if isinstance(like, torch.Tensor) else tensor
    state = unflatten(values)
    for key, stateful in app_state.items():
        stateful.load_state_dict(state[key])


# --------------------------------------------------------------------------------------------
# The node-local store


def store_dir(configured: str) -> Path:
    """Where this node keeps snapshots: the config, else ``SMELT_SNAPSHOT_DIR``, else /dev/shm."""
    return Path(configured or os.environ.get(DIR_ENV) or DEFAULT_DIR)


@dataclass(frozen=True)
class Held:
    """One snapshot file a node store holds: whose state, which step, how big."""

    owner: int
    step: int
    nbytes: int


class SnapshotStore:
    """One run's snapshots in one node's store folder."""

    def __init__(self, root: Path, run_key: str) -> None:
        self.root = root / run_key
        self.node = f"{socket.gethostname()}:{os.path.realpath(root)}"  # ranks sharing a store share a node

    def path(self, owner: int, step: int) -> Path:
        return self.root / f"step-{step:08d}" / f"rank-{owner:05d}.snap"

    def steps(self) -> list[int]:
        try:
            entries = list(self.root.iterdir())
        except FileNotFoundError:  # none yet, or another rank of the node removed the emptied folder
            return []
        return sorted(int(p.name[5:]) for p in entries if p.name.startswith("step-") and p.is_dir())

    def held(self, accept: Callable[[dict], bool]) -> list[Held]:
        """Snapshots here whose header ``accept`` admits (the file's checksum is checked on use, not here)."""
        out = []
        for step in self.steps():
            for f in sorted((self.root / f"step-{step:08d}").glob("rank-*.snap")):
                try:
                    header, nbytes = read_header(f), f.stat().st_size
                except FileNotFoundError:
                    continue  # pruned by its owner since the listing: not a broken snapshot
                except (OSError, SnapshotError) as e:
                    log.warning("snapshot %s ignored: %s", f, e)
                    continue
                if header.get("step") == step and accept(header):
                    out.append(Held(int(header["owner"]), step, nbytes))
        return out

    def remove(self, owner: int, step: int) -> None:
        self.path(owner, step).unlink(missing_ok=True)
        try:
            self.path(owner, step).parent.rmdir()
        except OSError:
            pass  # another owner's file is still there

    def prune(self, owners: set[int], keep_steps: int) -> None:
        """Keep the newest ``keep_steps`` steps of ``owners``' files; drop older ones."""
        steps = [s for s in self.steps() if any(self.path(o, s).exists() for o in owners)]
        for step in (steps[:-keep_steps] if keep_steps else steps):
            for owner in owners:
                self.remove(owner, step)

    def drop_after(self, owners: set[int], step: int) -> None:
        """Forget ``owners``' snapshots newer than ``step`` (an abandoned trajectory)."""
        for s in self.steps():
            if s > step:
                for owner in owners:
                    self.remove(owner, s)


# --------------------------------------------------------------------------------------------
# The snapshotter


def folder_instance(run_dir_url: str) -> str:
    """A name for this run folder's life, made when it first trains (read it on one rank): a folder deleted and
    made again gets another, so snapshots its predecessor left in the nodes' memory are never restored into it."""
    url = storage.join(run_dir_url, FOLDER_INSTANCE)
    fs, path = storage.filesystem(url)
    if fs.exists(path):
        return fs.cat_file(path).decode().strip()
    instance = uuid.uuid4().hex
    with storage.atomic_write(url, "w") as f:
        f.write(instance)
    return instance


def run_key(run_dir_url: str) -> str:
    return hashlib.sha256(run_dir_url.encode()).hexdigest()[:16]


def replica_peer(rank: int, world_size: int, local_world_size: int) -> int | None:
    """The rank on the next node that keeps this rank's replica (None on one node)."""
    if local_world_size <= 0 or world_size <= local_world_size or world_size % local_world_size:
        return None
    return (rank + local_world_size) % world_size


@dataclass
class Restored:
    step: int
    sources: dict[int, str]  # rank → "local" (its node's store) or "peer:<rank>" (sent by another node)
    refused: list[dict]
    seconds: float


class Snapshotter:
    """Takes, replicates, prunes and restores one run's snapshots. Every method is collective."""

    def __init__(self, run_dir_url: str, *, rank: int, world_size: int, local_world_size: int, interval_steps: int,
                 keep: int, directory: str, identity: dict[str, Any], fence: Fence | None = None,
                 replicate: bool = True) -> None:
        if keep < 1:
            raise ValueError("snapshot.keep must be at least 1")
        self.rank, self.world_size = rank, world_size
        self.interval_steps = interval_steps
        self.keep = keep
        self.identity = dict(identity)  # config fingerprint, world size, layout: what a restore must match
        self.fence = fence or Fence(run_dir_url, None)  # snapshots carry their writer's lease epoch
        self.store = SnapshotStore(store_dir(directory), run_key(run_dir_url))
        # replicate=False: this node's copy only (a replica group's peers hold the same state: replica_group.py)
        self.peer = replica_peer(rank, world_size, local_world_size) if replicate else None
        self.source = None if self.peer is None else (rank - local_world_size) % world_size
        self.blocked_s = 0.0
        self.replicated_bytes = 0
        self.last_acked: int | None = None
        self.refused: list[dict] = []  # copies the last restore refused (corrupt, truncated, of another run)
        self._distributed = dist.is_available() and dist.is_initialized() and world_size > 1
        self._group = dist.new_group(backend="gloo") if self._distributed else None
        self._worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="smelt-snapshot")
        self._copied = threading.Event()
        self._copied.set()
        self._pending: concurrent.futures.Future | None = None
        self._inbox: torch.Tensor | None = None  # the peer's snapshot as received
        if replicate and self.peer is None and rank == 0 and world_size > 1:
            log.warning("snapshots: all %d ranks share one node, so snapshots have no replica on another node; "
                        "losing the node falls back to storage checkpoints", world_size)

    # ---- taking ----------------------------------------------------------------------------

    def due(self, step: int) -> bool:
        return self.interval_steps > 0 and step % self.interval_steps == 0

    def take(self, step: int, app_state: dict) -> bool:
        """Snapshot ``app_state`` after ``step`` if due; returns whether one started.

        Blocks only until the previous snapshot has finished (normally long done)."""
        if not self.due(step):
            return False
        started = time.monotonic()
        self._finish()
        tensors: dict[str, torch.Tensor] = {}
        objects: dict[str, Any] = {}
        for key, stateful in app_state.items():
            t, o = flatten(stateful.state_dict(), key + _SEP)
            tensors.update(t)
            objects.update(o)
        header = self.fence.stamp({**self.identity, "owner": self.rank, "step": step, "objects": objects,
                                   "time": time.time()})
        self._copied.clear()
        self._pending = self._worker.submit(self._take, step, header, tensors)
        self.blocked_s += time.monotonic() - started
        return True

    def wait_for_copy(self) -> None:
        """Block until the in-flight snapshot has copied the state; call before the next optimizer step."""
        if self._copied.is_set():
            return
        started = time.monotonic()
        while not self._copied.wait(0.05):
            if self._pending is not None and self._pending.done():
                self._pending.result()  # the copy failed: raise why
                break
        self.blocked_s += time.monotonic() - started

    def wait(self) -> None:
        """Block until the in-flight snapshot is replicated and acknowledged (or raise why not)."""
        started = time.monotonic()
        try:
            self._finish()
        finally:
            self.blocked_s += time.monotonic() - started

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._worker.shutdown(wait=True)

    def abandon(self) -> None:
        """Stop without waiting: a peer failed, so an in-flight replication can only fail."""
        self._copied.set()
        self._worker.shutdown(wait=False, cancel_futures=True)

    def _finish(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def _take(self, step: int, header: dict, tensors: dict[str, torch.Tensor]) -> None:
        """The background half: write our file, trade replicas with the neighbouring nodes, prune."""
        path = self.store.path(self.rank, step)
        try:
            write_file(path, header, tensors)
        finally:
            self._copied.set()
        if self.peer is not None:
            self._replicate(step, path)
            self.store.prune({self.rank, self.source}, self.keep)
        else:
            self.store.prune({self.rank}, self.keep)
        self.last_acked = step

    def _replicate(self, step: int, path: Path) -> None:
        """Send our file to ``peer``, receive ``source``'s, verify and keep it, acknowledge both ways."""
        mine = torch.from_numpy(np.memmap(path, dtype=np.uint8, mode="c"))  # the page cache itself, no copy
        size_out, size_in = torch.tensor([mine.numel(), step], dtype=torch.int64), torch.zeros(2, dtype=torch.int64)
        _exchange(self._group, [(self.peer, size_out)], [(self.source, size_in)])
        if int(size_in[1]) != step:
            raise SnapshotError(f"snapshot replication out of step: rank {self.source} sent step {int(size_in[1])}, "
                                f"rank {self.rank} is at step {step}")
        if self._inbox is None or self._inbox.numel() != int(size_in[0]):
            self._inbox = torch.empty(int(size_in[0]), dtype=torch.uint8)  # reused: the peer's size rarely changes
        theirs = self._inbox
        _exchange(self._group, [(self.peer, mine)], [(self.source, theirs)])
        sent = mine.numel()
        del mine  # unmap our file before retention may delete it
        ok = torch.ones(1, dtype=torch.int64)
        try:
            header = verify(theirs.numpy().data)
            if header.get("owner") != self.source or header.get("step") != step:
                raise SnapshotError(f"replica names rank {header.get('owner')} step {header.get('step')}")
            target = self.store.path(self.source, step)
            tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
            with open_in_shared_folder(tmp) as f:
                theirs.numpy().tofile(f)
            os.replace(tmp, target)
        except (SnapshotError, OSError) as e:
            log.error("snapshot replica of rank %d step %d refused: %s", self.source, step, e)
            ok.zero_()
        ack = torch.zeros(1, dtype=torch.int64)
        _exchange(self._group, [(self.source, ok)], [(self.peer, ack)])
        if not int(ack):
            raise SnapshotError(f"rank {self.peer} refused the replica of rank {self.rank}'s step-{step} snapshot")
        self.replicated_bytes += sent

    # ---- abandoning a trajectory -----------------------------------------------------------

    def drop_after(self, step: int) -> None:
        """Forget snapshots newer than ``step`` (a loss-guard rollback): each rank drops the files it wrote."""
        self.wait()
        owners = {self.rank} | ({self.source} if self.source is not None else set())
        self.store.drop_after(owners, step)

    def discard(self) -> None:
        """Delete the files this rank wrote (a finished run's storage checkpoint supersedes them)."""
        self.wait()
        owners = {self.rank} | ({self.source} if self.source is not None else set())
        self.store.prune(owners, 0)
        try:
            self.store.root.rmdir()
        except OSError:
            pass  # another rank's files are still there

    # ---- restoring -------------------------------------------------------------------------

    def _accept(self, header: dict) -> bool:
        """Of this run (identity), and not written by a stale trainer after the run was taken over."""
        return (all(header.get(k) == v for k, v in self.identity.items())
                and self.fence.counts(header.get(EPOCH_KEY), header["step"]))

    def restore(self, app_state: dict, *, not_before: int | None = None,
                template: Callable[[], dict] | None = None) -> Restored | None:
        """Load the newest step every rank can get (see the module docstring); None if there is none.

        ``not_before``: a newer storage checkpoint wins over older snapshots. ``template`` returns the
        live state dicts (by app_state key) whose DTensors give the mesh and placements to rebuild."""
        started = time.monotonic()
        held = self.store.held(self._accept)
        listing = {(h.owner, h.step): h.nbytes for h in held}
        everyone = self._all_gather((self.store.node, listing))
        nodes = [node for node, _ in everyone]
        steps = sorted({s for _, inv in everyone for (_, s) in inv}, reverse=True)
        refused: list[dict] = []
        bad: set[tuple[str, int, int]] = set()  # (node, owner, step): a node's store holds one copy
        for step in steps:
            if not_before is not None and step < not_before:
                break
            while True:
                plan = self._plan(step, everyone, nodes, bad)
                if plan is None:
                    break
                blob, error = self._fetch(step, plan, everyone, nodes)
                errors = self._all_gather(error)
                if not any(errors):
                    load_into(app_state, *blob, template=template)
                    sources = {r: ("local" if nodes[h] == nodes[r] else f"peer:{h}") for r, h in plan.items()}
                    self.refused = refused
                    return Restored(step, sources, refused, time.monotonic() - started)
                for owner, err in enumerate(errors):
                    if err:
                        holder = plan[owner]
                        bad.add((nodes[holder], owner, step))
                        refused.append({"owner": owner, "step": step, "holder": holder, "node": nodes[holder],
                                        "why": err})
                        if self.rank == 0:
                            log.warning("snapshot of rank %d step %d from rank %d refused: %s",
                                        owner, step, holder, err)
                        if holder == self.rank or nodes[holder] == self.store.node:
                            self.store.remove(owner, step)  # never offered again
        if refused and self.rank == 0:
            log.warning("no snapshot could be restored; refused: %s", refused)
        self.refused = refused
        return None

    def _plan(self, step: int, everyone: list, nodes: list[str], bad: set) -> dict[int, int] | None:
        """owner rank → the rank whose node store gives it: its own node's first, then any other."""
        plan = {}
        for owner in range(self.world_size):
            holders = [h for h, (node, inv) in enumerate(everyone)
                       if (owner, step) in inv and (node, owner, step) not in bad]
            if not holders:
                return None
            same_node = [h for h in holders if nodes[h] == nodes[owner]]
            plan[owner] = owner if owner in holders else (same_node or holders)[0]
        return plan

    def _fetch(self, step: int, plan: dict[int, int], everyone: list, nodes: list[str]) -> tuple[Any, str | None]:
        """This rank's snapshot bytes, read from its node's store or received from the holder's node."""
        sends, recvs = [], []
        for owner, holder in plan.items():
            if nodes[holder] == nodes[owner]:
                continue
            if holder == self.rank:
                sends.append((owner, torch.from_numpy(np.fromfile(self.store.path(owner, step), dtype=np.uint8))))
            if owner == self.rank:
                size = everyone[holder][1][(owner, step)]
                recvs.append((holder, torch.empty(size, dtype=torch.uint8)))
        if sends or recvs:
            _exchange(self._group, sends, recvs)
        try:
            if recvs:
                blob = recvs[0][1].numpy().data
            else:
                blob = memoryview(self.store.path(self.rank, step).read_bytes())
            header, tensors = decode(blob)
            if header.get("owner") != self.rank or header.get("step") != step or not self._accept(header):
                raise SnapshotError(f"the file holds rank {header.get('owner')} step {header.get('step')}")
            return (header, tensors), None
        except (SnapshotError, OSError) as e:
            return None, str(e)

    # ---- collectives -------------------------------------------------------------------------

    def _all_gather(self, value: Any) -> list[Any]:
        if not self._distributed:
            return [value]
        out: list = [None] * self.world_size
        dist.all_gather_object(out, value, group=self._group)
        return out


def _exchange(group, sends: list[tuple[int, torch.Tensor]], recvs: list[tuple[int, torch.Tensor]]) -> None:
    """Post every send and receive at once (gloo point-to-point), then wait for all of them."""
    works = [dist.isend(t, dst=peer, group=group) for peer, t in sends]
    works += [dist.irecv(t, src=peer, group=group) for peer, t in recvs]
    for w in works:
        w.wait()

