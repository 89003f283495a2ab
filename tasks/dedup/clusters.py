"""Phase 3, one work item: every edge → clusters (connected components), a survivor per cluster,
per-shard drop lists ``_work/clusters/drops-NNNNN.npy`` and the clusters dataset at
``<output>/clusters``.

Memory grows with the number of documents that have a duplicate, never with the corpus size: only
those documents' ids and quality scores are read, from the shards they live in.
"""

from __future__ import annotations

import functools

import numpy as np

from tasks import contract
from tasks.contract import ShardResult
from tasks.counters import Stats
from tasks.dedup.components import choose_survivors, connected_components, size_bin
from tasks.dedup.plan import DROP, EDGE, EXACT, NEAR, DedupPlan, read_documents, write_npy, write_parquet
from tasks.dedup.store import read_npy
from tasks.dedup.verify import similarity, split_doc


def _shard_ranges(sorted_docs: np.ndarray, n_shards: int) -> list[tuple[int, slice]]:
    """(shard, slice of ``sorted_docs`` in it) for every shard, from sorted document keys."""
    shards, _ = split_doc(sorted_docs)
    bounds = np.searchsorted(shards, np.arange(n_shards + 1))
    return [(shard, slice(bounds[shard], bounds[shard + 1])) for shard in range(n_shards)]


def _document_fields(plan: DedupPlan, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ids, quality scores) of sorted documents, reading only the shards they live in."""
    ids = np.empty(len(nodes), dtype=object)
    quality = np.full(len(nodes), np.nan)
    _, rows = split_doc(nodes)
    for shard, part in _shard_ranges(nodes, len(plan.shard_urls)):
        if part.start == part.stop:
            continue
        table = read_documents(plan, shard, ["id", "quality_score"]).take(rows[part])
        ids[part] = [i if i is not None else "" for i in table.column("id").to_pylist()]
        quality[part] = [np.nan if q is None else q for q in table.column("quality_score").to_pylist()]
    return ids, quality


def _clusters_table(nodes, ids, survivors, dropped, exact, sims):
    """One row per cluster, ordered by the kept document; members listed kept-first."""
    import pyarrow as pa

    order = np.lexsort((nodes, dropped, nodes[survivors]))
    cluster_of = survivors[order]
    starts = np.flatnonzero(np.r_[True, cluster_of[1:] != cluster_of[:-1]])
    offsets = np.r_[starts, len(order)].astype(np.int32)
    return pa.table(
        {
            "cluster": pa.array(np.arange(len(starts), dtype=np.int64)),
            "kept": pa.array(ids[order[starts]].tolist(), pa.string()),
            "size": pa.array(np.diff(offsets)),
            "members": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids[order].tolist(), pa.string())),
            "similarities": pa.ListArray.from_arrays(pa.array(offsets), pa.array(sims[order].astype(np.float32))),
            "exact": pa.ListArray.from_arrays(pa.array(offsets), pa.array(exact[order])),
        }
    )


def _similarity_to_survivor(plan, members, survivors, nodes, ia, ib, edge_similarity) -> np.ndarray:
    """Similarity of each member node to its survivor: a verified edge's own value where the two
    are joined directly (most are), measured only for members joined through others."""
    n = np.uint64(len(nodes))
    lo, hi = np.minimum(members, survivors).astype(np.uint64), np.maximum(members, survivors).astype(np.uint64)
    edge_lo, edge_hi = np.minimum(ia, ib).astype(np.uint64), np.maximum(ia, ib).astype(np.uint64)
    edge_keys = edge_lo * n + edge_hi
    order = np.argsort(edge_keys, kind="stable")
    edge_keys = edge_keys[order]
    wanted = lo * n + hi
    at = np.minimum(np.searchsorted(edge_keys, wanted), max(len(edge_keys) - 1, 0))
    direct = (edge_keys[at] == wanted) if len(edge_keys) else np.zeros(len(wanted), dtype=bool)
    out = np.empty(len(members))
    out[direct] = edge_similarity[order[at[direct]]]
    indirect = ~direct
    out[indirect] = similarity(plan.store(), nodes[members[indirect]], nodes[survivors[indirect]], plan.cfg.verify)
    return out


def cluster_all(plan: DedupPlan, _item: int = 0) -> ShardResult:
    """Phase 3: one work item over all edges (their number grows with duplicates only)."""
    cfg = plan.cfg
    url = plan.output_url

    def work() -> ShardResult:
        parts = [read_npy(plan.work("pairs", f"edges-{b:05d}.npy")) for b in range(plan.num_buckets)]
        edges = np.concatenate(parts) if parts else np.zeros(0, dtype=EDGE)
        nodes = np.unique(np.concatenate([edges["a"], edges["b"]]))
        ia, ib = np.searchsorted(nodes, edges["a"]), np.searchsorted(nodes, edges["b"])
        labels = connected_components(ia, ib, len(nodes))
        is_exact = edges["exact"] == 1
        exact_labels = connected_components(ia[is_exact], ib[is_exact], len(nodes))
        ids, quality = _document_fields(plan, nodes)
        survivors = choose_survivors(labels, quality, ids)
        dropped = survivors != np.arange(len(nodes))
        exact = exact_labels == exact_labels[survivors]
        sims = np.ones(len(nodes))
        near = np.flatnonzero(dropped & ~exact)
        sims[near] = _similarity_to_survivor(plan, near, survivors[near], nodes, ia, ib, edges["similarity"])

        written = []
        _, rows = split_doc(nodes)
        for shard, part in _shard_ranges(nodes, len(plan.shard_urls)):
            mine = np.flatnonzero(dropped[part]) + part.start
            drops = np.zeros(len(mine), dtype=DROP)
            drops["row"] = rows[mine]  # nodes are sorted, so rows are ascending
            drops["reason"] = np.where(exact[mine], EXACT, NEAR)
            written.append(write_npy(url, f"_work/clusters/drops-{shard:05d}.npy", drops))

        stats = Stats()
        if len(nodes):
            table = _clusters_table(nodes, ids, survivors, dropped, exact, sims)
            stats.add("dedup.clusters", table.num_rows)
            for size, count in zip(*np.unique(table.column("size").to_numpy(), return_counts=True)):
                stats.add(f"dedup.cluster_size.{size_bin(int(size))}", int(count))
            for i, lo in enumerate(range(0, table.num_rows, cfg.clusters_per_shard)):
                part = table.slice(lo, cfg.clusters_per_shard)
                written.append(
                    contract.write_shard(
                        url, f"clusters/clusters-{i:05d}.parquet", functools.partial(write_parquet, part)
                    )
                )
        return ShardResult(written, stats)

    return contract.run_shard(url, "clusters", work)
