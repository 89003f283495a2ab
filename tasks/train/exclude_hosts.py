"""``<run_dir>/exclude_hosts.json``: hosts to keep out of the next launch, written by straggler detection
(tasks/train/stragglers.py, on rank 0) and read by the launcher (tasks/train/node_launch.py). No torch, so the
launcher reads it without importing the trainer.
"""

from __future__ import annotations

import json

from tasks import storage

EXCLUDE_HOSTS = "exclude_hosts.json"


def excluded_hosts(run_dir: str) -> list[str]:
    """Hosts listed in ``<run_dir>/exclude_hosts.json`` (none if there is no such file)."""
    fs, path = storage.filesystem(storage.join(storage.normalize_url(run_dir), EXCLUDE_HOSTS))
    return list(json.loads(fs.cat_file(path))["hosts"]) if fs.exists(path) else []


def write_excluded(run_dir: str, flagged: list[dict], reason: str) -> list[str]:
    """Write the hosts (and ranks) of ``flagged`` (``{"host", "rank"}`` each) as the list; returns the hosts."""
    hosts = sorted({f["host"] for f in flagged})
    with storage.atomic_write(storage.join(run_dir, EXCLUDE_HOSTS), "w") as f:
        f.write(json.dumps({"hosts": hosts, "ranks": sorted({f["rank"] for f in flagged}), "reason": reason},
                           indent=2))
    return hosts
