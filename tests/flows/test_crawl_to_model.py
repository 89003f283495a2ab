"""The end-to-end flow on the generated sample: every stage's decisions against the sample's ground
truth, reuse of finished stages, and resume after the whole run is SIGKILLed during training."""

import json
import os
import subprocess
import sys
import time

import psutil
import pyarrow.parquet as pq
import pytest

from tasks import contract, storage
from tasks.checkpoint_reader import list_committed
from tasks.dedup.normalize import normalize_text
from tasks.sample.code import load_code_ground_truth
from tasks.sample.crawl import load_ground_truth
from tasks.train.procs import kill_tree
from tests.flows.tiny_run import TINY_RUN

pytestmark = pytest.mark.slow

# Small enough for 2 cores, large enough to cross a checkpoint before the kill.
OVERRIDES = [*TINY_RUN, "train.steps=16", "train.checkpoint.interval_steps=8", "train.log_every=4", "launch.nproc=2"]


def stage(summary: dict, name: str) -> dict:
    return next(s for s in summary["stages"] if s["stage"] == name)


def urls_of(dataset_url: str) -> dict[str, str]:
    """url (or repo/path for code) → text of every document in a documents dataset."""
    manifest = contract.open_dataset(dataset_url, kind="documents")
    out = {}
    for shard in manifest.shards:
        fs, path = storage.filesystem(contract.shard_url(manifest, shard))
        with fs.open(path, "rb") as f:
            table = pq.read_table(f, columns=["url", "text", "meta"])
        for url, text, meta in zip(*(table.column(c).to_pylist() for c in ("url", "text", "meta"))):
            if not url:
                meta = json.loads(meta)
                url = f"{meta['repo']}/{meta['path']}"
            out[url] = text
    return out


def shingles(text: str, n: int = 5) -> set:
    words = normalize_text(text).split()
    return {tuple(words[i:i + n]) for i in range(max(1, len(words) - n + 1))}


@pytest.fixture(scope="module")
def first_run(tmp_path_factory, prefect_harness):
    from flows.crawl_to_model import crawl_to_model

    root = str(tmp_path_factory.mktemp("smelt-root"))
    start = time.perf_counter()
    summary = crawl_to_model(root=root, overrides=OVERRIDES)
    return root, summary, time.perf_counter() - start


def test_run_reports_every_stage_and_a_model_that_learned(first_run):
    _, summary, _ = first_run
    names = [s["stage"] for s in summary["stages"]]
    assert names == ["ingest[web]", "dedup[web]", "ingest_code[code]", "dedup[code]", "tokenizer",
                     "tokenize[web]", "tokenize[code]", "train", "eval"]
    train = stage(summary, "train")["summary"]
    assert train["steps"] == 16 and train["last_loss"] < train["first_loss"]
    evaluation = stage(summary, "eval")["stats"]
    assert 1.0 < evaluation["perplexity"] < 4096 and evaluation["bits_per_byte"] > 0
    assert summary["mixture"] == {"web": 0.8, "code": 0.2}


def test_ingest_drops_non_english_low_quality_and_malformed_pages(first_run):
    root, summary, _ = first_run
    ingest = stage(summary, "ingest[web]")
    kept = urls_of(ingest["url"])
    truth = load_ground_truth(storage.join(root, "sample"))
    by_category: dict[str, list[dict]] = {}
    for row in truth:
        by_category.setdefault(row["category"], []).append(row)
    assert not any(r["url"] in kept for r in by_category["non_english"])
    assert not any(r["url"] in kept for r in by_category["low_quality"])
    prose_kept = sum(r["url"] in kept for r in by_category["prose_en"])
    assert prose_kept >= 0.97 * len(by_category["prose_en"])
    malformed = {r["note"] for r in by_category["malformed"]}
    stats = ingest["stats"]
    assert len(malformed) == 4
    assert stats["dropped.read_empty"] >= 3 and stats["dropped.read_non_html"] >= 3
    assert stats["dropped.read_truncated_payload"] >= 3
    assert stats["funnel.read.decoded_with_replacements"] >= 3  # undecodable bytes are counted, not silent
    assert stats["in"] == len(truth)


def test_dedup_removes_planted_exact_and_near_duplicates(first_run):
    root, summary, _ = first_run
    before = urls_of(stage(summary, "ingest[web]")["url"])
    after = urls_of(stage(summary, "dedup[web]")["url"])
    truth = load_ground_truth(storage.join(root, "sample"))
    exact = [r for r in truth if r["category"] == "exact_dup"]
    assert exact and all(not (r["url"] in after and r["dup_of"] in after) for r in exact)
    near_checked = 0
    for r in (r for r in truth if r["category"] == "near_dup" and r["url"] in before and r["dup_of"] in before):
        a, b = shingles(before[r["url"]]), shingles(before[r["dup_of"]])
        if len(a & b) / len(a | b) >= 0.8:
            near_checked += 1
            assert not (r["url"] in after and r["dup_of"] in after), r["url"]
    assert near_checked >= 5
    originals = {r["dup_of"] for r in exact}
    assert sum(u in after or any(r["url"] in after for r in exact if r["dup_of"] == u) for u in originals) == len(originals)


def test_code_branch_drops_generated_minified_and_vendored_files(first_run):
    root, summary, _ = first_run
    kept = urls_of(stage(summary, "ingest_code[code]")["url"])
    truth = load_code_ground_truth(storage.join(root, "sample", "code"))
    for category in ("generated", "minified", "vendored"):
        rows = [r for r in truth if r["category"] == category]
        assert rows and not any(f"{r['repo']}/{r['path']}" in kept for r in rows), category
    good = [r for r in truth if r["category"] == "good"]
    assert sum(f"{r['repo']}/{r['path']}" in kept for r in good) >= 0.97 * len(good)


def test_each_checkpoint_commit_is_published_as_an_artifact_version_and_an_event(first_run):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.events.filters import EventFilter, EventNameFilter, EventResourceFilter
    from prefect.events.schemas.events import ResourceSpecification

    from flows.common import artifact_key
    from flows.train import CHECKPOINT_EVENT

    _, summary, _ = first_run
    train = stage(summary, "train")
    committed = {c["url"] for c in list_committed(train["url"])}
    assert train["checkpoint"] in committed
    key = artifact_key(f"smelt-checkpoint-{train['fingerprint']}")
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
        assert all(any(url in str(a.data) for a in artifacts) for url in committed)
        deadline = time.monotonic() + 20  # the server persists events asynchronously
        while True:
            # Only this run's events: other tests in the session (S3, deployments) publish commits too.
            events = client.read_events(EventFilter(
                event=EventNameFilter(name=[CHECKPOINT_EVENT]),
                resource=EventResourceFilter(labels=ResourceSpecification({"smelt.run_dir": train["url"]})),
            ), limit=50).events
            urls = {e.payload["url"] for e in events if e.resource.get("smelt.run_dir") == train["url"]}
            if committed <= urls or time.monotonic() > deadline:
                break
            time.sleep(1)
    assert committed <= urls


def test_second_run_reuses_every_stage_in_seconds(first_run):
    from flows.crawl_to_model import crawl_to_model

    root, first, _ = first_run
    start = time.perf_counter()
    again = crawl_to_model(root=root, overrides=OVERRIDES)
    elapsed = time.perf_counter() - start
    assert all(s["reused"] for s in again["stages"]), [s["stage"] for s in again["stages"] if not s["reused"]]
    assert stage(again, "eval")["stats"] == stage(first, "eval")["stats"]
    assert elapsed < 30


def test_the_data_stages_the_flow_plans_are_the_stages_it_ran(first_run):
    """Whether to start Dask (data_stages_pending) and the run itself walk one graph (crawl_to_model.data_graph):
    a stage added to the run is planned too, so a pending stage never runs without its Dask cluster."""
    from flows.config import load_run_config
    from flows.crawl_to_model import planned_data_urls, sample_task
    from tasks.ingest.code.readers import expand_code_inputs
    from tasks.ingest.readers import expand_inputs

    root, summary, _ = first_run
    cfg = load_run_config(None, OVERRIDES)
    sample = sample_task.fn(root)  # the sample is there: this only names its files
    web, code = expand_inputs(sample["web"]), expand_code_inputs(sample["code"], cfg.ingest_code.reader)
    ran = [s["url"] for s in summary["stages"] if s["stage"] not in ("train", "eval")]
    assert len(ran) == 7 and sorted(planned_data_urls(web, code, root, cfg)) == sorted(ran)


def test_run_killed_during_training_resumes_from_its_last_checkpoint(first_run):
    """A longer run continues the finished one in its folder (its identity ignores the step budget,
    tasks/train/identity.py); killed past the finished step, the same command resumes it there."""
    from prefect.settings import PREFECT_API_URL

    from flows.crawl_to_model import crawl_to_model

    root, first, _ = first_run
    longer = OVERRIDES + ["train.steps=40", "train.checkpoint.interval_steps=8"]
    env = dict(os.environ, PREFECT_API_URL=PREFECT_API_URL.value())
    proc = subprocess.Popen([sys.executable, "-m", "flows.cli", "run", "--root", root,
                             *[a for o in longer for a in ("--set", o)]],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_dir, finished_at = stage(first, "train")["url"], stage(first, "train")["summary"]["steps"]
    deadline = time.monotonic() + 300
    progressed = False
    try:
        while not progressed and time.monotonic() < deadline and proc.poll() is None:
            progressed = any(c["step"] > finished_at for c in list_committed(run_dir, checksums=False))
            time.sleep(0.5)
        assert progressed, "the longer run never committed a checkpoint past the finished step"
        assert psutil.Process(proc.pid).children(recursive=True), "training processes should be running"
    finally:
        kill_tree(proc)
        proc.wait(timeout=30)
    killed_at = max(c["step"] for c in list_committed(run_dir))
    assert contract.read_manifest(run_dir) is None  # the run is no longer finished, and did not finish again

    resumed = crawl_to_model(root=root, overrides=longer)
    data_stages = [s for s in resumed["stages"] if s["stage"] not in ("train", "eval")]
    assert all(s["reused"] for s in data_stages)
    train = stage(resumed, "train")
    assert not train["reused"] and train["url"] == run_dir
    assert train["summary"]["resumed_from"] >= killed_at > finished_at
    assert train["summary"]["steps"] == 40
