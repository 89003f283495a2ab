"""Raw record files (JSON lines, Parquet) read as records, every line or row accounted for.

The one home for reading them, so every stage that takes raw files counts their faults alike: the
ingest and code readers, and dedup's raw inputs. Counter names take the caller's ``prefix``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from typing import IO, Any

import fsspec

from tasks.compression import READ_CHUNK, UNVERIFIED_HOLD_CHARS, CorruptData, is_compressed, open_input
from tasks.datasets import Stats, remote_options

log = logging.getLogger(__name__)


def read_json_lines(url: str, max_line_bytes: int, stats: Stats, *, prefix: str,
                    truncated: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) of each line of a JSONL file (plain, .gz or .zst), streamed.

    Counts ``in``; skips an oversize line (``dropped.<prefix>_too_large``), undecodable
    bytes (``dropped.<prefix>_undecodable``) and malformed JSON (``failed.<prefix>_bad_record``). A
    truncated stream ends the file (``failed.<truncated>``) keeping every line read before it. Lines
    of a compressed file are held (up to ``UNVERIFIED_HOLD_CHARS`` bytes) until the data they came
    from has passed its checksum, which for a one-member gzip is at its end: corrupt data ends the
    file (``failed.<prefix>_corrupt_file``) and the held lines count
    ``failed.<prefix>_unverified_record``.
    """
    held: list[tuple[int, bytes | None]] = []
    held_bytes = line_no = 0
    hold_limit = UNVERIFIED_HOLD_CHARS + max_line_bytes if is_compressed(url) else 0
    with open_input(url) as f:
        try:
            for line_no, line in enumerate(_bounded_lines(f, max_line_bytes)):
                if line is not None and not line.strip():
                    continue
                held.append((line_no, line))
                held_bytes += len(line or b"") + 100  # and the tuple, about 100 bytes
                if held_bytes > hold_limit:
                    yield from _parsed_lines(held, stats, prefix)
                    held_bytes = 0
        except EOFError:  # the cut line is a record seen: ``in`` still adds up
            stats.add("in")
            stats.add(f"failed.{truncated}")
            log.warning("%s: file is truncated after line %d", url, line_no)
        except CorruptData as e:
            stats.add("in", 1 + len(held))
            stats.add(f"failed.{prefix}_corrupt_file")
            stats.add(f"failed.{prefix}_unverified_record", len(held))
            log.warning("%s: corrupt compressed data after line %d, %d lines before it dropped: %s",
                        url, line_no, len(held), e)
            held.clear()
    yield from _parsed_lines(held, stats, prefix)


def _parsed_lines(held: list[tuple[int, bytes | None]], stats: Stats, prefix: str) -> Iterator[tuple[int, Any]]:
    """The held lines parsed and counted, in order; ``held`` is emptied."""
    for line_no, line in held:
        stats.add("in")
        if line is None:
            stats.add(f"dropped.{prefix}_too_large")
            continue
        try:
            record = json.loads(line)
        except UnicodeDecodeError:
            stats.add(f"dropped.{prefix}_undecodable")
            continue
        except json.JSONDecodeError:
            stats.add(f"failed.{prefix}_bad_record")
            continue
        yield line_no, record
    held.clear()


def _bounded_lines(f: IO[bytes], max_bytes: int) -> Iterator[bytes | None]:
    """Lines of ``f``; a line longer than ``max_bytes`` is skipped unread and yields None."""
    while line := f.readline(max_bytes + 1):
        if len(line) > max_bytes and not line.endswith(b"\n"):
            while (rest := f.readline(READ_CHUNK)) and not rest.endswith(b"\n"):
                pass
            yield None
        else:
            yield line


def read_parquet_rows(url: str, required: str, columns: Sequence[str], stats: Stats, *, prefix: str,
                      batch_size: int) -> Iterator[tuple[int, dict]]:
    """(row number, record) of a Parquet file, streamed by batches of the wanted ``columns``.

    Counts ``in``. An unreadable file, a file without the ``required`` column, or corrupt
    data part-way (which ends the file, keeping the rows before it) count as ``failed.<prefix>_corrupt_file``.
    Page CRCs are checked where the writer stored them (pyarrow's ``write_page_checksum``); a file
    without them (pyarrow's default) cannot be checked, and a flipped bit in a data page may decode
    to wrong rows.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    with fsspec.open(url, "rb", **remote_options(url)) as f:
        try:
            parquet = pq.ParquetFile(f, page_checksum_verification=True)
        except (pa.ArrowException, OSError) as e:
            stats.add("in")  # the unreadable rest is one record seen, so ``in`` adds up
            stats.add(f"failed.{prefix}_corrupt_file")
            log.warning("%s: not a readable Parquet file: %s", url, e)
            return
        names = set(parquet.schema_arrow.names)
        if required not in names:
            stats.add("in")
            stats.add(f"failed.{prefix}_corrupt_file")
            log.warning("%s: Parquet file has no %r column (columns: %s); skipped", url, required, sorted(names))
            return
        row = 0
        try:
            for batch in parquet.iter_batches(batch_size=batch_size,
                                              columns=[c for c in dict.fromkeys(columns) if c in names]):
                for record in batch.to_pylist():
                    stats.add("in")
                    yield row, record
                    row += 1
        except (pa.ArrowException, OSError) as e:
            stats.add("in")
            stats.add(f"failed.{prefix}_corrupt_file")
            log.warning("%s: corrupt Parquet data after row %d: %s", url, row, e)
