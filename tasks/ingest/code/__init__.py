"""Source-code ingest: repositories' files → documents with ``source = "code"`` (the code half of the crawl).

``run_code_ingest`` (stage.py) reads JSONL/Parquet records, tar/zip archives and folder trees
(readers.py), tags the programming language (language.py) and applies The Stack/StarCoder-style
rules (rules.py) with thresholds from ``CodeIngestConfig`` (config.py).
"""
