"""Dedup stage: exact (normalised-text hash) and near-duplicate (MinHash LSH) removal.

Entry points: ``stage.run_dedup`` (the stage), ``inputs.load_dedup_inputs`` (datasets or raw
JSONL/Parquet files in), ``config.DedupConfig`` (every threshold and size).

Phases, one module each, wired by stage.py over the plan (plan.py): signatures (normalise, exact
key, shingle hashes, MinHash signatures, shuffle records) → pairs (per shuffle bucket: exact edges,
verified near-duplicate candidates) → clusters (connected components, survivors, drop lists) →
removal (each input shard minus its drops). What they use: normalize (words, as bytes and NumPy
ranges), exact (128-bit key), minhash (vectorised shingle hashes, signatures equal to
datasketch's), lsh (bands × rows, band keys), shuffle (hash-partitioned files), candidates (pairs
per bucket), verify (exact or estimated Jaccard), components (union-find, survivors), store
(per-shard arrays read by row).

At 10⁹ documents (~300 words each, 128 permutations, 18 bands, the defaults):
- signatures: 512 B per document on disk, 512 GB in all, written and read per shard;
- shingle hashes for exact-Jaccard verification: 4 B per shingle, ~1.2 KB per document, kept
  as computed (verification counts distinct values; ``verify = "signature"`` skips them and
  estimates instead);
- shuffle records: 19 × 26 B per document, ~500 GB, grouped in buckets of
  ``records_per_bucket`` (2 M records ≈ 50 MB of memory each → ~9,500 bucket work items;
  raise it to cut the number of range reads on object stores: each bucket reads one range
  from every input shard's file);
- clusters: one work item holding every duplicate edge (21 B) and member (~100 B with its id)
  in memory — at a 30% duplicate rate about 40 GB, the one step that needs a large machine;
- every other step holds one shard or one bucket at a time.
"""
