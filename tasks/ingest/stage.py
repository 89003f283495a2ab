"""The ingest stage: raw crawl files → a ``documents`` dataset (DESIGN.md §3).

One work item per input file, fanned out with ``map_fn``; each is idempotent, so a retried stage
or a killed Dask worker redoes only unfinished files. The manifest's stats give the funnel:
records in, documents out of every step, every drop and failure reason, ``docs_out``, ``bytes_in``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping

from tasks import datasets
from tasks.datasets import Manifest, ShardResult, Stats
from tasks.ingest.config import IngestConfig
from tasks.ingest.pipeline import EXCLUDED, build_steps, ingest_work_item, step_names
from tasks.ingest.readers import InputError, expand_inputs
from tasks.parallel import MapFn, serial_map

STAGE = "ingest"
log = logging.getLogger(__name__)


def run_ingest(
    inputs: list[str], output_url: str, cfg: IngestConfig, *, fingerprint: str, map_fn: MapFn = serial_map
) -> Manifest:
    """Ingest ``inputs`` (URLs, globs or folders) into the documents dataset at ``output_url``.

    Returns the committed manifest (``meta.steps`` names the steps in order for ``funnel``). With
    ``output.write_exclusions`` the dropped documents form a second dataset at ``<output>/excluded``.
    """
    output_url = datasets.normalize_url(output_url)
    if (existing := datasets.finished_dataset(output_url, fingerprint)) is not None:
        return existing
    urls = expand_inputs(inputs)
    if not urls:
        raise InputError("no input files given: pass WARC, WET, JSONL or Parquet URLs, globs or folders")
    names = step_names(build_steps(cfg))  # also validates the steps' config (e.g. block lists exist) up front
    work = functools.partial(ingest_work_item, output_url=output_url, cfg=cfg)
    results: list[ShardResult] = map_fn(work, list(enumerate(urls)), label=STAGE)

    _remove_partial_files(output_url)
    stats = sum((r.stats for r in results), Stats())
    manifest = commit_documents(output_url, fingerprint, results, stats, urls, cfg, {"steps": names})
    log.info("ingest: %d files, %d records → %d documents", len(urls), stats.get("read.records", 0),
             stats.get("docs_out", 0))
    return manifest


def _remove_partial_files(output_url: str) -> None:
    """Delete temporary files left by work items that died mid-write (their shards were redone)."""
    fs, path = datasets.filesystem(output_url)
    for pattern in (f"{path}/.tmp-*", f"{path}/{EXCLUDED}/.tmp-*", f"{path}/_done/.tmp-*"):
        for leftover in fs.glob(pattern):
            log.info("removing %s, left by an interrupted work item", leftover)
            fs.rm(leftover)


def commit_documents(output_url: str, fingerprint: str, results: list[ShardResult], stats: Stats,
                     urls: list[str], cfg, meta: dict) -> Manifest:
    """Commit the kept documents, and first (with ``output.write_exclusions``) the dropped ones as a
    dataset of their own at ``<output>/excluded``."""
    kept = [s for r in results for s in r.shards if not s.extra.get("excluded")]
    if cfg.output.write_exclusions:
        excluded = [
            datasets.ShardInfo(s.name.removeprefix(f"{EXCLUDED}/"), s.rows, s.bytes, s.checksum)
            for r in results for s in r.shards if s.extra.get("excluded")
        ]
        datasets.commit(datasets.join(output_url, EXCLUDED), "documents", fingerprint, excluded,
                        {"docs_out": sum(s.rows for s in excluded)}, inputs=urls, config=cfg,
                        meta={**meta, "excluded_from": output_url})
    return datasets.commit(output_url, "documents", fingerprint, kept, stats, inputs=urls, config=cfg, meta=meta)


def funnel(manifest: Manifest | Mapping) -> list[tuple[str, int]]:
    """Rows for display: records in, then each step's documents out followed by its drop reasons
    (largest first), then ``docs_out``. A reason row is named ``dropped.<reason>`` or ``failed.<reason>``.
    """
    stats = manifest.stats if isinstance(manifest, Manifest) else manifest
    steps = manifest.meta.get("steps") if isinstance(manifest, Manifest) else None
    if not steps:  # stats alone: the steps in the order their counters appear
        steps = list(dict.fromkeys(k.split(".")[1] for k in stats if k.startswith("funnel.")))
    rows = [("read.records", int(stats.get("read.records", 0)))]
    for step in steps:
        prefix = f"funnel.{step}."
        rows.append((step, int(stats.get(prefix + "out", 0))))
        reasons = [(k[len(prefix):], int(v)) for k, v in stats.items() if k.startswith(prefix) and k != prefix + "out"]
        rows.extend(sorted(reasons, key=lambda kv: (-kv[1], kv[0])))
    rows.append(("docs_out", int(stats.get("docs_out", 0))))
    return rows

