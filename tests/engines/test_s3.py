"""The pipeline on an S3 object store (a SeaweedFS gateway on 127.0.0.1): the whole run byte for byte
against local disk, training resumed from a checkpoint on S3, a killed upload, logs without append,
and misconfiguration reported in one sentence."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import fsspec
import pytest

from tasks import contract, jsonlog
from tasks.checkpoint_reader import list_branches, list_committed
from tasks.objectstore import StoreError, preflight
from tasks.sample.crawl import write_sample_crawl
from tasks.trace.ledger import ledger
from tasks.trace.run import open_run
from tasks.train.export import export_checkpoint
from tasks.train.goodput import read_jsonl
from tasks.train.node_launch import launch_training
from tests.engines.conftest import BUCKET
from tests.flows.tiny_run import TINY_RUN
from tests.tasks.train.token_corpus import make_corpus

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
PAGES = 150  # the smallest crawl that still feeds every stage
RUN = [*TINY_RUN, "train.steps=2", "train.checkpoint.interval_steps=2", "launch.nproc=1"]
TINY = {"model": {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 64},
        "data": {"seq_len": 16, "global_batch": 8}, "parallel": {"dp_shard": 2}}


def s3fs_():
    return fsspec.filesystem("s3")


def test_misconfigured_store_is_one_sentence_within_seconds(s3, monkeypatch):
    preflight(f"s3://{BUCKET}/anything")  # the good case passes
    cases = {
        "does not exist": ("s3://no-such-bucket/x", {}),
        "refused the credentials": (f"s3://{BUCKET}/x", {"AWS_SECRET_ACCESS_KEY": "wrong"}),
        "no credentials": (f"s3://{BUCKET}/x", {"AWS_SECRET_ACCESS_KEY": None, "AWS_ACCESS_KEY_ID": None,
                                                 "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent"}),
        "cannot connect": (f"s3://{BUCKET}/x", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}),
    }
    for expected, (url, env) in cases.items():
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.delenv(k, raising=False) if v is None else m.setenv(k, v)
            start = time.monotonic()
            with pytest.raises(StoreError, match=expected) as e:
                preflight(url)
            assert time.monotonic() - start < 10 and "\n" not in str(e.value)
    # Through the CLI: exit 2, one line on stderr, no traceback.
    env = {**os.environ, "AWS_SECRET_ACCESS_KEY": "wrong"}
    out = subprocess.run([sys.executable, "-m", "flows.cli", "ingest", "--input", f"s3://{BUCKET}/in.warc.gz",
                          "--root", f"s3://{BUCKET}/root"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "refused the credentials" in out.stderr and "Traceback" not in out.stderr


def test_logs_roll_into_whole_objects_and_read_back_in_order(s3):
    run = f"s3://{BUCKET}/logs"
    log = jsonlog.Segment(run, "metrics.jsonl", roll_records=3)
    for step in range(1, 8):
        log.write({"step": step})
        assert [r["step"] for r in jsonlog.read(run, "metrics.jsonl")] == list(range(1, step + 1))  # durable at once
    log.close()
    assert len(s3fs_().find(f"{BUCKET}/logs/metrics.jsonl.d")) == 3  # 3 + 3 + 1 records
    for i in range(3):
        jsonlog.append(run, "events.jsonl", {"event": "e", "i": i})
    assert [e["i"] for e in jsonlog.read(run, "events.jsonl")] == [0, 1, 2]
    assert not s3fs_().exists(f"{BUCKET}/logs/metrics.jsonl")  # nothing was appended to


def test_the_whole_run_on_s3_matches_the_run_on_local_disk(s3, tmp_path, prefect_harness):
    """Both runs read the same crawl objects from S3 (inputs are read as streams) and differ only in
    where they write: every dataset must come out byte-identical."""
    from flows.crawl_to_model import crawl_to_model

    write_sample_crawl(str(tmp_path / "crawl"), pages=PAGES, files=1, seed=0)
    s3fs_().put(sorted(glob.glob(f"{tmp_path}/crawl/*.warc.gz")), f"{BUCKET}/crawl/")
    inputs = [f"s3://{BUCKET}/crawl/*.warc.gz"]
    started = time.perf_counter()
    on_s3 = crawl_to_model(inputs=inputs, root=f"s3://{BUCKET}/run", overrides=RUN)
    s3_seconds = time.perf_counter() - started
    started = time.perf_counter()
    on_disk = crawl_to_model(inputs=inputs, root=str(tmp_path / "run"), overrides=RUN)
    disk_seconds = time.perf_counter() - started
    print(json.dumps({"run_s3_s": round(s3_seconds, 1), "run_local_s": round(disk_seconds, 1)}))

    stages = {s["stage"]: s for s in on_s3["stages"]}
    local_stages = {s["stage"]: s for s in on_disk["stages"]}
    assert stages.keys() == local_stages.keys() and {"ingest[web]", "dedup[web]", "tokenize[web]"} <= stages.keys()
    for name, stage in stages.items():
        if name in ("train", "eval"):
            continue
        a, b = contract.open_dataset(stage["url"]), contract.open_dataset(local_stages[name]["url"])
        assert a.meta["url"].startswith("s3://") and b.meta["url"].startswith("file://")
        assert [(s.name, s.rows, s.bytes, s.checksum) for s in a.shards] == \
               [(s.name, s.rows, s.bytes, s.checksum) for s in b.shards], name
        assert contract.verify(a) == []
    # Same data, same seed: the same losses, and the evaluation read its checkpoint from S3.
    assert stages["train"]["summary"]["losses"] == local_stages["train"]["summary"]["losses"]
    assert stages["train"]["checkpoint"].startswith(f"s3://{BUCKET}/run/")
    assert stages["eval"]["stats"]["perplexity"] == pytest.approx(local_stages["eval"]["stats"]["perplexity"])
    assert read_jsonl(stages["train"]["url"], "metrics.jsonl")  # metrics reached the store while training


def test_two_concurrent_runs_on_one_s3_root_compute_each_stage_once_and_train_once(s3, tmp_path, prefect_harness):
    """Leases on S3 (conditional puts on SeaweedFS): two runs started together on one root, as two users would."""
    from flows.crawl_to_model import crawl_to_model

    write_sample_crawl(str(tmp_path / "crawl"), pages=PAGES, files=1, seed=5)
    s3fs_().put(sorted(glob.glob(f"{tmp_path}/crawl/*.warc.gz")), f"{BUCKET}/crawl-concurrent/")
    inputs, root = [f"s3://{BUCKET}/crawl-concurrent/*.warc.gz"], f"s3://{BUCKET}/concurrent"
    results: list = [None, None]

    def run(i: int) -> None:
        try:
            results[i] = crawl_to_model(inputs=inputs, root=root, overrides=[*RUN, "launch.lease_wait_minutes=10"])
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    assert all(isinstance(r, dict) for r in results), results
    stages = [{s["stage"]: s for s in r["stages"]} for r in results]
    assert stages[0].keys() == stages[1].keys()
    for name in stages[0]:
        assert sorted(not s[name]["reused"] for s in stages) == [False, True], name  # computed once
        assert stages[0][name]["url"] == stages[1][name]["url"]
    run_dir = stages[0]["train"]["url"]
    assert [e["event"] for e in read_jsonl(run_dir, "events.jsonl")].count("launch") == 1
    assert [r["step"] for r in read_jsonl(run_dir, "metrics.jsonl")] == [1, 2]


def test_training_killed_after_a_committed_checkpoint_on_s3_resumes_from_it_and_exports(s3, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("SMELT_CACHE_DIR", str(tmp_path / "cache"))
    corpus = make_corpus(f"s3://{BUCKET}/corpus")
    run_dir = f"s3://{BUCKET}/train-kill"
    config = {**TINY, "steps": 6, "checkpoint": {"interval_steps": 4, "async_mode": "process"},
              "faults": {"inject": "kill:rank=1,step=5"}}
    result = launch_training(data={"main": corpus}, config=config, run_dir=run_dir, nproc=2, max_restarts=1,
                             timeout_s=300)
    summary = result["summary"]
    assert summary["steps"] == 6 and summary["resumed_from"] == 4 and summary["restarts"] == 1
    assert [c["step"] for c in list_committed(run_dir)][-1] == 6
    starts = [e for e in read_jsonl(run_dir, "events.jsonl") if e["event"] == "start"]
    assert [s["resumed_from"] for s in starts] == [None, 4]
    assert list((tmp_path / "cache").rglob("train-00000.bin"))  # the loader read a verified local copy
    exported = export_checkpoint(run_dir, f"s3://{BUCKET}/export")  # export reads the checkpoint from S3 too
    assert exported.meta["checkpoint"].endswith("step-00000006") and contract.verify(exported) == []

    # --resume-from on S3: step 6 moves to a superseded branch (copy committed before the source is uncommitted),
    # and the run trains steps 5 and 6 again from step 4's checkpoint, on one rank now.
    config = {**TINY, "steps": 6, "checkpoint": {"interval_steps": 2}}
    config["parallel"] = {"dp_shard": 1}
    resumed = launch_training(data={"main": corpus}, config=config, run_dir=run_dir, nproc=1, timeout_s=300,
                              resume_from=4)
    assert resumed["summary"]["resumed_from"] == 4 and resumed["summary"]["steps"] == 6
    (branch,) = list_branches(run_dir)
    assert (branch["branch"], branch["from_step"], branch["steps"], branch["complete"]) == (1, 4, [6], True)
    assert [(c["step"], c["world_size"]) for c in list_committed(run_dir)][-2:] == [(4, 2), (6, 1)]
    answer = ledger(open_run(run_dir))
    assert answer["exactly_once"] and answer["superseded_steps"] == [5, 6]


CHILD = """
import sys, time
from tasks import contract
url, gate = sys.argv[1], sys.argv[2]

def write(f):
    f.write(b"x" * (60 << 20))  # more than s3fs's 50 MiB block: a multipart upload starts
    f.flush()
    if gate:
        open(gate, "w").close()
        time.sleep(600)  # killed here, mid-shard
    f.write(b"y" * 1000)
    return 1

shard = contract.write_shard(url, "part-00000.bin", write)
contract.commit(url, "blob", "killed-upload", [shard], {"rows": 1})
"""


def test_an_upload_killed_mid_shard_leaves_no_shard_and_the_rerun_completes(s3, tmp_path):
    url = f"s3://{BUCKET}/killed"
    gate = tmp_path / "gate"
    child = subprocess.Popen([sys.executable, "-c", CHILD, url, str(gate)], cwd=REPO, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not gate.exists():
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        os.killpg(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    fs = s3fs_()
    assert fs.find(f"{BUCKET}/killed") == []  # no manifest, no shard, not even the temporary name
    uploads = fs.call_s3("list_multipart_uploads", Bucket=BUCKET, Prefix="killed/").get("Uploads", [])
    assert uploads, "the kill should have landed mid-upload"
    with pytest.raises(contract.DatasetError):
        contract.open_dataset(url)

    subprocess.run([sys.executable, "-c", CHILD, url, ""], cwd=REPO, check=True, timeout=120)
    manifest = contract.open_dataset(url)
    assert [s.name for s in manifest.shards] == ["part-00000.bin"] and manifest.shards[0].bytes == (60 << 20) + 1000
    assert contract.verify(manifest) == []
