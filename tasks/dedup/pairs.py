"""Phase 2, one work item per shuffle bucket: the bucket's records from every shard → exact edges
and verified near-duplicate edges → ``_work/pairs/edges-BBBBB.npy``.

Memory grows with ``records_per_bucket`` (the plan sizes buckets by it), not with the corpus.
"""

from __future__ import annotations

import numpy as np

from tasks import contract
from tasks.contract import ShardResult
from tasks.counters import Stats
from tasks.dedup.candidates import exact_edges, near_candidates
from tasks.dedup.plan import EDGE, DedupPlan, write_npy
from tasks.dedup.shuffle import RECORD, read_bucket
from tasks.dedup.verify import verify_pairs


def pair_bucket(plan: DedupPlan, bucket: int) -> ShardResult:
    """Phase 2 for shuffle bucket ``bucket``."""
    cfg = plan.cfg
    url = plan.work("pairs")

    def work() -> ShardResult:
        n_shards = len(plan.shard_urls)
        parts = [read_bucket(plan.work("signatures", f"records-{s:05d}.shf"), bucket) for s in range(n_shards)]
        records = np.concatenate(parts) if parts else np.zeros(0, dtype=RECORD)
        exact_a, exact_b = exact_edges(records)
        cand_a, cand_b, cand_band = near_candidates(records, cfg.max_bucket_fanout)
        near_a, near_b, sims, judged = verify_pairs(
            plan.store(), cand_a, cand_b, cand_band,
            bands=plan.bands, rows=plan.rows, threshold=cfg.threshold, mode=cfg.verify,
        )
        edges = np.zeros(len(exact_a) + len(near_a), dtype=EDGE)
        edges["a"] = np.concatenate([exact_a, near_a])
        edges["b"] = np.concatenate([exact_b, near_b])
        edges["similarity"] = np.concatenate([np.ones(len(exact_a)), sims])
        edges["exact"][: len(exact_a)] = 1
        stats = Stats(
            {"dedup.exact_pairs": len(exact_a), "dedup.candidate_pairs": judged, "dedup.verified_pairs": len(near_a)}
        )
        return ShardResult([write_npy(url, f"edges-{bucket:05d}.npy", edges)], stats)

    return contract.run_shard(url, f"bucket-{bucket:05d}", work)
