"""Everything a run folder says about the run, read once: the input of the report and the derived scalars.

Sources (each may be missing: a run that is still starting, or a folder copied without its evals):
``train_config.json``, ``summary.json``, ``manifest.json`` (a finished run), ``metrics.jsonl`` and
``events.jsonl`` (tasks/train/goodput.py), ``stragglers.json``, the committed checkpoints, the
evaluations of the run's checkpoints under its root (tasks/eval/report.py), and the data funnel: the
tokens datasets the run trained on and, through their lineage, every stage back to the crawl.
"""

from __future__ import annotations

import json
import time
from typing import Any

from tasks import contract, jsonlog, storage
from tasks.checkpoint_reader import list_committed
from tasks.counters import funnel
from tasks.eval.report import run_evaluations
from tasks.train import goodput
from tasks.train.stragglers import REPORT as STRAGGLERS


def _json(run_dir: str, name: str) -> Any:
    fs, path = storage.filesystem(storage.join(run_dir, name))
    try:
        return json.loads(fs.cat_file(path))
    except FileNotFoundError:
        return None


def root_of(run_dir: str) -> str:
    """``<root>/train/<run identity>`` → ``<root>``, where the run's evaluations land."""
    return run_dir.rstrip("/").rsplit("/", 2)[0]


def stage_of(url: str) -> str:
    """A stage output's stage: ``<root>/<stage>/<fingerprint>``; another URL is named by its last part."""
    parts = url.rstrip("/").rsplit("/", 2)
    return parts[-2] if len(parts) == 3 else parts[-1]


def data_funnel(data: dict[str, str]) -> list[dict]:
    """Per tokens dataset (``name → URL``): every stage from the crawl to the tokens, oldest first, each
    with its funnel rows (tasks/counters.funnel: ``in``, each step's ``out`` and drop reasons, ``out``)."""
    branches = []
    for name, url in sorted(data.items()):
        chain, seen, todo = [], set(), [storage.normalize_url(url)]
        while todo:  # lineage is a DAG: each stage lists its inputs; follow the documents chain back
            current = todo.pop()
            manifest = contract.read_manifest(current) if current not in seen else None
            seen.add(current)
            if manifest is None:
                continue
            chain.append({"stage": stage_of(current), "kind": manifest.kind, "url": current,
                          "rows": funnel(manifest), "stats": dict(manifest.stats)})
            # the documents this dataset was made of; the tokenizer's own lineage is every branch's
            todo += [i["url"] for i in manifest.lineage.get("inputs", []) if i.get("kind") == "documents"]
        branches.append({"name": name, "stages": chain[::-1]})
    return branches


def collect(run_dir: str, root: str | None = None) -> dict[str, Any]:
    """The run's record, as plain JSON-able values (see the module docstring)."""
    run_dir = storage.normalize_url(run_dir)
    metrics = jsonlog.read(run_dir, goodput.METRICS)
    events = jsonlog.read(run_dir, goodput.EVENTS)
    summary = _json(run_dir, "summary.json") or {}
    config = _json(run_dir, "train_config.json") or {}
    manifest = contract.read_manifest(run_dir)
    checkpoints = list_committed(run_dir, checksums=False)
    data = (manifest.meta.get("data") if manifest else None) or _checkpoint_data(checkpoints)
    evaluations = run_evaluations(root or root_of(run_dir), run_dir)
    # a finished launch wrote its split; a running one is split up to its newest step
    split = summary.get("goodput") or (goodput.goodput_split(events, metrics, max(r["time"] for r in metrics))
                                       if metrics and any(e["event"] == "start" for e in events) else None)
    return {
        "run_dir": run_dir, "name": run_dir.rsplit("/", 1)[-1], "config": config, "summary": summary,
        "finished": manifest is not None, "metrics": metrics, "events": events, "goodput": split,
        "stragglers": _json(run_dir, STRAGGLERS), "checkpoints": checkpoints, "evaluations": evaluations,
        "data": data or {}, "funnel": data_funnel(data or {}), "generated_at": time.time(),
    }


def _checkpoint_data(checkpoints: list[dict]) -> dict[str, str] | None:
    """The tokens datasets a running run trains on, from its newest checkpoint's manifest."""
    if not checkpoints:
        return None
    manifest = contract.read_manifest(checkpoints[-1]["url"])
    return manifest.meta.get("data") if manifest else None
