"""The WARC framer: an uncompressed WARC byte stream → records, resynchronising after a bad one.

smelt frames records itself, not with warcio's or FastWARC's iterators, because both take a lying
Content-Length or a mangled header block as the end of the file or as a good record; here a bad
record costs only itself and is named with its reason (``Framed.failure``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from tasks.compression import GAP, MEMBER_END, READ_CHUNK


_MAX_WARC_HEAD = 1 << 16
WARC_MAGIC = b"WARC/1."
_END = 1 << 62


@dataclasses.dataclass
class Framed:
    """One record as framed: its WARC head and body, or why it could not be read."""

    offset: int
    warc_type: str = ""
    head: dict[str, bytes] = dataclasses.field(default_factory=dict)
    raw_head: bytes = b""
    body: bytes | None = None  # None: larger than the framer holds
    failure: str | None = None
    end: int = 0  # where the framer reads on after this record


class WarcFramer:
    """Splits an uncompressed WARC byte stream into records, resynchronising after a bad one.

    A record is ``WARC/1.x`` + header lines + CRLF + Content-Length bytes + CRLF CRLF. When the
    bytes after the body are not that trailer, the length lied: the next record is the next
    ``WARC/1.`` at a line start (searched in the held bytes first, then onward). Offsets are
    positions in the uncompressed stream. Memory: one record of at most ``retain`` bytes; a
    longer body is streamed past (and a ``WARC/1.`` header line inside it ends it as a lie).
    """

    def __init__(self, chunks: Iterator[bytes | object | None], retain: int, compression: str, start: int = 0) -> None:
        self._chunks, self._retain, self.compression_name, self._start = chunks, retain, compression, start
        self._buf, self._base = bytearray(), 0  # _buf[0] is stream offset _base
        self._gaps: list[int] = []  # offsets where corrupt compressed data was skipped
        # Compressed data only: the bytes before ``verified`` lie in members (gzip) or frames (zstd) whose
        # checksums held; a corrupt member's output, from the end of the member before it to its gap, is
        # a ``corrupt_span``.
        self.verified, self.corrupt_spans = 0, []
        self._eof = self._truncated = self._truncation_counted = False

    # -- the byte window -------------------------------------------------------------------

    def _more(self) -> bool:
        while not self._eof:
            try:
                chunk = next(self._chunks)
            except StopIteration:
                self._eof = True
            except EOFError:
                self._eof = self._truncated = True
            else:
                if chunk is GAP:
                    self._gaps.append(self._end)
                    self.corrupt_spans.append((self.verified, self._end))
                    continue
                if chunk is MEMBER_END:
                    self.verified = self._end
                    continue
                self._buf += chunk
                return True
        return False

    @property
    def _end(self) -> int:
        return self._base + len(self._buf)

    def _have(self, end: int) -> bool:
        while self._end < end:
            if not self._more():
                return False
        return True

    def _bytes(self, start: int, end: int) -> bytes:
        return bytes(self._buf[start - self._base: end - self._base])

    def _forget(self, before: int) -> None:
        if before - self._base > READ_CHUNK:
            del self._buf[: before - self._base]
            self._base = before

    def _find(self, needle: bytes, start: int, limit: int = _END) -> int:
        """Offset of ``needle`` in ``[start, limit)``, reading on as needed (and forgetting what it passed); -1 if none."""
        while True:
            end = min(limit, self._end)
            at = self._buf.find(needle, start - self._base, end - self._base)
            if at >= 0:
                return at + self._base
            if end >= limit or not self._more():
                return -1
            start = max(start, end - len(needle) + 1)
            self._forget(start)

    def _next_record(self, start: int, limit: int = _END, boundary: bool = False) -> int:
        """Offset of the next ``WARC/1.`` at a line start from ``start`` (or at ``start`` itself when it
        follows skipped data: ``boundary``); -1 if there is none before ``limit``."""
        if boundary and self._have(start + len(WARC_MAGIC)) and self._bytes(start, start + len(WARC_MAGIC)) == WARC_MAGIC:
            return start
        at = self._find(b"\n" + WARC_MAGIC, max(start - 1, 0), limit)
        return at + 1 if at >= 0 else -1

    # -- records -----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Framed]:
        pos = self._start
        while self._end < pos:  # records before ``start`` were read already: skip their bytes unframed
            self._base, self._buf = self._end, bytearray()
            if not self._more():
                return
        del self._buf[: pos - self._base]
        self._base = pos
        while True:
            self._forget(pos)
            while self._have(pos + 1) and self._buf[pos - self._base] in b"\r\n":
                pos += 1
            while self._gaps and self._gaps[0] <= pos:  # whole members lost before this record
                yield Framed(self._gaps.pop(0), failure=f"corrupt_{self.compression_name}", end=pos)
            if not self._have(pos + 1):
                if self._truncated and not self._truncation_counted:
                    yield Framed(pos, failure=f"truncated_{self.compression_name}", end=pos)
                return
            record, pos = self._frame(pos)
            record.end = pos
            yield record

    def _frame(self, start: int) -> tuple[Framed, int]:
        record, end = self._frame_bytes(start)
        inside = [g for g in self._gaps if start < g < max(end, start + 1)]
        if inside:  # the record's bytes run across skipped corrupt data
            self._gaps = [g for g in self._gaps if g > inside[0]]
            resume = self._next_record(inside[0], boundary=True)
            return Framed(start, failure=f"corrupt_{self.compression_name}"), resume if resume >= 0 else self._end
        return record, end

    def _fail(self, start: int, reason: str, resume_from: int) -> tuple[Framed, int]:
        if not self._have(resume_from) or (at := self._next_record(resume_from, boundary=True)) < 0:
            if self._truncated and not self._truncation_counted:
                self._truncation_counted = True
                reason = f"truncated_{self.compression_name}"
            return Framed(start, failure=reason), self._end
        return Framed(start, failure=reason), at

    def _frame_bytes(self, start: int) -> tuple[Framed, int]:
        if not self._have(start + len(WARC_MAGIC)) or self._bytes(start, start + len(WARC_MAGIC)) != WARC_MAGIC:
            return self._fail(start, "bad_header", start + 1)
        head_end = self._find(b"\r\n\r\n", start, start + _MAX_WARC_HEAD)
        if head_end < 0:
            return self._fail(start, "bad_header", start + 1)
        raw_head = self._bytes(start, head_end + 4)
        head = parse_warc_head(raw_head)
        body_start = head_end + 4
        length = head.get("content-length", b"").strip()
        if not length.isdigit():
            return self._fail(start, "no_length", body_start)
        body_end = body_start + int(length)
        warc_type = head.get("warc-type", b"").decode("latin-1").strip()
        if int(length) <= self._retain:
            complete = self._have(body_end + 4)
            if complete and self._bytes(body_end, body_end + 4) == b"\r\n\r\n":
                if not warc_type:
                    return Framed(start, failure="bad_header"), body_end + 4
                body = self._bytes(body_start, body_end)
                return Framed(start, warc_type, head, raw_head, body), body_end + 4
            inside = self._next_record(body_start, min(body_end + 4, self._end))
            if inside >= 0:
                return Framed(start, failure="bad_length"), inside
            return self._fail(start, "bad_length", min(body_end, self._end))
        inside = self._next_record(body_start, body_end + 4)  # streams past the body, holding none of it
        if inside >= 0:
            return Framed(start, failure="bad_length"), inside
        if self._have(body_end + 4) and self._bytes(body_end, body_end + 4) == b"\r\n\r\n":
            return Framed(start, warc_type, head, raw_head, None), body_end + 4
        return self._fail(start, "bad_length", min(body_end, self._end))


def parse_warc_head(raw: bytes) -> dict[str, bytes]:
    """Lower-cased WARC header names to their raw values (the first of repeated names wins)."""
    fields: dict[str, bytes] = {}
    for line in raw.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            fields.setdefault(name.strip().decode("latin-1").lower(), value.strip())
    return fields
