"""In-memory snapshots (tasks/train/snapshot.py): the file format and store on their own, then torchrun jobs on
127.0.0.1 whose ranks, snapshot files and whole simulated nodes (agent, rank and store) are lost.

Every fault run must end with the undisturbed run's losses and final weights bit for bit, and lose at most
one step: the restore event names the step, where each rank's state came from and what was refused.
"""

from __future__ import annotations

import copy
import json
import shutil
import threading
from pathlib import Path

import psutil
import pytest
import torch

from tasks.checkpoint_reader import list_committed, load_consolidated
from tasks.storage import normalize_url
from tasks.train.goodput import read_jsonl
from tasks.train.node_launch import free_port, launch_training, prepare_run, start_torchrun
from tasks.train.snapshot import (
    SnapshotError,
    SnapshotStore,
    decode,
    flatten,
    read_header,
    replica_peer,
    run_key,
    unflatten,
    write_file,
)
from tests.tasks.train.processes import follow, kill_tree, listening, wait_for

# -- the format and the store ----------------------------------------------------------------------------


def _state() -> dict:
    return {
        "model": {"w": torch.arange(12, dtype=torch.float32).reshape(3, 4), "b": torch.ones(3, dtype=torch.bfloat16)},
        "optim": {"state": {"w.step": torch.tensor(7.0)}, "param_groups": {"lr": 3e-3, "betas": [0.9, 0.95]}},
        "train": {"step": 6, "tokens": 768, "loader": {"samples": 48, "epoch": 0}, "empty": {}},
        "rng": {"ids": torch.tensor([1, 2, 3], dtype=torch.int64)},
    }


def test_a_snapshot_file_round_trips_tensors_of_every_dtype_and_the_json_values(tmp_path):
    tensors, objects = flatten(_state())
    path = tmp_path / "s.snap"
    write_file(path, {"owner": 0, "step": 6, "objects": objects}, tensors)
    header, got = decode(path.read_bytes())
    assert header["owner"] == 0 and read_header(path)["checksum"] == header["checksum"]
    assert sorted(got) == sorted(tensors)
    for key, t in tensors.items():
        assert got[key].dtype == t.dtype and torch.equal(got[key], t), key
    assert unflatten({**header["objects"], **got})["train"] == _state()["train"]


def test_a_flipped_byte_or_a_cut_file_is_refused(tmp_path):
    tensors, objects = flatten(_state())
    path = tmp_path / "s.snap"
    write_file(path, {"owner": 0, "step": 6, "objects": objects}, tensors)
    blob = bytearray(path.read_bytes())
    flipped = bytearray(blob)
    flipped[20] ^= 0x01
    with pytest.raises(SnapshotError, match="checksum mismatch"):
        decode(bytes(flipped))
    with pytest.raises(SnapshotError, match="truncated|bad magic"):
        decode(bytes(blob[:-3]))


def test_each_rank_replicates_to_the_same_local_rank_on_the_next_node():
    assert [replica_peer(r, 8, 4) for r in range(8)] == [4, 5, 6, 7, 0, 1, 2, 3]
    assert [replica_peer(r, 2, 1) for r in range(2)] == [1, 0]
    assert replica_peer(0, 4, 4) is None  # one node: no other node to hold a replica


def test_the_store_keeps_the_newest_steps_of_the_owners_it_is_told_about(tmp_path):
    store = SnapshotStore(tmp_path, "run")
    for step in (1, 2, 3):
        for owner in (0, 1):
            write_file(store.path(owner, step), {"owner": owner, "step": step, "objects": {}}, {})
    store.prune({0}, 2)
    assert [(h.owner, h.step) for h in store.held(lambda h: True)] == [(1, 1), (0, 2), (1, 2), (0, 3), (1, 3)]
    store.drop_after({0, 1}, 2)
    assert store.steps() == [1, 2]


def test_a_rank_writes_its_snapshot_even_when_another_removes_the_emptied_step_folder_under_it(tmp_path, monkeypatch):
    """At a run's end the faster rank discards its files and removes the step folder it emptied, which the
    slower rank has just made for its own last snapshot."""
    store = SnapshotStore(tmp_path, "run")
    real_mkdir = Path.mkdir
    removed = []

    def mkdir_then_another_rank_removes_it(self, *args, **kwargs):
        real_mkdir(self, *args, **kwargs)
        if self.name == "step-00000012" and not removed:
            store.remove(0, 12)  # rank 0's discard: its own file is gone, so the folder is empty
            removed.append(self)

    monkeypatch.setattr(Path, "mkdir", mkdir_then_another_rank_removes_it)
    write_file(store.path(1, 12), {"owner": 1, "step": 12, "objects": {}}, {})
    assert removed and store.steps() == [12] and read_header(store.path(1, 12))["owner"] == 1
    store.remove(1, 12)
    store.root.rmdir()  # the last rank's discard removes the run's folder: a listing now finds nothing
    assert store.steps() == [] and store.held(lambda h: True) == []


# -- torchrun jobs ------------------------------------------------------------------------------------------

TINY = {
    "model": {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 64},
    "data": {"seq_len": 16, "global_batch": 8},
    "parallel": {"dp_shard": 2},
    "steps": 12,
    "checkpoint": {"interval_steps": 50},  # storage only at the end: every restore here comes from memory
}
RDZV_CONF = "last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3"


def config(faults: str = "") -> dict:
    cfg = copy.deepcopy(TINY)
    cfg["faults"] = {"inject": faults}
    return cfg


def losses(run_dir) -> dict[int, float]:
    """The loss of each step on the final trajectory (a redone step's last record wins)."""
    return {r["step"]: r["loss"] for r in read_jsonl(str(run_dir), "metrics.jsonl")}


def restores(run_dir) -> list[dict]:
    return [e for e in read_jsonl(str(run_dir), "events.jsonl") if e["event"] == "restore"]


def steps_lost(run_dir) -> int:
    """Steps finished before a failure and trained again after it (from metrics.jsonl)."""
    seen: set[int] = set()
    lost = 0
    for r in read_jsonl(str(run_dir), "metrics.jsonl"):
        lost += r["step"] in seen
        seen.add(r["step"])
    return lost


def assert_same_run(run_dir, reference_dir) -> None:
    assert losses(run_dir) == losses(reference_dir)
    got = load_consolidated(list_committed(str(run_dir))[-1]["url"])[0]
    want = load_consolidated(list_committed(str(reference_dir))[-1]["url"])[0]
    assert sorted(got) == sorted(want)
    assert not [k for k in want if not torch.equal(got[k], want[k])], "weights differ from the undisturbed run"


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("reference")
    launch_training(data={"main": corpus}, config=config(), run_dir=str(run_dir), nproc=2, timeout_s=300,
                    log=print)
    return run_dir


@pytest.mark.slow
def test_with_default_settings_a_rank_killed_mid_run_resumes_from_memory_losing_no_finished_step(corpus, reference, tmp_path, snapshot_store):
    lines: list[str] = []
    launch_training(data={"main": corpus}, config=config("kill:rank=1,step=7"), run_dir=str(tmp_path), nproc=2,
                    max_restarts=1, timeout_s=300, log=lines.append)  # default settings: smelt's agent
    [restore] = restores(tmp_path)
    assert (restore["source"], restore["step"], restore["refused"]) == ("snapshot", 6, []), restore
    assert restore["sources"] == {"0": "local", "1": "local"}
    assert steps_lost(tmp_path) <= 1
    assert_same_run(tmp_path, reference)
    left = Path(snapshot_store) / run_key(normalize_url(str(tmp_path)))
    assert not left.exists(), "a finished run leaves its snapshots behind"


@pytest.mark.slow
def test_a_corrupted_snapshot_is_refused_and_the_one_before_it_restored(corpus, reference, tmp_path):
    """Through torchrun's restart, the fallback: its restarted ranks restore from snapshots too."""
    launch_training(data={"main": corpus}, config=config("corrupt_snapshot:rank=1,step=7"), run_dir=str(tmp_path),
                    nproc=2, max_restarts=1, timeout_s=300, restart="torchrun", log=print)
    [restore] = restores(tmp_path)
    assert restore["source"] == "snapshot" and restore["step"] == 5, restore
    [refused] = restore["refused"]
    assert (refused["owner"], refused["step"]) == (1, 6) and "checksum mismatch" in refused["why"]
    assert steps_lost(tmp_path) == 1  # step 6 is trained again
    assert_same_run(tmp_path, reference)


@pytest.mark.slow
def test_a_lost_node_with_its_store_restores_every_rank_of_it_from_the_replica_on_the_other_node(
        corpus, reference, tmp_path, monkeypatch):
    """Two simulated nodes (a torchrun agent each, its own store). Node B's rank stops at the start of step 7
    (snapshot 6 replicated); B is then lost whole: agent, rank and store. The job is launched again, as a
    scheduler requeues it, on node A and a fresh node B2 with an empty store: it goes on from step 6, with
    B's state from A's memory."""
    run_dir = tmp_path / "run"
    args = prepare_run({"main": corpus}, config("stop:rank=1,step=7"), str(run_dir))
    stores = {name: tmp_path / f"store-{name}" for name in ("A", "B", "B2")}
    lines: dict[str, list[str]] = {name: [] for name in ("A", "B", "A2", "B2")}
    agents = {}

    def start(name: str, store: str, port: int) -> None:
        monkeypatch.setenv("SMELT_SNAPSHOT_DIR", str(stores[store]))
        agents[name] = start_torchrun(1, args, str(run_dir), 0, port, nnodes="2", rdzv_conf=RDZV_CONF)
        threading.Thread(target=follow, args=(agents[name], lines[name]), daemon=True).start()
        if name.startswith("A"):  # A hosts the rendezvous store: B must find it there
            wait_for(f"agent {name}'s rendezvous store", lambda: listening(port), 60, lines[name])

    try:
        port = free_port()
        start("A", "A", port)
        start("B", "B", port)
        fired = run_dir / "faults" / "fired-stop-1-7"
        wait_for("the stop of rank 1 at step 7", fired.exists, 180, lines["A"] + lines["B"])
        stopped = json.loads(fired.read_text())["pid"]
        b_tree = [p.pid for p in psutil.Process(agents["B"].pid).children(recursive=True)]
        assert stopped in b_tree, "rank 1 must run on node B (rank 0 beside the rendezvous store, on A)"
        kill_tree(agents["B"])
        shutil.rmtree(stores["B"])  # the node's memory is gone with it
        assert agents["A"].wait(timeout=120) != 0, "A's rank must fail when its peer node is lost"
        port = free_port()
        start("A2", "A", port)
        start("B2", "B2", port)
        for name in ("A2", "B2"):
            assert agents[name].wait(timeout=240) == 0, "\n".join(lines[name][-40:])
    finally:
        for agent in agents.values():
            kill_tree(agent)
    [restore] = restores(run_dir)
    assert restore["source"] == "snapshot" and restore["step"] == 6, restore
    peers = {rank: src for rank, src in restore["sources"].items() if src.startswith("peer:")}
    assert len(peers) == 1, f"the rank on the new node must get its state from node A's replica: {restore}"
    assert steps_lost(run_dir) == 0
    assert_same_run(run_dir, reference)
