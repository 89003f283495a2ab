"""``smelt launch ENGINE``: render a JobSpec with the engine's renderer, then submit it (Slurm) or write the
manifest to apply (Kubernetes). Above job.py and the renderers, which import job.py. With ``[train.ft]`` the
job starts torchft replica groups (tasks/train/replica_cluster.py), each launch with a fresh launch id.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from infra.launch import kubernetes, slurm
from infra.launch.job import JobSpec
from tasks.config import from_dict
from tasks.train.config import TrainConfig
from tasks.train.node_launch import prepare_run

ENGINES = ("slurm", "kubernetes")


def launch(engine: str, *, data: dict[str, str], config: dict, run_dir: str, dry_run: bool,
           script_path: str | None = None, **options) -> dict:
    """Render the job for ``engine``; unless ``dry_run``, write the run's ``train_config.json`` and
    submit it (Slurm) or write the manifest to apply (Kubernetes). Returns what was done."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}: choose one of {', '.join(ENGINES)}")
    ft = None
    if config.get("ft", {}).get("enabled"):  # torchft replica groups: the Lighthouse and a job step / Job per group
        ft = from_dict(TrainConfig, config).ft
        options = {"replica_groups": int(config.get("parallel", {}).get("dp_replicate", 1)),
                   "lighthouse_port": ft.lighthouse_port or JobSpec.lighthouse_port,
                   "launch_id": uuid.uuid4().hex[:12], **options}
    spec = JobSpec(run_dir=run_dir, train_args=prepare_run(data, config, run_dir, write=False), **options)
    text = slurm.render(spec) if engine == "slurm" else kubernetes.render(spec, ft=ft)
    out = {"engine": engine, "run_dir": spec.run_dir, "name": spec.name, "world_size": spec.world_size,
           "replica_groups": spec.replica_groups, "launch_id": spec.launch_id, "text": text, "path": None,
           "job_id": None}
    if dry_run:
        return out
    prepare_run(data, config, run_dir)
    path = script_path or f"{spec.log_dir}/{spec.name}.{'sbatch' if engine == 'slurm' else 'yaml'}"
    out["path"] = path
    if engine == "slurm":
        out["job_id"] = slurm.submit(text, path)
    else:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    return out
