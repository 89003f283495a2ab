"""``smelt launch ENGINE``: render a JobSpec with the engine's renderer, then submit it (Slurm) or write the
manifest to apply (Kubernetes). Above job.py and the renderers, which import job.py.
"""

from __future__ import annotations

from pathlib import Path

from infra.launch import kubernetes, slurm
from infra.launch.job import JobSpec
from tasks.train.node_launch import prepare_run

ENGINES = ("slurm", "kubernetes")


def launch(engine: str, *, data: dict[str, str], config: dict, run_dir: str, dry_run: bool,
           script_path: str | None = None, **options) -> dict:
    """Render the job for ``engine``; unless ``dry_run``, write the run's ``train_config.json`` and
    submit it (Slurm) or write the manifest to apply (Kubernetes). Returns what was done."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}: choose one of {', '.join(ENGINES)}")
    if config.get("ft", {}).get("enabled"):
        raise ValueError(f"smelt launch {engine} does not start torchft replica groups yet ([train.ft] enabled): run "
                         "them with smelt train or the Prefect train task (one host), or set train.ft.enabled = false "
                         "to train parallel.dp_replicate as one job's replicate dimension")
    spec = JobSpec(run_dir=run_dir, train_args=prepare_run(data, config, run_dir, write=False), **options)
    text = slurm.render(spec) if engine == "slurm" else kubernetes.render(spec)
    out = {"engine": engine, "run_dir": spec.run_dir, "name": spec.name, "world_size": spec.world_size,
           "text": text, "path": None, "job_id": None}
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
