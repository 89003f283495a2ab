"""The ingest stage: raw crawl files → a ``documents`` dataset (docs/design.md §3); and what code ingest shares.

One work item per input file, fanned out with ``map_fn``; each is idempotent, so a retried stage
or a killed Dask worker redoes only unfinished files. The manifest's stats give the funnel
(``tasks.counters.funnel``): ``in`` (records read), what every step let through and why it dropped
the rest (``funnel.<step>.``), ``out`` (documents written), ``funnel.read.bytes_in``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence

from tasks import contract, storage
from tasks.contract import Manifest, ShardInfo, ShardResult
from tasks.counters import Stats
from tasks.ingest.config import IngestConfig
from tasks.ingest.work_item import EXCLUDED, build_steps, step_names, web_item
from tasks.ingest.readers import InputError
from tasks.parallel import MapFn, serial_map

STAGE = "ingest"
log = logging.getLogger(__name__)


def run_ingest(
    urls: list[str], output_url: str, cfg: IngestConfig, *, fingerprint: str, map_fn: MapFn = serial_map
) -> Manifest:
    """Ingest the input files ``urls`` (as ``readers.expand_inputs`` lists them: the caller has
    expanded them once, to fingerprint them) into the documents dataset at ``output_url``.

    Returns the committed manifest (``meta.steps`` names the steps in order for the funnel). With
    ``output.write_exclusions`` the dropped documents form a second dataset at ``<output>/excluded``.
    """
    output_url = storage.normalize_url(output_url)
    if (existing := contract.finished_dataset(output_url, fingerprint)) is not None:
        return existing
    if not urls:
        raise InputError("no input files given: pass WARC, WET, JSONL or Parquet URLs, globs or folders")
    names = step_names(build_steps(cfg))  # also validates the steps' config (e.g. block lists exist) up front
    work = functools.partial(web_item, output_url=output_url, cfg=cfg)
    return run_work_items(STAGE, urls, work, output_url, fingerprint, urls, cfg, {"steps": names}, map_fn=map_fn)


def run_work_items(label: str, items: Sequence, work: Callable[[tuple[int, object]], ShardResult], output_url: str,
                   fingerprint: str, urls: list[str], cfg, meta: dict, *, stats: Stats | None = None,
                   map_fn: MapFn = serial_map) -> Manifest:
    """Run ``work`` over ``(index, item)`` pairs and commit the documents they wrote (web and code
    ingest alike); ``stats`` holds counters of the planning, added to the shards' own."""
    results: list[ShardResult] = map_fn(work, list(enumerate(items)), label=label)
    _remove_partial_files(output_url)
    total = sum((r.stats for r in results), stats or Stats())
    manifest = _commit_documents(output_url, fingerprint, results, total, urls, cfg, meta)
    log.info("%s: %d work items, %d records → %d documents", label, len(items), total.get("in", 0), total.get("out", 0))
    return manifest


def _remove_partial_files(output_url: str) -> None:
    """Delete temporary files left by work items that died mid-write (their shards were redone)."""
    fs, path = storage.filesystem(output_url)
    for pattern in (f"{path}/.tmp-*", f"{path}/{EXCLUDED}/.tmp-*", f"{path}/_done/.tmp-*"):
        for leftover in fs.glob(pattern):
            log.info("removing %s, left by an interrupted work item", leftover)
            fs.rm(leftover)


def _commit_documents(output_url: str, fingerprint: str, results: list[ShardResult], stats: Stats,
                      urls: list[str], cfg, meta: dict) -> Manifest:
    """Commit the kept documents, and first (with ``output.write_exclusions``) the dropped ones as a
    dataset of their own at ``<output>/excluded``."""
    kept = [s for r in results for s in r.shards if not s.extra.get("excluded")]
    if cfg.output.write_exclusions:
        excluded = [
            ShardInfo(s.name.removeprefix(f"{EXCLUDED}/"), s.rows, s.bytes, s.checksum)
            for r in results for s in r.shards if s.extra.get("excluded")
        ]
        contract.commit(storage.join(output_url, EXCLUDED), "documents", fingerprint, excluded,
                        {"out": sum(s.rows for s in excluded)}, inputs=urls, config=cfg,
                        meta={**meta, "excluded_from": output_url})
    return contract.commit(output_url, "documents", fingerprint, kept, stats, inputs=urls, config=cfg, meta=meta)
