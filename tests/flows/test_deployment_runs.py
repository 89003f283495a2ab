"""Deployment runs on a real `prefect server start` and process worker (what `smelt server start` gives a user):
`prefect deploy --all`, crawl-to-model with the default LocalCluster, a failed run retried the way the UI's
Retry button does it, and the eval deployment run once per committed checkpoint under the run's root.

One server and worker serve the whole module; every wait is bounded. The runs share one root holding a
smaller sample than the demo's (the flow finds it under <root>/sample and does not write its own), so the
data stages are computed once and quickly; training is tiny (one rank, 8 steps, a checkpoint every 4).
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psutil
import pytest

from flows import local_server
from tasks import eval_holds, storage
from tests.flows.tiny_run import TINY_RUN

pytestmark = pytest.mark.slow

TRAIN = [*TINY_RUN, "train.steps=8", "train.checkpoint.interval_steps=4", "train.checkpoint.keep_last=10",
         "train.log_every=4", "launch.nproc=1", "launch.task_retries=0", "launch.max_restarts=0"]
FAULT = "train.faults.inject=kill:rank=0,step=6"  # after the step-4 checkpoint committed
# The retried run is a run of its own: another init seed is another identity (a fault spec alone is not, and
# would continue the first run's finished folder: tasks/train/identity.py).
OTHER_RUN = "train.seed=1"
DATA_STAGES = {"ingest[web]", "dedup[web]", "ingest_code[code]", "dedup[code]", "tokenizer", "tokenize[web]",
               "tokenize[code]"}
RUN_TIMEOUT_S = 900


class Api:
    def __init__(self, url: str):
        self.url = url

    def call(self, method: str, path: str, body: dict | None = None):
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read()
        return json.loads(text) if text else None

    def state(self, run_id: str) -> str:
        return self.call("GET", f"/flow_runs/{run_id}")["state_type"]

    def wait(self, run_id: str, until: set[str], timeout_s: float = RUN_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.state(run_id)
            if state in until:
                return state
            if state in {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}:
                return state
            time.sleep(2)
        raise AssertionError(f"flow run {run_id} still {self.state(run_id)} after {timeout_s} s")

    def summary(self, run_id: str) -> list[dict]:
        """The newest smelt-run-summary table artifact of a flow run."""
        artifacts = self.call("POST", "/artifacts/filter", {
            "artifacts": {"flow_run_id": {"any_": [run_id]}, "key": {"any_": ["smelt-run-summary"]}},
            "sort": "CREATED_DESC", "limit": 1})
        data = artifacts[0]["data"]
        return json.loads(data) if isinstance(data, str) else data

    def runs_of(self, deployment: str) -> list[dict]:
        dep = self.call("GET", f"/deployments/name/{deployment}")
        return self.call("POST", "/flow_runs/filter", {"deployments": {"id": {"any_": [dep["id"]]}}})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    home = tmp_path_factory.mktemp("prefect-home")
    saved = {k: os.environ.get(k) for k in ("PREFECT_HOME", "PREFECT_API_URL")}
    os.environ["PREFECT_HOME"] = str(home)
    os.environ.pop("PREFECT_API_URL", None)
    state_dir = tmp_path_factory.mktemp("server-state")
    start = time.perf_counter()
    try:
        info = local_server.start(state_dir, timeout_s=240)
        print(f"\nserver + pool + deploy --all + worker: {time.perf_counter() - start:.1f} s")
        yield info, Api(info.api_url), {**os.environ, "PREFECT_API_URL": info.api_url}
    finally:
        local_server.stop(state_dir)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def deployment_run(env: dict, name: str, params: dict, *options: str) -> str:
    """`prefect deployment run` as a user types it; the new flow run's id."""
    out = subprocess.run([sys.executable, "-m", "prefect", "deployment", "run", name, "--params", json.dumps(params),
                          *options], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr + out.stdout
    return next(line.split()[-1] for line in out.stdout.splitlines() if "UUID" in line)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    from tasks.sample.code import write_sample_code
    from tasks.sample.crawl import write_sample_crawl

    url = storage.normalize_url(str(tmp_path_factory.mktemp("smelt-root")))
    write_sample_crawl(storage.join(url, "sample"), pages=400, files=2)
    write_sample_code(storage.join(url, "sample", "code"), files=150)
    return url


@pytest.fixture(scope="module")
def first_run(server, root):
    _, api, env = server
    start = time.perf_counter()
    run_id = deployment_run(env, "crawl-to-model/crawl-to-model", {"root": root, "overrides": TRAIN})
    state = api.wait(run_id, {"COMPLETED"})
    seconds = time.perf_counter() - start
    print(f"\ncrawl-to-model deployment run → {state}: {seconds:.1f} s")
    return run_id, state


@pytest.fixture(scope="module")
def retried_run(server, root, first_run):
    _, api, env = server
    run_id = deployment_run(env, "crawl-to-model/crawl-to-model", {"root": root, "overrides": [*TRAIN, OTHER_RUN, FAULT]})
    failed = api.wait(run_id, {"FAILED"})
    # What the UI's Retry button does (DESIGN §8): the same flow run, set to AwaitingRetry.
    api.call("POST", f"/flow_runs/{run_id}/set_state",
             {"state": {"type": "SCHEDULED", "name": "AwaitingRetry"}, "force": True})
    start = time.perf_counter()
    state = api.wait(run_id, {"COMPLETED"})
    print(f"\nUI retry → {state}: {time.perf_counter() - start:.1f} s")
    return run_id, failed, state


def run_dirs(root: str) -> list[Path]:
    return sorted(p.parent for p in Path(storage.filesystem(root)[1], "train").glob("*/manifest.json"))


def test_crawl_to_model_deployment_with_default_dask_completes(first_run, server):
    run_id, state = first_run
    assert state == "COMPLETED"
    stages = {row["stage"]: row for row in server[1].summary(run_id)}
    assert DATA_STAGES | {"train", "eval"} == set(stages)
    assert not any(stages[s]["reused"] for s in DATA_STAGES)


def test_a_failed_run_retried_from_the_ui_reuses_the_data_and_resumes_training(retried_run, server, root):
    run_id, failed, state = retried_run
    assert (failed, state) == ("FAILED", "COMPLETED")
    stages = {row["stage"]: row for row in server[1].summary(run_id)}
    assert all(stages[s]["reused"] for s in DATA_STAGES) and not stages["train"]["reused"]
    run_dir = Path(storage.filesystem(stages["train"]["url"])[1])
    assert json.loads((run_dir / "summary.json").read_text())["resumed_from"] == 4
    assert list((run_dir / "faults").iterdir()), "the fault fired in the first attempt"


def flow_run_processes(run_ids: set[str]) -> list[psutil.Process]:
    """Live processes of these flow runs (the worker gives each its run's id in PREFECT__FLOW_RUN_ID); an exited,
    unreaped one is not live."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("PREFECT__FLOW_RUN_ID") in run_ids:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def events_named(api: Api, name: str) -> list[dict]:
    window = {"since": (datetime.now(timezone.utc) - timedelta(days=1)).isoformat(),
              "until": (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()}
    page = api.call("POST", "/events/filter", {"filter": {"occurred": window, "event": {"name": [name]}}, "limit": 50})
    assert page["total"] == len(page["events"]), page["total"]
    return page["events"]


def test_eval_deployment_runs_once_per_committed_checkpoint_under_the_runs_root(first_run, retried_run, server, root):
    _, api, _ = server
    committed = {}
    for run_dir in run_dirs(root):
        for step in (4, 8):
            committed[storage.normalize_url(str(run_dir / "checkpoints" / f"step-{step:08d}"))] = step
        assert sorted(json.loads((run_dir / "published.json").read_text())) == [4, 8]
    assert len(committed) == 4
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        runs = api.runs_of("eval/eval")
        if len(runs) >= len(committed) and all(r["state_type"] in {"COMPLETED", "FAILED", "CRASHED"} for r in runs):
            break
        time.sleep(2)
    # No commit is published twice: once every process that could publish one is gone, a marker event sent after
    # them has been stored, so every event they sent has been too, and each commit has one event and one run.
    crawl_runs = {first_run[0], retried_run[0]}
    deadline = time.monotonic() + 60
    while flow_run_processes(crawl_runs):
        assert time.monotonic() < deadline, f"crawl-to-model processes still running: {flow_run_processes(crawl_runs)}"
        time.sleep(0.5)
    marker = f"smelt.test.marker.{uuid.uuid4()}"
    api.call("POST", "/events", [{"id": str(uuid.uuid4()), "occurred": datetime.now(timezone.utc).isoformat(),
                                  "event": marker, "resource": {"prefect.resource.id": marker}}])
    deadline = time.monotonic() + 60
    while not events_named(api, marker):
        assert time.monotonic() < deadline, "the marker event was not stored within 60 s"
        time.sleep(0.5)
    published = [e["payload"]["url"] for e in events_named(api, "smelt.checkpoint.committed")]
    assert sorted(published) == sorted(committed)
    runs = api.runs_of("eval/eval")
    assert sorted(r["parameters"]["checkpoint"] for r in runs) == sorted(committed)
    assert {r["state_type"] for r in runs} == {"COMPLETED"}
    for run_dir in run_dirs(root):  # each publication held its checkpoint for retention; each eval released it
        assert (run_dir / eval_holds.HOLDS_DIR).is_dir() and eval_holds.held_steps(str(run_dir)) == set()
    assert {r["parameters"]["root"] for r in runs} == {root}
    evals = [json.loads(p.read_text()) for p in Path(storage.filesystem(root)[1], "eval").glob("*/manifest.json")]
    assert sorted(e["meta"]["checkpoint"] for e in evals) == sorted(committed)
    for e in evals:
        assert e["meta"]["step"] == committed[e["meta"]["checkpoint"]]
        assert set(e["meta"]["splits"]) == {"web", "code"}
    by_run = {}
    for e in evals:
        by_run.setdefault(e["meta"]["run"], {})[e["meta"]["step"]] = e["stats"]["val_loss"]
        assert "loss.png" in {s["name"] for s in e["shards"]}
    for losses in by_run.values():
        assert losses[4] != losses[8]
    # The per-run table grows by one row per evaluated checkpoint (two evals running at once may each
    # publish before the other's commit, so the rows are checked across the artifact's versions).
    for run_dir in run_dirs(root):
        versions = api.call("POST", "/artifacts/filter", {"artifacts": {"key": {"any_": [f"smelt-evals-{run_dir.name}"]}}})
        tables = [json.loads(v["data"]) if isinstance(v["data"], str) else v["data"] for v in versions]
        assert {row["step"] for table in tables for row in table} == {4, 8}
        assert all({"web val loss", "code bits/byte", "total perplexity", "tokens"} <= set(row) for table in tables
                   for row in table)


def smelt(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], env=env, capture_output=True, text=True,
                          timeout=300)


def test_smelt_eval_of_two_checkpoints_gives_two_results_and_each_run_its_own(retried_run, server, root):
    _, _, env = server
    first, second = run_dirs(root)
    results = {}
    for step in (4, 8):
        out = smelt(env, "eval", "--checkpoint", str(first / "checkpoints" / f"step-{step:08d}"), "--json")
        assert out.returncode == 0, out.stderr
        results[step] = json.loads(out.stdout)
    assert (results[4]["step"], results[8]["step"]) == (4, 8)
    assert results[4]["fingerprint"] != results[8]["fingerprint"] and results[4]["url"] != results[8]["url"]
    assert results[4]["stats"]["val_loss"] != results[8]["stats"]["val_loss"]
    # An evaluation is keyed by its checkpoint's own identity (run, step, checksums): the two runs' step-4
    # checkpoints are two results. (The runs differ in their init seed, part of a run's identity; a training
    # setting such as the fault spec no longer makes another run: tasks/train/identity.py.)
    evals = {(e["meta"]["run"], e["meta"]["step"]): e["fingerprint"] for e in
             (json.loads(p.read_text()) for p in Path(storage.filesystem(root)[1], "eval").glob("*/manifest.json"))}
    run_url = {d: storage.normalize_url(str(d)) for d in (first, second)}
    assert evals[(run_url[first], 4)] == results[4]["fingerprint"]
    assert evals[(run_url[first], 4)] != evals[(run_url[second], 4)]


def test_eval_of_a_checkpoint_retention_removed_is_skipped_with_the_reason(retried_run, server, root):
    _, _, env = server
    run_dir = run_dirs(root)[0]
    step = run_dir / "checkpoints" / "step-00000004"
    (step / "manifest.json").unlink()  # as retention does: uncommit, then delete
    subprocess.run(["rm", "-rf", str(step)], check=True)
    out = smelt(env, "eval", "--checkpoint", str(step), "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["skipped"] and "retention" in result["reason"]


def test_a_deployment_run_with_an_unreachable_store_fails_in_seconds_with_one_sentence(server):
    """The flow itself checks its s3:// parameters first (the CLI's preflight does not run on this path):
    the job's environment points at a closed port, as a wrong AWS_ENDPOINT_URL would."""
    _, api, env = server
    store = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    run_id = deployment_run(env, "ingest/ingest", {"inputs": ["s3://smelt-nowhere/crawl/*.warc.gz"],
                                                   "root": "s3://smelt-nowhere/root"},
                            "--job-variable", f"env={json.dumps(store)}")
    assert api.wait(run_id, {"FAILED"}, timeout_s=180) == "FAILED"
    run = api.call("GET", f"/flow_runs/{run_id}")
    message = run["state"]["message"] or ""
    assert "cannot connect to the object store at http://127.0.0.1:9" in message, message
    assert run["total_run_time"] < 30, run["total_run_time"]


# -- one writer per run (tasks/lease.py): these run last, on roots of their own --------------------------------

WAIT_FOR_LEASE = "launch.lease_wait_minutes=10"


@pytest.fixture(scope="module")
def fresh_root(tmp_path_factory) -> str:
    from tasks.sample.code import write_sample_code
    from tasks.sample.crawl import write_sample_crawl

    url = storage.normalize_url(str(tmp_path_factory.mktemp("smelt-root-concurrent")))
    write_sample_crawl(storage.join(url, "sample"), pages=200, files=2, seed=3)
    write_sample_code(storage.join(url, "sample", "code"), files=80, seed=3)
    return url


def test_two_concurrent_runs_on_one_root_compute_each_stage_once_and_train_once(server, fresh_root):
    _, _, env = server
    command = [sys.executable, "-m", "flows.cli", "run", "--root", fresh_root, "--json"]
    for override in (*TRAIN, WAIT_FOR_LEASE):
        command += ["--set", override]
    runs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outputs = [run.communicate(timeout=RUN_TIMEOUT_S) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], "\n".join(err[-3000:] for _, err in outputs)
    summaries = [{s["stage"]: s for s in json.loads(out.strip().splitlines()[-1])["stages"]} for out, _ in outputs]
    for name in DATA_STAGES | {"train"}:
        computed = [not summary[name]["reused"] for summary in summaries]
        assert sorted(computed) == [False, True], (name, computed)  # one computed it, the other reused it
        assert summaries[0][name]["url"] == summaries[1][name]["url"]
    # (The eval: computed at most once, perhaps by the eval deployment that the final checkpoint triggered.)
    assert sum(not summary["eval"]["reused"] for summary in summaries) <= 1
    assert summaries[0]["eval"]["url"] == summaries[1]["eval"]["url"]
    logs = "".join(out + err for out, err in outputs)
    assert "another run is computing" in logs  # the second waited for the first's manifest
    [run_dir] = run_dirs(fresh_root)
    launches = [e for e in map(json.loads, (run_dir / "events.jsonl").read_text().splitlines()) if e["event"] == "launch"]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(launches) == 1 and steps == list(range(1, 9))


def test_a_run_marked_crashed_while_training_is_retried_and_the_retry_waits_for_the_live_trainer(server, fresh_root):
    """The field case: the worker lost the flow run (marked Crashed) while its training still runs, and someone
    presses Retry. The retry's train task waits on the run folder's lease, then reuses the run: never two trainers."""
    _, api, env = server
    held = "train.faults.inject=stop:rank=0,step=6"  # the gate: the only rank stops itself at step 6
    run_id = deployment_run(env, "crawl-to-model/crawl-to-model",
                            {"root": fresh_root, "overrides": [*TRAIN, "train.seed=7", held, WAIT_FOR_LEASE]})
    train_root = Path(storage.filesystem(fresh_root)[1], "train")
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not (markers := list(train_root.glob("*/faults/fired-stop-0-6"))):
        state = api.state(run_id)
        assert time.monotonic() < deadline and state not in {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}, state
        time.sleep(1)
    [marker] = markers
    run_dir, rank_pid = marker.parents[1], json.loads(marker.read_text())["pid"]

    try:
        api.call("POST", f"/flow_runs/{run_id}/set_state", {"state": {"type": "CRASHED"}, "force": True})
        api.call("POST", f"/flow_runs/{run_id}/set_state", {"state": {"type": "SCHEDULED", "name": "AwaitingRetry"},
                                                            "force": True})  # the UI's Retry button

        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not logged(api, run_id, "waiting for the run folder's lease"):
            assert time.monotonic() < deadline, f"the retry never reached the run folder's lease: {history(api, run_id)}"
            time.sleep(1)
        os.kill(rank_pid, signal.SIGCONT)  # the first attempt's trainer goes on and finishes the run

        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not (run_dir / "manifest.json").exists() or api.state(run_id) not in {"COMPLETED", "FAILED", "CRASHED"}:
            assert time.monotonic() < deadline, api.state(run_id)
            time.sleep(2)
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
        assert [e["event"] for e in events].count("launch") == 1, events  # one trainer, ever
        steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert steps == list(range(1, 9))
        assert api.wait(run_id, {"COMPLETED"}) == "COMPLETED"
        assert eventually_logged(api, run_id, f"train: reusing finished run {storage.normalize_url(str(run_dir))}")
    finally:  # never leave the stopped rank behind, whatever failed
        with contextlib.suppress(ProcessLookupError):
            os.kill(rank_pid, signal.SIGCONT)


def history(api: Api, run_id: str) -> list[str]:
    """The flow run's states, oldest first (for a failure's message)."""
    states = api.call("GET", f"/flow_run_states/?flow_run_id={run_id}")
    return [f"{s['timestamp']} {s['type']}/{s['name']}" for s in sorted(states, key=lambda s: s["timestamp"])]


def logged(api: Api, run_id: str, text: str) -> bool:
    """Whether a log line of the flow run (any attempt) contains ``text``: every page of its logs (the server
    answers 200 lines at most per request)."""
    for offset in range(0, 20_000, 200):
        logs = api.call("POST", "/logs/filter", {"logs": {"flow_run_id": {"any_": [run_id]}}, "limit": 200,
                                                 "offset": offset, "sort": "TIMESTAMP_DESC"})
        if any(text in entry["message"] for entry in logs):
            return True
        if len(logs) < 200:
            return False
    return False


def eventually_logged(api: Api, run_id: str, text: str, timeout_s: float = 60) -> bool:
    """``logged``, polled: a finished run's last log lines reach the server in a batch after its state does."""
    deadline = time.monotonic() + timeout_s
    while not logged(api, run_id, text):
        if time.monotonic() > deadline:
            return False
        time.sleep(1)
    return True
