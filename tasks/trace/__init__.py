"""``smelt trace``: from any training step back to the documents it was cut from (issue 42).

Reads a run folder (``metrics.jsonl``, ``events.jsonl``, ``skipped.jsonl``, ``lineage.json``,
``sample_losses/``) and the tokens datasets it trained on (their ``.docs.parquet`` lineage shards), and
through them the documents datasets; nothing else, so it works on any fsspec URL. Imports no torch.
"""
