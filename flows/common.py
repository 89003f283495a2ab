"""What every stage flow shares: fingerprinted output URLs, reuse of finished stages, artifacts.

A stage is reused when a manifest exists at its fingerprinted URL (DESIGN.md §2). smelt does not
lean on Prefect's result cache for this: that cache can outlive (or miss) the data it points at,
while the manifest is the data's own proof of completeness. So a retried flow run, from the UI or
the CLI, skips finished stages whether or not Prefect kept anything.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from prefect import get_run_logger
from prefect.artifacts import create_table_artifact

from flows.dask_runtime import dask_map
from tasks import datasets
from tasks.parallel import MapFn


@dataclasses.dataclass
class StageOutcome:
    """What a stage task hands on: a URL and a summary, never data."""

    stage: str
    url: str
    fingerprint: str
    kind: str
    reused: bool
    seconds: float
    rows: int
    stats: dict[str, Any]
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)  # the manifest's scalar meta

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def planned_output(root: str, stage: str, cfg: Any, input_fingerprints: list[str], *packages: str) -> tuple[str, str]:
    """(output URL, fingerprint) of a stage: computable before anything runs."""
    fp = datasets.fingerprint(stage, cfg, input_fingerprints, datasets.code_version(*packages))
    return datasets.stage_url(root, stage, fp), fp


def reuse_or_run(stage: str, url: str, fp: str, compute: Callable[[], datasets.Manifest]) -> StageOutcome:
    """Return the finished dataset at ``url`` or run ``compute`` to make it; log which."""
    logger = get_run_logger()
    start = time.perf_counter()
    manifest = datasets.finished_dataset(url, fp)
    reused = manifest is not None
    if reused:
        logger.info(f"{stage}: reusing finished dataset {url}")
    else:
        logger.info(f"{stage}: computing {url}")
        manifest = compute()
    outcome = StageOutcome(
        stage=stage,
        url=url,
        fingerprint=fp,
        kind=manifest.kind,
        reused=reused,
        seconds=round(time.perf_counter() - start, 2),
        rows=manifest.rows,
        stats=dict(manifest.stats),
        meta=scalar_meta(manifest),
    )
    if not reused:
        publish_stats(stage, manifest)
    return outcome


def scalar_meta(manifest: datasets.Manifest) -> dict[str, Any]:
    """The manifest's small meta values (vocab size, dtype, …) worth showing in summaries."""
    return {k: v for k, v in manifest.meta.items() if isinstance(v, (int, float, str, bool))}


def run_on_dask(stage: str, url: str, fp: str, dask_address: str | None,
                run: Callable[[MapFn], datasets.Manifest]) -> dict:
    """Reuse the stage's dataset or run it, fanning its work items out over Dask; a StageOutcome dict."""
    log = get_run_logger().info

    def compute() -> datasets.Manifest:
        with dask_map(dask_address, log) as map_fn:
            return run(map_fn)

    return reuse_or_run(stage, url, fp, compute).to_dict()


def artifact_key(text: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


def publish_stats(stage: str, manifest: datasets.Manifest) -> None:
    """The stage's counters as a Prefect table artifact: the ordered funnel when the stage records one
    (documents in → out of every step, with drop reasons), else every counter."""
    from tasks.counters import funnel

    if any(k.startswith("funnel.") for k in manifest.stats):
        rows = [{"step": name, "documents": count} for name, count in funnel(manifest)]
    else:
        rows = [{"counter": k, "value": v} for k, v in sorted(manifest.stats.items())]
    create_table_artifact(
        key=artifact_key(f"smelt-{stage}-stats"),
        table=rows,
        description=f"{stage} stats for {manifest.meta.get('url', '')} (fingerprint {manifest.fingerprint})",
    )
