"""Raw record files (JSON lines, Parquet) read as records, every line or row accounted for.

The one home for reading them, so every stage that takes raw files counts their faults alike: the
ingest and code readers, and dedup's raw inputs. Counter names take the caller's ``prefix``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import fsspec

from tasks.compression import GAP, MEMBER_END, UNVERIFIED_HOLD_CHARS, decompressed_chunks, is_compressed
from tasks.counters import Stats
from tasks.objectstore import remote_options

log = logging.getLogger(__name__)
TOO_LONG = object()  # from ``_bounded_lines``: a line past the limit, skipped unread


def read_json_lines(url: str, max_line_bytes: int, stats: Stats, *, prefix: str,
                    truncated: str) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) of each line of a JSONL file (plain or compressed), streamed.

    Counts ``in``; skips an oversize line (``dropped.<prefix>_too_large``), undecodable
    bytes (``dropped.<prefix>_undecodable``) and malformed JSON (``failed.<prefix>_bad_record``). A
    truncated stream ends the file (``failed.<truncated>``) keeping every line read before it. Lines
    of a compressed file are held (up to ``UNVERIFIED_HOLD_CHARS`` bytes) until the member (stream,
    frame) they came from has passed its checksum, which for a one-member file is at its end. Corrupt
    data costs its member: it counts ``failed.<prefix>_corrupt_file``, the lines held from it
    ``failed.<prefix>_unverified_record``, and reading resumes at the next member (concatenated
    files, ``pigz --independent``, BGZF, zstd frames); the tail of a line the gap cut fails as a bad record.
    """
    held: list[tuple[int, bytes | object]] = []
    held_bytes = line_no = 0
    hold_limit = UNVERIFIED_HOLD_CHARS + max_line_bytes if is_compressed(url) else 0
    with fsspec.open(url, "rb", **remote_options(url)) as raw:
        try:
            for line in _bounded_lines(decompressed_chunks(url, raw), max_line_bytes):
                if line is MEMBER_END:
                    yield from _parsed_lines(held, stats, prefix)
                    held_bytes = 0
                elif line is GAP:
                    stats.add("in", 1 + len(held))  # the corrupt stretch itself is one record seen
                    stats.add(f"failed.{prefix}_corrupt_file")
                    stats.add(f"failed.{prefix}_unverified_record", len(held))
                    log.warning("%s: corrupt compressed data after line %d; %d lines from it dropped, reading on "
                                "at the next member", url, line_no, len(held))
                    held.clear()
                    held_bytes = 0
                else:
                    line_no += 1
                    if line is not TOO_LONG and not line.strip():
                        continue
                    held.append((line_no - 1, line))
                    held_bytes += (0 if line is TOO_LONG else len(line)) + 100  # and the tuple, about 100 bytes
                    if held_bytes > hold_limit:
                        yield from _parsed_lines(held, stats, prefix)
                        held_bytes = 0
        except EOFError:  # the cut line is a record seen: ``in`` still adds up
            stats.add("in")
            stats.add(f"failed.{truncated}")
            log.warning("%s: file is truncated after line %d", url, line_no)
    yield from _parsed_lines(held, stats, prefix)


def _parsed_lines(held: list[tuple[int, bytes | object]], stats: Stats, prefix: str) -> Iterator[tuple[int, Any]]:
    """The held lines parsed and counted, in order; ``held`` is emptied."""
    for line_no, line in held:
        stats.add("in")
        if line is TOO_LONG:
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


def _bounded_lines(chunks: Iterator[bytes | object | None], max_bytes: int) -> Iterator[bytes | object]:
    """Lines of a chunk stream, each with its newline; ``TOO_LONG`` for a line longer than ``max_bytes``
    (skipped, never held whole); the stream's ``GAP`` and ``MEMBER_END`` markers in place. At a ``GAP``
    the line it cut goes out first, so it is counted with the lines of the member it came from."""
    partial, too_long = bytearray(), False
    for chunk in chunks:
        if chunk is MEMBER_END or chunk is GAP:
            if chunk is GAP and (partial or too_long):
                yield TOO_LONG if too_long else bytes(partial)
                partial, too_long = bytearray(), False
            yield chunk
            continue
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if too_long or len(partial) + end - start > max_bytes:
                yield TOO_LONG
            elif partial:
                partial += chunk[start:end + 1]
                yield bytes(partial)
            else:
                yield chunk[start:end + 1]
            partial, too_long, start = bytearray(), False, end + 1
        if not too_long:
            partial += chunk[start:]
            if len(partial) > max_bytes:
                partial, too_long = bytearray(), True
    if too_long:
        yield TOO_LONG
    elif partial:
        yield bytes(partial)


def read_parquet_rows(url: str, required: str, columns: Sequence[str], stats: Stats, *, prefix: str,
                      batch_size: int) -> Iterator[tuple[int, dict]]:
    """(row number, record) of a Parquet file, streamed by batches of the wanted ``columns``.

    Counts ``in``. An unreadable file, a file without the ``required`` column, or corrupt data part-way
    count as ``failed.<prefix>_corrupt_file``; corrupt data costs the rest of its row group, and reading
    resumes at the next one.
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
        wanted = [c for c in dict.fromkeys(columns) if c in names]
        first = 0  # the row number of the group's first row, from the footer, so numbers hold past a bad group
        for group in range(parquet.num_row_groups):
            row = first
            try:
                for batch in parquet.iter_batches(batch_size=batch_size, row_groups=[group], columns=wanted):
                    for record in batch.to_pylist():
                        stats.add("in")
                        yield row, record
                        row += 1
            except (pa.ArrowException, OSError, UnicodeDecodeError) as e:  # a string that is not UTF-8: bad data too
                stats.add("in")  # the group's unread rest is one record seen
                stats.add(f"failed.{prefix}_corrupt_file")
                log.warning("%s: corrupt Parquet data in row group %d after row %d, reading on at the next group: %s",
                            url, group, row, e)
            first += parquet.metadata.row_group(group).num_rows
