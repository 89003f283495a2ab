"""Ingest flow: raw crawl files → documents (docs/design.md §3)."""

from __future__ import annotations

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from flows.common import fails_in_one_sentence, one_sentence_failures, planned_output, retry_options, run_on_dask
from tasks import contract, storage
from tasks.config import from_dict
from tasks.counters import funnel
from tasks.ingest.config import IngestConfig
from tasks.ingest.langid import model_fingerprint, shipped_lid_model_path
from tasks.ingest.readers import expand_inputs
from tasks.ingest.code.config import CodeIngestConfig
from tasks.ingest.code.readers import expand_code_inputs
from tasks.ingest.code.stage import STAGE as CODE_STAGE
from tasks.ingest.code.stage import code_input_fingerprints, run_code_ingest
from tasks.ingest.stage import STAGE, run_ingest
from tasks.objectstore import preflight_all


def model_stamps(cfg: IngestConfig) -> list[str]:
    """Identity of the model files ingest applies: retraining a classifier in place must change the output."""
    paths = [cfg.lang.model_path or shipped_lid_model_path()]
    if cfg.classifier.enabled:
        paths.append(cfg.classifier.model_url)
    return [model_fingerprint(p) for p in paths]


def ingest_output(inputs: list[str], root: str, cfg: IngestConfig) -> tuple[list[str], str, str]:
    """(expanded input URLs, output URL, fingerprint) for raw inputs under ``root``."""
    urls = expand_inputs(inputs)
    url, fp = planned_output(root, STAGE, cfg, contract.raw_input_fingerprints(urls) + model_stamps(cfg),
                             "tasks.ingest")
    return urls, url, fp


@task(name="ingest", cache_policy=NO_CACHE, **retry_options(1))
@one_sentence_failures(STAGE)
def ingest_task(inputs: list[str], root: str, config: dict, dask_address: str | None = None,
                output: str | None = None) -> dict:
    """Run (or reuse) the ingest stage; returns a StageOutcome dict with the dataset URL."""
    cfg = from_dict(IngestConfig, config)
    urls, url, fp = ingest_output(inputs, root, cfg)
    url = storage.normalize_url(output) if output else url
    outcome = run_on_dask(STAGE, url, fp, dask_address,
                          lambda map_fn: run_ingest(urls, url, cfg, fingerprint=fp, map_fn=map_fn))
    return {**outcome, "funnel": funnel(contract.open_dataset(outcome["url"]))}


@flow(name="ingest")
@fails_in_one_sentence
def ingest_flow(inputs: list[str], root: str = "smelt-data", config: dict | None = None,
                dask_address: str | None = None, output: str | None = None) -> dict:
    """Filter raw crawl files (WARC, WET, JSONL, Parquet; any fsspec URL or glob) into documents."""
    preflight_all(inputs, root, output)
    return ingest_task(inputs, root, config or {}, dask_address, output)


def code_ingest_output(inputs: list[str], root: str, cfg: CodeIngestConfig) -> tuple[list[str], str, str]:
    """(expanded code input URLs, output URL, fingerprint); folders are fingerprinted by their listing."""
    urls = expand_code_inputs(inputs, cfg.reader)
    url, fp = planned_output(root, CODE_STAGE, cfg, code_input_fingerprints(urls, cfg.reader), "tasks.ingest")
    return urls, url, fp


@task(name="ingest-code", cache_policy=NO_CACHE, **retry_options(1))
@one_sentence_failures(CODE_STAGE)
def code_ingest_task(inputs: list[str], root: str, config: dict, dask_address: str | None = None,
                     output: str | None = None) -> dict:
    """Run (or reuse) source-code ingest: files, archives or trees → code documents."""
    cfg = from_dict(CodeIngestConfig, config)
    urls, url, fp = code_ingest_output(inputs, root, cfg)
    url = storage.normalize_url(output) if output else url
    outcome = run_on_dask(CODE_STAGE, url, fp, dask_address,
                          lambda map_fn: run_code_ingest(urls, url, cfg, fingerprint=fp, map_fn=map_fn))
    return {**outcome, "funnel": funnel(contract.open_dataset(outcome["url"]))}


@flow(name="ingest-code")
@fails_in_one_sentence
def code_ingest_flow(inputs: list[str], root: str = "smelt-data", config: dict | None = None,
                     dask_address: str | None = None, output: str | None = None) -> dict:
    """Filter source files (JSONL/Parquet records, tar/zip archives, directory trees) into code documents."""
    preflight_all(inputs, root, output)
    return code_ingest_task(inputs, root, config or {}, dask_address, output)
