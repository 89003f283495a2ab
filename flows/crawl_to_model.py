"""The end-to-end flow: sample or crawl → ingest → dedup → tokenize → train → eval.

Every stage lands at ``<root>/<stage>/<fingerprint>/``; a rerun with the same inputs and config
reuses each finished stage in seconds, and a run killed during training resumes from its newest
committed checkpoint without touching the data stages.
"""

from __future__ import annotations

import contextlib
import time

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows.config import load_run_config, section
from flows.dask_runtime import dask_cluster
from flows.dedup import dedup_output, dedup_task
from flows.evaluate import eval_task
from flows.ingest import ingest_output, ingest_task
from flows.tokenize import tokenize_task, tokenizer_output, tokenizer_task, tokens_output
from flows.train import train_task
from tasks import datasets

SAMPLE_DIR = "sample"


@task(name="sample-crawl", cache_policy=NO_CACHE)
def sample_task(root: str) -> list[str]:
    """The bundled sample crawl under ``<root>/sample``, generated (deterministically) if missing."""
    from tasks.sample.crawl import write_sample_crawl

    url = datasets.join(datasets.normalize_url(root), SAMPLE_DIR)
    fs, path = datasets.filesystem(datasets.join(url, "ground_truth.jsonl"))
    if not fs.exists(path):
        get_run_logger().info(f"writing the sample crawl to {url}")
        write_sample_crawl(url)
    return [datasets.join(url, "*.warc.gz")]


def data_stages_pending(inputs: list[str], root: str, cfg) -> bool:
    """True if any data stage still has to run: only then is a Dask cluster worth starting."""
    _, ingest_url, ingest_fp = ingest_output(inputs, root, cfg.ingest)
    dedup_url, dedup_fp = dedup_output([ingest_fp], root, cfg.dedup)
    tok_url, tok_fp = tokenizer_output([dedup_fp], root, cfg.tokenize)
    tokens_url, _ = tokens_output([dedup_fp], tok_fp, root, cfg.tokenize)
    return any(datasets.read_manifest(u) is None for u in (ingest_url, dedup_url, tok_url, tokens_url))


@flow(name="crawl-to-model")
def crawl_to_model(inputs: list[str] | None = None, root: str = "smelt-data", config_path: str | None = None,
                   overrides: list[str] | None = None, dask_address: str | None = None) -> dict:
    """Run every stage in order and return the run summary (stage outcomes, loss, perplexity)."""
    start = time.perf_counter()
    cfg = load_run_config(config_path, overrides or [])
    root = datasets.normalize_url(root)
    inputs = inputs or sample_task(root)

    with contextlib.ExitStack() as stack:
        if dask_address is None and data_stages_pending(inputs, root, cfg):
            dask_address = stack.enter_context(dask_cluster())
        ingest = ingest_task(inputs, root, section(cfg, "ingest"), dask_address)
        dedup = dedup_task([ingest["url"]], root, section(cfg, "dedup"), dask_address)
        tokenizer = tokenizer_task([dedup["url"]], root, section(cfg, "tokenize"))
        tokens = tokenize_task([dedup["url"]], tokenizer["url"], root, section(cfg, "tokenize"), dask_address)

    launch = section(cfg, "launch")
    train = train_task.with_options(retries=cfg.launch.task_retries, retry_delay_seconds=5)(
        [tokens["url"]], root, section(cfg, "train"), launch)
    evaluation = eval_task(train["checkpoint"], tokens["url"], root, section(cfg, "eval"))

    summary = {
        "root": root,
        "stages": [ingest, dedup, tokenizer, tokens, train, evaluation],
        "wall_seconds": round(time.perf_counter() - start, 1),
    }
    create_table_artifact(
        key="smelt-run-summary",
        table=[{"stage": s["stage"], "reused": s["reused"], "rows": s["rows"], "seconds": s["seconds"], "url": s["url"]}
               for s in summary["stages"]],
        description=f"crawl-to-model run under {root}",
    )
    return summary
