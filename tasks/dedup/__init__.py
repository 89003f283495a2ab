"""Dedup stage: exact (normalised-text hash) and near-duplicate (MinHash LSH) removal.

Entry points: ``stage.run_dedup`` (the stage), ``inputs.load_dedup_inputs`` (datasets or raw
JSONL/Parquet files in), ``config.DedupConfig`` (every threshold and size).
"""
