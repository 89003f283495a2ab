"""A Slurm batch script for a training run, and its submission.

One task per node runs torchrun's agent (``srun --ntasks-per-node=1``); the agents meet through
c10d rendezvous on the first node of the allocation, and each starts ``procs_per_node`` ranks.

Faults, from small to large:
- a rank fails: torchrun restarts all ranks (``--max-restarts``), which resume from the newest
  committed checkpoint;
- a node fails: ``--requeue`` puts the whole job back in the queue; the rerun resumes the same way;
- the time limit nears: Slurm sends SIGUSR1 to the batch shell ``stop_lead_s`` ahead
  (``--signal=B:USR1@…``); the shell forwards it to the ranks (the agents ignore it), which agree on
  a step, checkpoint it and exit cleanly (tasks/train/preemption.py); the shell then requeues the job.

The submitting shell's environment (object store credentials, SMELT_CACHE_DIR) is exported to
the job, as sbatch does by default.

With ``[train.ft]`` (``spec.replica_groups``) the batch shell runs the replica supervisor instead
(tasks/train/replica_cluster.py): the Lighthouse on the head node, each group a job step on its own
nodes, a lost group's step started again; SIGUSR1 goes to the supervisor, which stops the groups, and
the requeued job resumes them from the newest storage checkpoint.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

from infra.launch.job import HEAD, JobSpec, SubmitError, shell_line
from tasks.repo import REPO_ROOT
from tasks.train.node_launch import TORCHRUN_ENV


def _time(minutes: int) -> str:
    days, rest = divmod(int(minutes), 24 * 60)
    return f"{days}-{rest // 60:02d}:{rest % 60:02d}:00"


def render(spec: JobSpec, python: str | None = None) -> str:
    """The sbatch script for ``spec``."""
    directives = [
        f"--job-name={spec.name}",
        f"--nodes={spec.nodes}",
        "--ntasks-per-node=1",
        *([f"--gpus-per-node={spec.gpus_per_node}"] if spec.gpus_per_node else []),
        *([f"--cpus-per-task={spec.cpus_per_node}"] if spec.cpus_per_node else []),
        *([f"--time={_time(spec.time_limit_minutes)}"] if spec.time_limit_minutes else []),
        f"--signal=B:USR1@{spec.stop_lead_s}",
        "--requeue",
        "--open-mode=append",
        f"--output={spec.log_dir}/%x-%j.out",
        *([f"--partition={spec.partition}"] if spec.partition else []),
        *([f"--account={spec.account}"] if spec.account else []),
    ]
    if spec.replica_groups:
        # [train.ft]: the replica supervisor on this (the batch) host: the Lighthouse bound to the head node's
        # address, each group a job step on its own nodes (tasks/train/replica_cluster.py). It takes SIGUSR1
        # itself (the groups are stopped; the requeued job resumes them from storage).
        cmd = spec.replica_command("supervise", python, nodes=spec.nodes, procs_per_node=spec.procs_per_node,
                                   rdzv_port=spec.rdzv_port, lighthouse_host=HEAD)
        run = shell_line(cmd, '"$head_addr"') + " &"
        on_usr1 = 'kill -USR1 "$run_pid"'
        stopped = "stopped before the time limit; requeueing (the groups resume from the newest storage checkpoint)"
        what = (f"{spec.replica_groups} torchft replica group(s) × {spec.nodes_per_group} node(s) × "
                f"{spec.procs_per_node} rank(s)")
    else:
        torchrun = shell_line(spec.torchrun("$SLURM_JOB_ID", python), '"$head_addr"')
        # One rendezvous per run of the job: agents left over from before a requeue (a node that was
        # only marked down) must not join the new one.
        torchrun = torchrun.replace("'$SLURM_JOB_ID'", '"smelt-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}"')
        run = "srun --ntasks-per-node=1 --kill-on-bad-exit=1 sh -c 'trap \"\" USR1; exec \"$@\"' torchrun \\\n  " + torchrun + " &"
        on_usr1 = 'scancel --signal=USR1 "$SLURM_JOB_ID"'
        stopped = "checkpointed before the time limit; requeueing"
        what = f"{spec.nodes} node(s) × {spec.procs_per_node} rank(s) = world size {spec.world_size}"
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted({**TORCHRUN_ENV, **spec.env}.items()))
    return f"""#!/bin/bash
{chr(10).join('#SBATCH ' + d for d in directives)}
# Rendered by `smelt launch slurm` for the run {spec.run_dir}
# {what}
set -uo pipefail
cd {shlex.quote(str(REPO_ROOT))}
export PYTHONPATH={shlex.quote(str(REPO_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}
{exports}head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
head_addr=$(scontrol show node "$head_node" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')
echo "smelt: job $SLURM_JOB_ID (restart ${{SLURM_RESTART_COUNT:-0}}) on $SLURM_JOB_NODELIST, rendezvous $head_addr:{spec.rdzv_port}"

stop_requested=0
trap 'stop_requested=1; echo "smelt: time limit near: stopping"; {on_usr1}' USR1
{run}
run_pid=$!
while :; do  # a trapped signal interrupts wait; keep waiting for the run itself
  wait "$run_pid"; status=$?
  kill -0 "$run_pid" 2>/dev/null || break
done
if [ "$stop_requested" = 1 ] && [ "$status" = 0 ]; then
  echo "smelt: {stopped}"
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$status"
"""


def submit(script: str, script_path: str | Path, env: dict[str, str] | None = None) -> str:
    """Write the script to ``script_path`` and ``sbatch`` it; returns the job id."""
    path = Path(script_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    log_dir = re.search(r"^#SBATCH --output=(.*)/[^/]*$", script, re.M)
    if log_dir:
        Path(log_dir.group(1)).mkdir(parents=True, exist_ok=True)
    try:
        out = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True, timeout=60, env=env)
    except FileNotFoundError:
        raise SubmitError("sbatch not found: run `smelt launch slurm` on a Slurm login node (or use --dry-run)") from None
    if out.returncode != 0:
        raise SubmitError(f"sbatch refused {path}: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout.strip().split(";")[0]
