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


def test_a_launch_of_torchft_replica_groups_on_slurm_or_kubernetes_is_refused_in_one_sentence(tmp_path):
    """Those launches would start one torchrun job, not the Lighthouse and a job per group: refused, not run wrong."""
    config = {**_config(), "ft": {"enabled": True}}
    for engine in ("slurm", "kubernetes"):
        with pytest.raises(ValueError, match=f"smelt launch {engine} does not start torchft replica groups yet"):
            launch(engine, data={"main": "file:///nowhere"}, config=config, run_dir=str(tmp_path / "run"),
                   dry_run=True)


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
