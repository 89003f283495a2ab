"""Phase 4, one work item per input shard: the shard minus its dropped rows → ``docs-NNNNN.parquet``
(surviving documents in input order), streamed row group by row group.

Counters: ``in``, ``out``, ``dropped.exact_duplicate`` (an exact copy, after normalisation, of the
document its cluster keeps), ``dropped.near_duplicate`` (any other removed member).
"""

from __future__ import annotations

import numpy as np

from tasks import contract, storage
from tasks.contract import ShardResult
from tasks.counters import Stats
from tasks.documents import DOCUMENT_COLUMNS, document_schema
from tasks.dedup.plan import REASONS, DedupPlan, document_batches
from tasks.dedup.store import read_npy

ROWS_PER_GROUP = 10_000
READ_ROWS = 2_000  # rows decoded at a time: small Arrow buffers are reused, a whole row group's are faulted in anew
DICTIONARY_COLUMNS = ["source", "lang"]  # few distinct values; a dictionary of texts or ids is abandoned anyway
# No min/max statistics for long free text: nothing prunes on them, and they were a quarter of the write.
UNSORTED_COLUMNS = ("text", "meta")


def filter_shard(plan: DedupPlan, shard: int) -> ShardResult:
    """Phase 4 for input shard ``shard``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    url = plan.output_url
    schema = document_schema()
    columns = list(DOCUMENT_COLUMNS)

    def work() -> ShardResult:
        drops = read_npy(storage.join(url, f"_work/clusters/drops-{shard:05d}.npy"))
        seen = 0

        def write(f) -> int:
            nonlocal seen
            kept = 0
            with pq.ParquetWriter(
                f, schema, compression="zstd", use_dictionary=DICTIONARY_COLUMNS,
                write_statistics=[c for c in columns if c not in UNSORTED_COLUMNS],
            ) as writer:
                pending: list = []  # the filtered batches of the output row group being gathered
                gathered = 0  # input rows they came from

                def flush() -> None:
                    nonlocal gathered
                    if pending:
                        writer.write_table(pa.Table.from_batches(pending))
                    pending.clear()
                    gathered = 0

                for batch in document_batches(plan, shard, None, READ_ROWS):
                    missing = [c for c in columns if c not in batch.schema.names]
                    if missing:
                        raise contract.DatasetError(
                            f"{plan.shard_urls[shard]} lacks document columns {missing}; is it a smelt documents shard?"
                        )
                    keep = np.ones(batch.num_rows, dtype=bool)
                    rows = drops["row"].astype(np.int64)
                    keep[rows[(rows >= seen) & (rows < seen + batch.num_rows)] - seen] = False
                    table = pa.Table.from_batches([batch]).select(columns).cast(schema).filter(pa.array(keep))
                    pending.extend(table.to_batches())
                    seen += batch.num_rows
                    gathered += batch.num_rows
                    kept += table.num_rows
                    if gathered >= ROWS_PER_GROUP:  # one output row group per ROWS_PER_GROUP input rows
                        flush()
                flush()
            return kept

        info = contract.write_shard(url, f"docs-{shard:05d}.parquet", write)
        stats = Stats({"in": seen, "out": info.rows})
        for code, reason in REASONS.items():
            stats.add(f"dropped.{reason}", int((drops["reason"] == code).sum()))
        return ShardResult([info], stats)

    return contract.run_shard(url, f"docs-{shard:05d}", work)
