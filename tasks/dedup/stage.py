"""The dedup stage: exact and near-duplicate removal over documents datasets (DESIGN.md §3).

Four phases, each a map over work items with ``map_fn``; every item is idempotent through
``datasets.run_shard`` (files written atomically, marker last), so a killed worker's item is
redone byte-identically. Intermediate files live under ``<output>/_work/<phase>/``:

1. ``signatures`` (one item per input shard): normalise, exact key, shingle hashes, MinHash
   signatures → ``sigs-NNNNN.npy``; shingle sets (for ``verify = "jaccard"``) →
   ``shingles-NNNNN``; exact and band-key records → ``records-NNNNN.shf`` (shuffle.py).
2. ``pairs`` (one item per shuffle bucket): the bucket's records from every shard → exact edges
   and verified near-duplicate edges → ``edges-BBBBB.npy``.
3. ``clusters`` (one item): union-find over all edges, a survivor per cluster → per-shard drop
   lists ``_work/clusters/drops-NNNNN.npy`` and the clusters dataset at ``<output>/clusters``.
4. filter (one item per input shard): the input shard minus its drops → ``docs-NNNNN.parquet``
   (surviving documents in input order).

Memory: phase 1 grows with the shard, phase 2 with ``records_per_bucket``, phase 3 with the
number of documents that have a duplicate — never with the corpus size.

Counters: ``docs_in``, ``docs_out``, ``dropped.dedup_exact`` (an exact copy, after
normalisation, of the document its cluster keeps), ``dropped.dedup_near`` (any other removed
member), ``dedup.clusters``, ``dedup.cluster_size.<bin>``, ``dedup.exact_pairs``,
``dedup.candidate_pairs`` (distinct pairs sharing a band), ``dedup.verified_pairs``,
``dedup.no_shingles`` (empty after normalisation: kept, never compared),
``dedup.null_text`` (text missing: treated as empty).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Callable, Sequence
from typing import IO

import numpy as np

from tasks import datasets
from tasks.datasets import Manifest, ShardInfo, ShardResult, Stats
from tasks.dedup.candidates import exact_edges, near_candidates
from tasks.dedup.cluster import choose_survivors, connected_components, size_bin
from tasks.dedup.config import DedupConfig
from tasks.dedup.exact import exact_keys
from tasks.dedup.lsh import band_keys, candidate_probability, choose_bands
from tasks.dedup.minhash import MinHasher, shard_shingle_hashes
from tasks.dedup.normalize import normalized_words
from tasks.dedup.shuffle import EXACT_BAND, RECORD, read_bucket, write_partitioned
from tasks.dedup.store import npy_bytes, read_npy
from tasks.dedup.verify import SignatureStore, doc_key, similarity, split_doc, verify_pairs
from tasks.parallel import MapFn, serial_map

STAGE = "dedup"
log = logging.getLogger(__name__)

EDGE = np.dtype([("a", "<u8"), ("b", "<u8"), ("similarity", "<f4"), ("exact", "u1")])
DROP = np.dtype([("row", "<u4"), ("reason", "u1")])
REASONS = {1: "dedup_exact", 2: "dedup_near"}
EXACT, NEAR = 1, 2


@dataclasses.dataclass(frozen=True)
class DedupPlan:
    """Everything a work item needs, as plain values (pickles to Dask workers)."""

    output_url: str
    shard_urls: tuple[str, ...]
    cfg: DedupConfig
    bands: int
    rows: int
    num_buckets: int
    shards: tuple[ShardInfo, ...] = ()  # the manifest entries of shard_urls: every read is verified

    @property
    def work_root(self) -> str:
        return datasets.join(self.output_url, "_work")

    def work(self, phase: str, name: str = "") -> str:
        return datasets.join(self.work_root, phase, name) if name else datasets.join(self.work_root, phase)

    def store(self) -> SignatureStore:
        n = len(self.shard_urls)
        shingles = [self.work("signatures", f"shingles-{s:05d}") for s in range(n)]
        return SignatureStore(
            [self.work("signatures", f"sigs-{s:05d}.npy") for s in range(n)],
            shingles if self.cfg.verify == "jaccard" else None,
        )


def make_plan(inputs: Sequence[Manifest], output_url: str, cfg: DedupConfig) -> DedupPlan:
    """Choose bands, rows and bucket count; list the input shards in a fixed global order."""
    shards = [(m, s) for m in inputs for s in m.shards]
    if len(shards) >= 1 << 31:
        raise ValueError(f"dedup supports fewer than 2^31 input shards, got {len(shards)}; merge shards first")
    if any(s.rows >= 1 << 32 for _, s in shards):
        raise ValueError("an input shard has 2^32 rows or more; split it into smaller shards")
    if cfg.bands:
        bands, rows = cfg.bands, cfg.rows
    else:
        bands, rows = choose_bands(
            cfg.threshold, cfg.num_perm, cfg.false_positive_weight, cfg.false_negative_weight, cfg.max_miss_at_threshold
        )
    total_records = sum(s.rows for _, s in shards) * (bands + 1)
    num_buckets = cfg.num_buckets or max(1, math.ceil(total_records / cfg.records_per_bucket))
    return DedupPlan(
        output_url=datasets.normalize_url(output_url),
        shard_urls=tuple(datasets.shard_url(m, s) for m, s in shards),
        cfg=cfg,
        bands=bands,
        rows=rows,
        num_buckets=num_buckets,
        shards=tuple(s for _, s in shards),
    )


# --------------------------------------------------------------------------------------------
# I/O helpers


def read_table(plan: DedupPlan, shard: int, columns: list[str] | None = None):
    """Input shard ``shard`` as a table, verified against its manifest (a corrupt shard is an error)."""
    return datasets.read_parquet(plan.shard_urls[shard], plan.shards[shard], columns)


def write_parquet(table, f: IO[bytes]) -> int:
    import pyarrow.parquet as pq

    pq.write_table(table, f, compression="zstd")
    return table.num_rows


def _write_npy(dataset_url: str, name: str, array: np.ndarray) -> ShardInfo:
    def write(f: IO[bytes]) -> int:
        f.write(npy_bytes(array))
        return len(array)

    return datasets.write_shard(dataset_url, name, write)


# --------------------------------------------------------------------------------------------
# Phase 1: signatures, shingle sets and shuffle records of one input shard


def _unique_sets(hashes: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per document, its shingle hashes sorted and without repeats; returns (values, counts)."""
    n_docs = len(offsets) - 1
    doc = np.repeat(np.arange(n_docs, dtype=np.uint64), np.diff(offsets))
    if hashes.dtype == np.uint32:  # one sort of (doc, hash) packed in 64 bits beats a lexsort 4×
        packed = np.sort((doc << np.uint64(32)) | hashes.astype(np.uint64))
        values, doc = (packed & np.uint64(0xFFFFFFFF)).astype(np.uint32), packed >> np.uint64(32)
    else:
        order = np.lexsort((hashes, doc))
        values, doc = hashes[order], doc[order]
    keep = np.ones(len(values), dtype=bool)
    keep[1:] = (values[1:] != values[:-1]) | (doc[1:] != doc[:-1])
    return values[keep], np.bincount(doc[keep].astype(np.int64), minlength=n_docs)


@dataclasses.dataclass
class ShardHashes:
    """What phase 1 computes for one shard's texts."""

    signatures: np.ndarray  # (D, P)
    exact: np.ndarray  # (D, 2) uint64 exact keys
    has_shingles: np.ndarray  # (D,) bool
    set_values: np.ndarray  # concatenated distinct shingle hashes (verify = "jaccard" only)
    set_offsets: np.ndarray  # (D + 1,)


def hash_texts(texts: list[str | None], cfg: DedupConfig) -> ShardHashes:
    """Normalise, key, shingle and sign texts, ``cfg.text_batch`` documents at a time."""
    hasher = MinHasher(cfg.num_perm, cfg.seed, cfg.scheme, cfg.signature_batch)
    hash_dtype = np.uint32 if hasher.bits == 32 else np.uint64
    # Each list starts with an empty array so a shard without documents concatenates cleanly.
    signatures = [np.zeros((0, cfg.num_perm), hasher.dtype)]
    exact = [np.zeros((0, 2), np.uint64)]
    counts, set_counts = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    set_values = [np.zeros(0, hash_dtype)]
    for lo in range(0, len(texts), cfg.text_batch):
        words = [normalized_words(t or "") for t in texts[lo : lo + cfg.text_batch]]
        exact.append(exact_keys([" ".join(w) for w in words]))
        hashes, offsets = shard_shingle_hashes(words, cfg.ngram, hasher.bits)
        signatures.append(hasher.signatures(hashes, offsets))
        counts.append(np.diff(offsets))
        if cfg.verify == "jaccard":
            values, per_doc = _unique_sets(hashes, offsets)
            set_values.append(values)
            set_counts.append(per_doc)
    set_offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    if cfg.verify == "jaccard":
        np.cumsum(np.concatenate(set_counts), out=set_offsets[1:])
    return ShardHashes(np.concatenate(signatures), np.concatenate(exact), np.concatenate(counts) > 0,
                       np.concatenate(set_values), set_offsets)


def shuffle_records(shard: int, hashed: ShardHashes, bands: int, rows_per_band: int) -> np.ndarray:
    """One exact record and one record per band for every document that has shingles."""
    rows = np.flatnonzero(hashed.has_shingles)
    docs = doc_key(shard, rows)
    exact = hashed.exact[rows]
    keys = band_keys(hashed.signatures[rows], bands, rows_per_band)  # (docs, bands)
    records = np.zeros(len(rows) * (bands + 1), dtype=RECORD)
    exact_part, band_part = records[: len(rows)], records[len(rows) :]
    exact_part["key"], exact_part["tag"] = exact[:, 0], exact[:, 1]
    exact_part["doc"], exact_part["band"] = docs, EXACT_BAND
    band_part["key"] = keys.ravel()
    band_part["tag"] = np.repeat(exact[:, 0], bands)
    band_part["doc"] = np.repeat(docs, bands)
    band_part["band"] = np.tile(np.arange(bands, dtype=np.uint16), len(rows))
    return records


def sign_shard(plan: DedupPlan, shard: int) -> ShardResult:
    """Phase 1 for input shard ``shard``."""
    url = plan.work("signatures")

    def work() -> ShardResult:
        texts = read_table(plan, shard, ["text"]).column("text").to_pylist()
        hashed = hash_texts(texts, plan.cfg)
        records = shuffle_records(shard, hashed, plan.bands, plan.rows)
        written = [
            _write_npy(url, f"sigs-{shard:05d}.npy", hashed.signatures),
            datasets.write_shard(
                url, f"records-{shard:05d}.shf", lambda f: write_partitioned(f, records, plan.num_buckets)
            ),
        ]
        if plan.cfg.verify == "jaccard":
            written.append(_write_npy(url, f"shingles-{shard:05d}.npy", hashed.set_values))
            written.append(_write_npy(url, f"shingles-{shard:05d}.offsets.npy", hashed.set_offsets))
        stats = Stats({
            "dedup.null_text": sum(t is None for t in texts),
            "dedup.no_shingles": int(len(texts) - hashed.has_shingles.sum()),
        })
        return ShardResult(written, stats)

    return datasets.run_shard(url, f"shard-{shard:05d}", work)


# --------------------------------------------------------------------------------------------
# Phase 2: exact edges and verified near-duplicate edges of one shuffle bucket


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
        return ShardResult([_write_npy(url, f"edges-{bucket:05d}.npy", edges)], stats)

    return datasets.run_shard(url, f"bucket-{bucket:05d}", work)


# --------------------------------------------------------------------------------------------
# Phase 3: clusters, survivors, drop lists and the clusters dataset


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
        table = read_table(plan, shard, ["id", "quality_score"]).take(rows[part])
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
        near = dropped & ~exact
        sims[near] = similarity(plan.store(), nodes[near], nodes[survivors[near]], cfg.verify)

        written = []
        _, rows = split_doc(nodes)
        for shard, part in _shard_ranges(nodes, len(plan.shard_urls)):
            mine = np.flatnonzero(dropped[part]) + part.start
            drops = np.zeros(len(mine), dtype=DROP)
            drops["row"] = rows[mine]  # nodes are sorted, so rows are ascending
            drops["reason"] = np.where(exact[mine], EXACT, NEAR)
            written.append(_write_npy(url, f"_work/clusters/drops-{shard:05d}.npy", drops))

        stats = Stats()
        if len(nodes):
            table = _clusters_table(nodes, ids, survivors, dropped, exact, sims)
            stats.add("dedup.clusters", table.num_rows)
            for size, count in zip(*np.unique(table.column("size").to_numpy(), return_counts=True)):
                stats.add(f"dedup.cluster_size.{size_bin(int(size))}", int(count))
            for i, lo in enumerate(range(0, table.num_rows, cfg.clusters_per_shard)):
                part = table.slice(lo, cfg.clusters_per_shard)
                written.append(
                    datasets.write_shard(
                        url, f"clusters/clusters-{i:05d}.parquet", functools.partial(write_parquet, part)
                    )
                )
        return ShardResult(written, stats)

    return datasets.run_shard(url, "clusters", work)


# --------------------------------------------------------------------------------------------
# Phase 4: write each input shard minus its dropped rows


def filter_shard(plan: DedupPlan, shard: int) -> ShardResult:
    """Phase 4 for input shard ``shard``: ``docs-NNNNN.parquet`` keeps input order."""
    import pyarrow as pa

    url = plan.output_url

    def work() -> ShardResult:
        table = read_table(plan, shard)
        missing = [c for c in datasets.DOCUMENT_COLUMNS if c not in table.column_names]
        if missing:
            raise datasets.DatasetError(
                f"{plan.shard_urls[shard]} lacks document columns {missing}; is it a smelt documents shard?"
            )
        drops = read_npy(datasets.join(url, f"_work/clusters/drops-{shard:05d}.npy"))
        keep = np.ones(table.num_rows, dtype=bool)
        keep[drops["row"]] = False
        kept = table.select(list(datasets.DOCUMENT_COLUMNS)).cast(datasets.document_schema()).filter(pa.array(keep))
        stats = Stats({"docs_in": table.num_rows, "docs_out": kept.num_rows})
        for code, reason in REASONS.items():
            stats.add(f"dropped.{reason}", int((drops["reason"] == code).sum()))
        info = datasets.write_shard(url, f"docs-{shard:05d}.parquet", functools.partial(write_parquet, kept))
        return ShardResult([info], stats)

    return datasets.run_shard(url, f"docs-{shard:05d}", work)


# --------------------------------------------------------------------------------------------
# The stage


def client_map(client) -> MapFn:
    """A ``MapFn`` over a ``distributed.Client``; Dask reruns items whose worker died."""

    def map_fn(fn: Callable, items: Sequence, *, label: str = "") -> list:
        futures = client.map(fn, list(items), pure=False, retries=2)
        return client.gather(futures)

    return map_fn


def run_dedup(
    inputs: list[Manifest],
    output_url: str,
    cfg: DedupConfig,
    *,
    fingerprint: str,
    map_fn: MapFn = serial_map,
    dask_client=None,
) -> Manifest:
    """Deduplicate documents datasets into one documents dataset at ``output_url``.

    Writes one ``docs-NNNNN.parquet`` per input shard (global order over ``inputs``) and a
    clusters dataset (kind ``clusters``: cluster, kept, size, members, similarities to the kept
    document, exact flags) at ``<output_url>/clusters``. With ``dask_client`` the work items
    run on that cluster instead of through ``map_fn``.
    """
    if dask_client is not None:
        map_fn = client_map(dask_client)
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
    clusters_url = datasets.join(plan.output_url, "clusters")
    cluster_shards = [
        dataclasses.replace(s, name=s.name.removeprefix("clusters/"))
        for s in clustered.shards
        if s.name.startswith("clusters/")
    ]
    datasets.commit(
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
    manifest = datasets.commit(
        plan.output_url, "documents", fingerprint, shards, stats, inputs=list(inputs), config=cfg, meta=meta
    )
    if not cfg.keep_work:
        fs, path = datasets.filesystem(plan.work_root)
        if fs.exists(path):
            fs.rm(path, recursive=True)
    log.info("dedup: %d → %d documents (%d exact, %d near duplicates removed)", stats.get("docs_in", 0),
             stats.get("docs_out", 0), stats.get("dropped.dedup_exact", 0), stats.get("dropped.dedup_near", 0))
    return manifest
