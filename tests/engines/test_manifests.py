"""The rendered Slurm script and Kubernetes manifest: they parse, and their torchrun arguments and
train config match the layout (no cluster needed)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra.launch.job import launch_command
from infra.launch.submit import launch
from infra.layout import Layout
from tasks.errors import UserError
from tasks.train.replica_cluster import parser
from tests.tasks.train.token_corpus import make_corpus

LAYOUT = Layout(tp=2, pp=2, dp_replicate=1, dp_shard=4, zero=1, micro_batch=1, pp_schedule="1F1B")
NODES, PER_NODE = 2, 8  # 16 ranks = tp 2 × pp 2 × fsdp 4


def _config() -> dict:
    from flows.config import load_run_config, section

    overrides = [f"train.{k}={v}" for k, v in LAYOUT.trainer_overrides(global_seqs=64, seq_len=128).items()]
    return section(load_run_config(None, overrides), "train")


def torchrun_args(words: list[str]) -> dict[str, str]:
    i = words.index("torch.distributed.run")
    args, it = {}, iter(words[i + 1:])
    for w in it:
        if w == "-m":
            break
        args[w] = next(it)
    return args


def test_kubernetes_manifest_parses_and_matches_the_layout(tmp_path):
    run_dir = str(tmp_path / "run")
    out = launch("kubernetes", data={"main": make_corpus(str(tmp_path / "corpus"))}, config=_config(),
                 run_dir=run_dir, dry_run=False, script_path=str(tmp_path / "job.yaml"), nodes=NODES,
                 procs_per_node=PER_NODE, gpus_per_node=PER_NODE, max_restarts=2, rdzv_port=29400)
    service, job = yaml.safe_load_all(Path(out["path"]).read_text())
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    assert job["kind"] == "PyTorchJob" and job["apiVersion"] == "kubeflow.org/v1"
    elastic, worker = job["spec"]["elasticPolicy"], job["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert (elastic["minReplicas"], elastic["maxReplicas"], elastic["nProcPerNode"], elastic["maxRestarts"]) == \
           (NODES, NODES, PER_NODE, 2)
    assert worker["replicas"] == NODES and worker["restartPolicy"] == "OnFailure"
    container = worker["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == PER_NODE
    assert container["envFrom"] == [{"secretRef": {"name": "smelt-store"}}]
    words = shlex.split(container["command"][2])
    args = torchrun_args(words)
    assert args["--nnodes"] == str(NODES) and args["--nproc-per-node"] == str(PER_NODE)
    assert args["--rdzv-backend"] == "c10d" and args["--rdzv-endpoint"] == f"{service['metadata']['name']}:29400"
    assert args["--max-restarts"] == "2"
    config_url = words[words.index("--config") + 1]
    train = json.loads(Path(config_url.removeprefix("file://")).read_text())
    parallel = train["parallel"]
    assert (parallel["tp"], parallel["pp"], parallel["dp_shard"], parallel["dp_replicate"]) == (2, 2, 4, 1)
    assert parallel["tp"] * parallel["pp"] * parallel["dp_shard"] * parallel["dp_replicate"] == NODES * PER_NODE


def test_slurm_script_is_valid_shell_with_the_directives_of_the_layout(tmp_path):
    out = launch("slurm", data={"main": make_corpus(str(tmp_path / "corpus"))}, config=_config(),
                 run_dir="s3://bucket/run", dry_run=True, nodes=NODES, procs_per_node=PER_NODE,
                 gpus_per_node=PER_NODE, time_limit_minutes=24 * 60, stop_lead_s=600, partition="gpu")
    script = out["text"]
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    directives = [line.split(None, 1)[1] for line in script.splitlines() if line.startswith("#SBATCH")]
    assert {f"--nodes={NODES}", "--ntasks-per-node=1", f"--gpus-per-node={PER_NODE}", "--time=1-00:00:00",
            "--signal=B:USR1@600", "--requeue", "--partition=gpu"} <= set(directives)
    words = shlex.split(next(line for line in script.splitlines() if "torch.distributed.run" in line))
    args = torchrun_args(words)
    assert args["--nnodes"] == str(NODES) and args["--nproc-per-node"] == str(PER_NODE)
    assert args["--rdzv-endpoint"] == "$head_addr:29500"  # shlex drops the quotes; the shell expands it
    assert words[words.index("--run-dir") + 1] == "s3://bucket/run"


def _ft_config(groups: int = 2) -> dict:
    return {**_config(), "parallel": {**_config()["parallel"], "dp_replicate": groups, "pp": 1, "tp": 2, "dp_shard": 8},
            "ft": {"enabled": True, "heartbeat_timeout_ms": 700, "join_timeout_ms": 900, "quorum_tick_ms": 50,
                   "min_replicas": 1}}


def test_kubernetes_replica_groups_get_a_lighthouse_and_an_indexed_job_per_group_that_reach_it(tmp_path):
    """[train.ft] with 2 groups on 4 nodes × 8: a Lighthouse Deployment behind a Service, and per group a headless
    Service and an Indexed Job of 2 pods; each pod's command parses as replica_cluster's, names its group, the
    launch and its pod 0 as rendezvous host, and reaches the Lighthouse through its Service."""
    corpus = make_corpus(str(tmp_path / "corpus"))
    out = launch("kubernetes", data={"main": corpus}, config=_ft_config(), run_dir=str(tmp_path / "run"),
                 dry_run=False, script_path=str(tmp_path / "job.yaml"), nodes=4, procs_per_node=PER_NODE,
                 gpus_per_node=PER_NODE, rdzv_port=29400)
    docs = list(yaml.safe_load_all(Path(out["path"]).read_text()))
    assert [d["kind"] for d in docs] == ["Service", "Deployment", "Service", "Job", "Service", "Job"]
    lighthouse_svc, lighthouse = docs[0], docs[1]
    port = lighthouse_svc["spec"]["ports"][0]["port"]
    pod = lighthouse["spec"]["template"]
    assert lighthouse_svc["spec"]["selector"] == pod["metadata"]["labels"] == lighthouse["spec"]["selector"]["matchLabels"]
    cmd = pod["spec"]["containers"][0]["command"]
    flags = dict(zip(cmd[1::2], cmd[2::2]))
    assert cmd[0] == "torchft_lighthouse" and flags["--bind"] == f"0.0.0.0:{port}"
    assert (flags["--heartbeat_timeout_ms"], flags["--join_timeout_ms"], flags["--quorum_tick_ms"]) == ("700", "900", "50")
    assert len(out["launch_id"]) == 12 and out["replica_groups"] == 2
    for g, (svc, job) in enumerate(zip(docs[2::2], docs[3::2])):
        name = job["metadata"]["name"]
        spec, template = job["spec"], job["spec"]["template"]["spec"]
        assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 2, 2)
        assert template["restartPolicy"] == "OnFailure" and template["subdomain"] == svc["metadata"]["name"] == name
        assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["selector"] == {"job-name": name}
        container = template["containers"][0]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["TORCHFT_LIGHTHOUSE"] == f"http://{lighthouse_svc['metadata']['name']}:{port}"
        assert env["SMELT_LAUNCH_ID"] == out["launch_id"] and env["SMELT_REPLICA_ID"] == str(g)
        assert container["resources"]["limits"]["nvidia.com/gpu"] == PER_NODE
        words = container["command"]
        assert words[1:4] == ["-m", "tasks.train.replica_cluster", "group"]
        ns = parser().parse_args(words[3:])
        assert (ns.replica_id, ns.nodes, ns.procs_per_node, ns.launch_id) == (g, 2, PER_NODE, out["launch_id"])
        assert (ns.rdzv_host, ns.rdzv_port) == (f"{name}-0.{name}", 29400)
        train = json.loads(Path(ns.config.removeprefix("file://")).read_text())
        assert train["ft"]["enabled"] and train["parallel"]["dp_replicate"] == 2
        # a group's ranks: its nodes × ranks per node = its own mesh (tp × dp_shard), the replicate dim is torchft's
        assert 2 * PER_NODE == train["parallel"]["tp"] * train["parallel"]["dp_shard"]
    again = launch("kubernetes", data={"main": corpus}, config=_ft_config(), run_dir=str(tmp_path / "run"),
                   dry_run=True, nodes=4, procs_per_node=PER_NODE)
    assert again["launch_id"] != out["launch_id"]  # a new launch: its groups start from storage, not as restarts


def test_slurm_replica_groups_run_the_supervisor_on_the_batch_host_with_the_lighthouse_on_the_head_address():
    out = launch("slurm", data={"main": "file:///data/tokens"}, config=_ft_config(), run_dir="s3://bucket/run",
                 dry_run=True, nodes=4, procs_per_node=PER_NODE, gpus_per_node=PER_NODE, rdzv_port=29400)
    script = out["text"]
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    assert "torch.distributed.run" not in script  # no job-wide torchrun: a step per group, started by the supervisor
    line = next(line for line in script.splitlines() if "tasks.train.replica_cluster" in line)
    words = shlex.split(line.rstrip(" &"))
    ns = parser().parse_args(words[words.index("tasks.train.replica_cluster") + 1:])
    assert (ns.mode, ns.nodes, ns.procs_per_node, ns.rdzv_port) == ("supervise", 4, PER_NODE, 29400)
    assert ns.lighthouse_host == "$head_addr" and ns.run_dir == "s3://bucket/run"  # the shell expands it
    assert 'kill -USR1 "$run_pid"' in script  # the time limit's signal goes to the supervisor, not to the ranks


def test_replica_groups_on_a_node_count_that_does_not_split_among_them_are_refused_in_one_sentence():
    for engine in ("slurm", "kubernetes"):
        with pytest.raises(UserError, match=r"--nodes \(3\) must be a multiple of parallel.dp_replicate \(2\)"):
            launch(engine, data={"main": "file:///nowhere"}, config=_ft_config(), run_dir="s3://bucket/run",
                   dry_run=True, nodes=3)


def test_plan_prints_the_launch_command_of_the_layout_it_picks():
    line = launch_command("slurm", NODES, PER_NODE, PER_NODE, LAYOUT.trainer_overrides(64, 128))
    assert line.startswith("smelt launch slurm ") and f"--nodes {NODES} --procs-per-node {PER_NODE}" in line
    assert "--set train.parallel.tp=2" in line and "--set train.parallel.pp=2" in line
    out = subprocess.run([sys.executable, "-m", "flows.cli", "plan", "--gpus", "4096"], capture_output=True, text=True,
                         timeout=120, cwd=Path(__file__).resolve().parents[2], check=True).stdout
    launch_line = " ".join(out.split("launch: ", 1)[1].split("\n\n", 1)[0].split())
    trainer_line = " ".join(out.split("trainer: ", 1)[1].split("launch: ", 1)[0].split())
    assert "smelt launch slurm" in launch_line and "--nodes 512 --procs-per-node 8 --gpus-per-node 8" in launch_line
    settings = trainer_line.split("--set ")[1:]
    assert "--set train.model_preset=70b" in launch_line and any(s.startswith("parallel.tp=") for s in settings)
    assert all(f"--set train.{s.strip()}" in launch_line for s in settings)  # the plan's layout, as it printed it
