"""Dedup flow: documents → exact and near-duplicate-free documents (docs/design.md §3)."""

from __future__ import annotations

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.common import fails_in_one_sentence, one_sentence_failures, planned_output, retry_options, run_on_dask
from tasks import storage
from tasks.config import from_dict
from tasks.dedup.config import DedupConfig
from tasks.dedup.inputs import load_dedup_inputs
from tasks.dedup.stage import STAGE, run_dedup
from tasks.objectstore import preflight_all


def dedup_output(input_fps: list[str], root: str, cfg: DedupConfig) -> tuple[str, str]:
    return planned_output(root, STAGE, cfg, input_fps, "tasks.dedup")


@task(name="dedup", cache_policy=NO_CACHE, **retry_options(1))
@one_sentence_failures(STAGE)
def dedup_task(inputs: list[str], root: str, config: dict, dask_address: str | None = None,
               output: str | None = None) -> dict:
    """Run (or reuse) dedup over documents datasets or raw JSONL/Parquet files with id and text."""
    cfg = from_dict(DedupConfig, config)
    manifests = load_dedup_inputs(inputs, staging_url=storage.join(storage.normalize_url(root), "dedup-inputs"))
    url, fp = dedup_output([m.fingerprint for m in manifests], root, cfg)
    url = storage.normalize_url(output) if output else url
    return run_on_dask(STAGE, url, fp, dask_address,
                       lambda map_fn: run_dedup(manifests, url, cfg, fingerprint=fp, map_fn=map_fn))


@flow(name="dedup")
@fails_in_one_sentence
def dedup_flow(inputs: list[str], root: str = "smelt-data", config: dict | None = None,
               dask_address: str | None = None, output: str | None = None) -> dict:
    """Remove exact and near-duplicate documents (MinHash LSH)."""
    preflight_all(inputs, root, output)
    return dedup_task(inputs, root, config or {}, dask_address, output)
