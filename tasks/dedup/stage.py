"""The dedup stage: exact and near-duplicate removal over documents datasets (docs/design.md §3).

Wiring only: four phases, each a map over work items with ``map_fn`` and each a module of its own;
every item is idempotent through ``contract.run_shard`` (files written atomically, marker last),
so a killed worker's item is redone byte-identically.

1. ``signatures`` (one item per input shard) — signatures.py
2. ``pairs`` (one item per shuffle bucket) — pairs.py
3. ``clusters`` (one item) — clusters.py
4. filter (one item per input shard) — removal.py

Memory: phase 1 grows with the shard's signatures, phase 2 with ``records_per_bucket``, phase 3
with the number of documents that have a duplicate — never with the corpus size.

Counters: ``in``, ``out``, ``dropped.exact_duplicate``, ``dropped.near_duplicate`` (removal.py);
diagnostics ``dedup.clusters``, ``dedup.cluster_size.<bin>``, ``dedup.exact_pairs``,
``dedup.candidate_pairs`` (distinct pairs sharing a band), ``dedup.verified_pairs``,
``dedup.no_shingles`` (empty after normalisation: kept, never compared), ``dedup.null_text``
(text missing: treated as empty).
"""

from __future__ import annotations

import dataclasses
import functools
import logging

from tasks import contract, storage
from tasks.contract import Manifest
from tasks.counters import Stats
from tasks.dedup.clusters import cluster_all
from tasks.dedup.config import DedupConfig
from tasks.dedup.lsh import candidate_probability
from tasks.dedup.pairs import pair_bucket
from tasks.dedup.plan import make_plan
from tasks.dedup.removal import filter_shard
from tasks.dedup.signatures import sign_shard
from tasks.parallel import MapFn, serial_map

STAGE = "dedup"
log = logging.getLogger(__name__)


def run_dedup(
    inputs: list[Manifest], output_url: str, cfg: DedupConfig, *, fingerprint: str, map_fn: MapFn = serial_map
) -> Manifest:
    """Deduplicate documents datasets into one documents dataset at ``output_url``.

    Writes one ``docs-NNNNN.parquet`` per input shard (global order over ``inputs``) and a
    clusters dataset (kind ``clusters``: cluster, kept, size, members, similarities to the kept
    document, exact flags) at ``<output_url>/clusters``.
    """
    plan = make_plan(inputs, output_url, cfg)
    n_shards = len(plan.shard_urls)
    log.info(
        "dedup: %d shards, threshold %.2f, %d bands × %d rows (P(candidate | threshold) = %.4f), %d buckets",
        n_shards, cfg.threshold, plan.bands, plan.rows,
        candidate_probability(cfg.threshold, plan.bands, plan.rows), plan.num_buckets,
    )
    signed = map_fn(functools.partial(sign_shard, plan), list(range(n_shards)), label="dedup-signatures")
    paired = map_fn(functools.partial(pair_bucket, plan), list(range(plan.num_buckets)), label="dedup-pairs")
    (clustered,) = map_fn(functools.partial(cluster_all, plan), [0], label="dedup-clusters")
    filtered = map_fn(functools.partial(filter_shard, plan), list(range(n_shards)), label="dedup-filter")

    stats = sum((r.stats for r in [*signed, *paired, clustered, *filtered]), Stats())
    clusters_url = storage.join(plan.output_url, "clusters")
    cluster_shards = [
        dataclasses.replace(s, name=s.name.removeprefix("clusters/"))
        for s in clustered.shards
        if s.name.startswith("clusters/")
    ]
    contract.commit(
        clusters_url, "clusters", fingerprint, cluster_shards, clustered.stats, inputs=list(inputs), config=cfg
    )
    meta = {
        "bands": plan.bands,
        "rows": plan.rows,
        "num_buckets": plan.num_buckets,
        "candidate_probability_at_threshold": float(candidate_probability(cfg.threshold, plan.bands, plan.rows)),
        "clusters_url": clusters_url,
    }
    shards = [s for r in filtered for s in r.shards]
    manifest = contract.commit(
        plan.output_url, "documents", fingerprint, shards, stats, inputs=list(inputs), config=cfg, meta=meta
    )
    if not cfg.keep_work:
        fs, path = storage.filesystem(plan.work_root)
        if fs.exists(path):
            fs.rm(path, recursive=True)
    log.info("dedup: %d → %d documents (%d exact, %d near duplicates removed)", stats.get("in", 0),
             stats.get("out", 0), stats.get("dropped.exact_duplicate", 0), stats.get("dropped.near_duplicate", 0))
    return manifest
