import bz2
import functools
import gzip
import io
import http.server
import lzma
import random
import re
import threading
import zlib

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tasks.counters import Stats
from tasks.storage import normalize_url
from tasks.ingest.config import WARC_ENGINES, ReaderConfig
from tasks.ingest.readers import InputError, expand_inputs, input_format, read_documents
from tests.tasks.ingest.crawl_files import (
    article_page,
    conversion,
    english_warc,
    gzip_members,
    jsonl,
    other_record,
    prose,
    raw_response,
    response,
    write,
)
from tests.tasks.test_integrity_inputs import READER_CASES

HTML = b"<html><body><p>Hello there, this is a page.</p></body></html>"


def read(url, **cfg):
    stats = Stats()
    docs = list(read_documents(url, ReaderConfig(**cfg), stats))
    return docs, stats


def reason_counts(stats):
    return {k: v for k, v in stats.items() if k.startswith(("dropped.", "failed."))}


@pytest.fixture(params=WARC_ENGINES)
def warc_engine(request):
    """Each WARC test runs with each ``reader.warc_engine``: they must read and count alike."""
    return request.param


# ---------------------------------------------------------------------------------------------
# WARC


def test_warc_response_records_become_html_documents_and_other_records_are_skipped(tmp_path, warc_engine):
    records = [other_record("https://a.example/"), *english_warc(0, 2), other_record("https://a.example/", "metadata")]
    url = write(tmp_path / "crawl.warc.gz", gzip_members(records))

    docs, stats = read(url, warc_engine=warc_engine)

    assert [d.url for d in docs] == ["https://news.example/story-0", "https://news.example/story-1"]
    assert all(d.meta["format"] == "html" and d.text.startswith("<!DOCTYPE html>") for d in docs)
    assert docs[0].meta["warc_file"] == url and docs[0].meta["charset"] == "utf-8"
    ids = [d.meta["warc_record_id"] for d in docs]  # the crawl's own name for each record, kept for smelt trace
    assert all(i.startswith("<urn:uuid:") for i in ids) and len(set(ids)) == 2
    assert stats["in"] == 2 and stats["out"] == 2 and stats["other_records"] == 2
    assert stats["bytes_in"] == (tmp_path / "crawl.warc.gz").stat().st_size


def test_document_ids_are_deterministic_and_distinct(tmp_path, warc_engine):
    url = write(tmp_path / "crawl.warc.gz", gzip_members(english_warc(0, 3)))
    first, _ = read(url, warc_engine=warc_engine)
    second, _ = read(url, warc_engine=warc_engine)
    assert [d.id for d in first] == [d.id for d in second]
    assert len({d.id for d in first}) == 3


def test_charset_comes_from_the_http_header(tmp_path, warc_engine):
    page = "<html><body><p>Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e</p></body></html>".encode("iso-8859-1")
    url = write(tmp_path / "a.warc", response("https://a.example/", page, "text/html; charset=ISO-8859-1"))
    (doc,), _ = read(url, warc_engine=warc_engine)
    assert "Caf\u00e9 cr\u00e8me br\u00fbl\u00e9e" in doc.text and doc.meta["charset"] == "iso8859-1"


def test_charset_falls_back_to_the_meta_tag(tmp_path, warc_engine):
    page = '<html><head><meta charset="windows-1251"></head><body><p>Привет, мир</p></body></html>'.encode("cp1251")
    url = write(tmp_path / "a.warc", response("https://a.example/", page, "text/html"))
    (doc,), _ = read(url, warc_engine=warc_engine)
    assert "Привет, мир" in doc.text and doc.meta["charset"] == "cp1251"


def test_a_wrong_declared_charset_is_replaced_by_detection(tmp_path, warc_engine):
    text = "Съешь же ещё этих мягких французских булок, да выпей чаю. " * 20
    page = f"<html><body><p>{text}</p></body></html>".encode("cp1251")
    url = write(tmp_path / "a.warc", response("https://a.example/", page, "text/html; charset=utf-8"))
    (doc,), _ = read(url, warc_engine=warc_engine)
    assert "французских булок" in doc.text


def test_a_few_broken_bytes_are_replaced_and_counted(tmp_path, warc_engine):
    page = (HTML * 10).replace(b"Hello", b"He\xffllo", 1).replace(b"page", b"pa\xc3\x28ge", 1)
    url = write(tmp_path / "a.warc", response("https://a.example/", page))
    (doc,), stats = read(url, warc_engine=warc_engine)
    assert "He\ufffdllo" in doc.text
    assert stats["decoded_with_replacements"] == 1


def test_undecodable_bytes_are_dropped_and_counted(tmp_path, warc_engine):
    junk = random.Random(0).randbytes(3000) + b"\x00" * 50
    url = write(tmp_path / "a.warc", response("https://a.example/", junk, "text/html"))
    docs, stats = read(url, warc_engine=warc_engine)
    assert docs == [] and reason_counts(stats) == {"dropped.read_undecodable": 1}


def test_non_html_payloads_redirects_and_empty_records_are_dropped_with_reasons(tmp_path, warc_engine):
    records = [
        response("https://a.example/logo.png", b"\x89PNG\r\n\x1a\n" + bytes(100), "image/png"),
        response("https://a.example/old", b"<html>moved</html>", status="301 Moved Permanently"),
        response("https://a.example/empty", b""),
        response("https://a.example/blank", b"  \r\n "),
        response("https://a.example/untyped", b"plain words, no markup", content_type=None),
        *english_warc(0, 1),
    ]
    url = write(tmp_path / "a.warc.gz", gzip_members(records))
    docs, stats = read(url, warc_engine=warc_engine)
    assert [d.url for d in docs] == ["https://news.example/story-0"]
    assert reason_counts(stats) == {
        "dropped.read_non_html": 2,
        "dropped.read_http_status": 1,
        "dropped.read_empty": 2,
    }
    assert stats["in"] == 6 == stats["out"] + sum(reason_counts(stats).values())


def test_truncated_gzip_keeps_the_complete_records_and_counts_the_truncation(tmp_path, warc_engine):
    members = [gzip.compress(r, mtime=0) for r in english_warc(0, 3)]
    whole = b"".join(members)
    inside_last_member = len(whole) - len(members[-1]) // 2
    url = write(tmp_path / "a.warc.gz", whole[:inside_last_member])
    docs, stats = read(url, warc_engine=warc_engine)
    assert [d.url for d in docs] == ["https://news.example/story-0", "https://news.example/story-1"]
    assert reason_counts(stats) == {"failed.read_truncated_gzip": 1}


def test_gzip_truncated_inside_a_record_header_is_still_counted(tmp_path, warc_engine):
    records = english_warc(0, 2)
    cut = len(records[0]) + 40  # inside the second record's WARC header
    url = write(tmp_path / "a.warc.gz", gzip.compress(b"".join(records), mtime=0)[:-1])
    docs, stats = read(url, warc_engine=warc_engine)
    assert stats["failed.read_truncated_gzip"] == 1
    url = write(tmp_path / "b.warc.gz", gzip.compress(b"".join(records)[:cut], mtime=0)[:-8][: cut // 3])
    docs, stats = read(url, warc_engine=warc_engine)
    assert stats["failed.read_truncated_gzip"] == 1


def _lie_about_length(record: bytes, delta: int) -> bytes:
    length = int(re.search(rb"Content-Length: (\d+)", record).group(1))
    return record.replace(b"Content-Length: %d" % length, b"Content-Length: %d" % (length + delta), 1)


def test_a_short_content_length_drops_that_record_and_keeps_the_rest(tmp_path, warc_engine):
    first, second, third = english_warc(0, 3)
    url = write(tmp_path / "a.warc.gz", gzip_members([first, _lie_about_length(second, -60), third]))
    docs, stats = read(url, warc_engine=warc_engine)
    assert [d.url for d in docs] == ["https://news.example/story-0", "https://news.example/story-2"]
    assert reason_counts(stats) == {"failed.read_bad_length": 1}


def test_a_long_content_length_costs_only_its_own_record(tmp_path, warc_engine):
    first, second, third = english_warc(0, 3)
    url = write(tmp_path / "a.warc", first + _lie_about_length(second, 80) + third)
    docs, stats = read(url, warc_engine=warc_engine)
    assert [d.url for d in docs] == ["https://news.example/story-0", "https://news.example/story-2"]
    assert reason_counts(stats) == {"failed.read_bad_length": 1}


def test_a_content_length_past_the_end_of_file_is_counted(tmp_path, warc_engine):
    first, second = english_warc(0, 2)
    url = write(tmp_path / "a.warc", first + _lie_about_length(second, 100_000))
    docs, stats = read(url, warc_engine=warc_engine)
    assert [d.url for d in docs] == ["https://news.example/story-0"]
    assert reason_counts(stats) == {"failed.read_bad_length": 1}


def test_a_50_mb_page_is_skipped_and_the_next_record_still_read(tmp_path, warc_engine):
    big = b"<html><body>" + b"<p>" + b"x" * (50 * 1024 * 1024) + b"</p></body></html>"
    url = write(tmp_path / "a.warc.gz", gzip_members([response("https://a.example/big", big), *english_warc(0, 1)]))
    docs, stats = read(url, warc_engine=warc_engine)
    assert [d.url for d in docs] == ["https://news.example/story-0"]
    assert reason_counts(stats) == {"dropped.read_too_large": 1}


def test_wet_conversion_records_are_read_as_plain_text(tmp_path, warc_engine):
    records = [conversion("https://a.example/1", "First page text.\nSecond line."), conversion("https://a.example/2", " ")]
    url = write(tmp_path / "x.warc.wet.gz", gzip_members(records))
    docs, stats = read(url, warc_engine=warc_engine)
    assert [(d.url, d.text, d.meta["format"]) for d in docs] == [("https://a.example/1", "First page text.\nSecond line.", "text")]
    assert reason_counts(stats) == {"dropped.read_empty": 1}


def _both_engines(path):
    """(documents, stats) of ``path`` read with each engine, in ``WARC_ENGINES`` order."""
    return [read(str(path), warc_engine=engine) for engine in WARC_ENGINES]


ARCHIVE_CASES = [c for c in READER_CASES if input_format(c[1]) in ("warc", "wet")]


@pytest.mark.parametrize(("case", "name", "data"), [c[:3] for c in ARCHIVE_CASES], ids=[c[0] for c in ARCHIVE_CASES])
def test_every_bad_archive_input_gives_the_same_documents_and_counts_with_either_engine(tmp_path, case, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    (smelt_docs, smelt_stats), (fastwarc_docs, fastwarc_stats) = _both_engines(path)
    assert fastwarc_docs == smelt_docs  # ids, urls, texts and meta (offsets included)
    assert dict(fastwarc_stats) == dict(smelt_stats)


PAGE = b"<html><body><p>" + b"An encoded page of plain words. " * 20 + b"</p></body></html>"
CHUNKED = b"40\r\n" + PAGE[:64] + b"\r\n" + b"%x\r\n" % (len(PAGE) - 64) + PAGE[64:] + b"\r\n0\r\n\r\n"
OK_HTML = b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8"
# (HTTP head, body, extra WARC header lines, parsed by FastWARC rather than handed to warcio)
ODD_RECORDS = [
    (OK_HTML, PAGE, b"", True),
    (OK_HTML + b"\r\nContent-Length: 99999", PAGE, b"", True),  # truncated payload
    (b"HTTP/1.1 404 Not Found\r\nContent-Type: text/html", PAGE, b"", True),
    (b"HTTP/1.1  200 OK\r\nContent-Type: text/html", PAGE, b"", True),  # two spaces
    (b"HTTP/1.1 200\r\nContent-Type : text/html\r\ncontent-type: image/png", PAGE, b"", True),
    (b"HTTP/1.0 200 OK", PAGE, b"WARC-Identified-Payload-Type: image/png\r\n", True),
    (OK_HTML + b"\r\nContent-Encoding: gzip", gzip.compress(PAGE), b"", False),
    (OK_HTML + b"\r\nContent-Encoding: gzip", PAGE, b"", False),  # not gzip after all: warcio passes it through
    (OK_HTML + b"\r\nContent-Encoding: deflate", zlib.compress(PAGE)[2:-4], b"", False),  # raw deflate
    (OK_HTML + b"\r\nTransfer-Encoding: chunked", CHUNKED, b"", False),
    (OK_HTML + b"\r\nTransfer-Encoding: chunked", PAGE, b"", False),  # not chunked after all
    (b"garbage line\r\nContent-Type: text/html", PAGE, b"", False),
    (b"HTTP/1.1 200 OK\nContent-Type: text/html", PAGE, b"", False),  # LF-only lines
    (OK_HTML + b"\r\nX-A: b\nContent-Type: image/png", PAGE, b"", False),  # one LF-only line
    (OK_HTML + b"\r\nX-A: b\rc", PAGE, b"", False),  # a lone CR
    (OK_HTML, PAGE, b"X-A: b\nWARC-Identified-Payload-Type: image/png\r\n", False),  # in the WARC head
    (OK_HTML + b"\r\nX-Folded: a\r\n b", PAGE, b"", False),
    (OK_HTML + b"\r\nNo colon here", PAGE, b"", False),
    (OK_HTML + b"\r\nX-Name: caf\xc3\xa9", PAGE, b"", False),
    (OK_HTML + b"\r\nX-Odd: a\x1c", PAGE, b"", False),
    (OK_HTML, PAGE, b"X-Note: na\xefve\r\n", False),
    (OK_HTML + b"\r\nSet-Cookie: " + b"c" * 40_000, PAGE, b"", False),  # over FastWARC's header limit
]


def test_records_fastwarc_cannot_parse_as_warcio_does_go_to_warcio_and_read_alike(tmp_path):
    from tasks.ingest.warc_framer import WarcFramer
    from tasks.ingest.warc_records import fastwarc_parsed

    records = [raw_response(f"https://odd.example/{i}", head, body, warc) for i, (head, body, warc, _) in enumerate(ODD_RECORDS)]
    records += [raw_response("<https://odd.example/angled>", OK_HTML, PAGE), raw_response("dns:odd.example", OK_HTML, PAGE)]
    path = tmp_path / "odd.warc"
    path.write_bytes(b"".join(records))
    (smelt_docs, smelt_stats), (fastwarc_docs, fastwarc_stats) = _both_engines(path)
    assert fastwarc_docs == smelt_docs and dict(fastwarc_stats) == dict(smelt_stats)
    assert len(smelt_docs) >= 10 and smelt_stats["in"] == len(records)
    framed = list(WarcFramer(iter([path.read_bytes()]), 1 << 20, "gzip"))
    taken = [fastwarc_parsed(r) is not None for r in framed]
    assert taken == [fast for *_, fast in ODD_RECORDS] + [False, True]


def _big_members(pages: int = 80) -> list[bytes]:
    """gzip members of ~50 KB pages: several of the reader's 1 MiB chunks, so FastWARC's gzip reader
    gives out records part-way through the file."""
    return [gzip.compress(response(f"https://big.example/{i}", article_page(f"Page {i}", prose(i)).encode() * 40), mtime=0)
            for i in range(pages)]


def _flip(member: bytes) -> bytes:
    member = bytearray(member)
    member[len(member) // 2: len(member) // 2 + 8] = b"\xff" * 8
    return bytes(member)


BIG_GZIP_CASES = {
    "clean": lambda m: b"".join(m),
    "clean, a 3 MB last member that inflates from a few KB": lambda m: b"".join(m) + gzip.compress(
        response("https://big.example/last", article_page("Last", prose(0)).encode() * 3000), mtime=0),
    "corrupt member late": lambda m: b"".join(m[:70] + [_flip(m[70])] + m[71:]),
    "truncated in the last member": lambda m: b"".join(m)[:-300],
    "cut after a member header": lambda m: b"".join(m) + m[0][:12],
    "junk after the last member": lambda m: b"".join(m) + b"junk" * 10,
    "clean, one member": lambda m: gzip.compress(b"".join(gzip.decompress(x) for x in m), mtime=0),
    "one member, cut": lambda m: gzip.compress(b"".join(gzip.decompress(x) for x in m), mtime=0)[:-5],
    "one member, cut inside its trailer": lambda m: gzip.compress(b"".join(gzip.decompress(x) for x in m),
                                                                  mtime=0)[:-3],
    "a byte changed that only the checksum catches": lambda m: b"".join(m[:40] + [_stored_page_with_a_changed_byte()] + m[40:]),
}


def _stored_page_with_a_changed_byte() -> bytes:
    """A 2.5 MB page in stored (uncompressed) deflate blocks, one byte of it changed: it decodes without
    error, and only the member's checksum, checked after its first MiB was given out, shows it."""
    page = response("https://big.example/huge", article_page("Huge", prose(0)).encode() * 2500)
    member = bytearray(gzip.compress(page, compresslevel=0, mtime=0))
    member[len(member) // 10] ^= 0x01
    return bytes(member)


def test_records_of_a_one_member_warc_gz_whose_checksum_fails_are_counted_never_given_out(tmp_path):
    """A 1.4 MB member in stored blocks, a byte changed mid-way: it decodes, and only the CRC at its end
    tells. Before records waited for their member's checksum, both engines gave out 30 records, one wrong."""
    records = b"".join(gzip.decompress(m) for m in _big_members(40))
    data = bytearray(gzip.compress(records, compresslevel=0, mtime=0))
    data[len(data) // 2] ^= 0x01
    path = tmp_path / "one-member.warc.gz"
    path.write_bytes(bytes(data))
    (smelt_docs, smelt_stats), (fastwarc_docs, fastwarc_stats) = _both_engines(path)
    assert smelt_docs == fastwarc_docs == [] and dict(smelt_stats) == dict(fastwarc_stats)
    faults = reason_counts(smelt_stats)
    assert faults["failed.read_corrupt_gzip"] == 1 and faults["failed.read_unverified_record"] >= 20
    assert smelt_stats["in"] == sum(faults.values())  # every record accounted for, none given out


def test_a_zstd_warc_with_a_frame_per_record_loses_only_a_corrupt_frames_record(tmp_path, warc_engine):
    """The zstd WARC layout: one frame per record, each with a checksum. A changed byte in the middle
    frame raised zstandard's error out of the reader, and the file failed; now its record is counted and
    decoding resumes at the next frame's magic. Every position of that frame is tried."""
    compress = zstandard.ZstdCompressor(write_checksum=True).compress
    records = english_warc(0, 5)
    frames = [compress(r) for r in records]
    data = b"".join(frames)
    path = tmp_path / "crawl.warc.zst"
    docs, stats = read(write(path, data), warc_engine=warc_engine)
    clean = [d.text for d in docs]
    assert len(clean) == 5 and reason_counts(stats) == {}
    start = len(frames[0]) + len(frames[1])
    for at in range(start, start + len(frames[2])):
        flipped = bytearray(data)
        flipped[at] ^= 0x04
        docs, stats = read(write(path, bytes(flipped)), warc_engine=warc_engine)
        if reason_counts(stats):  # the record lost; or, the checksum flag cleared, the checksum read as junk
            assert [d.text for d in docs] in (clean[:2] + clean[3:], clean), at
            assert reason_counts(stats) == {"failed.read_corrupt_zstd": 1}, at
        else:  # a bit no decoder reads (in the frame header's reserved or unused fields)
            assert [d.text for d in docs] == clean, at


def test_records_of_a_one_frame_warc_zst_whose_checksum_fails_are_counted_never_given_out(tmp_path, warc_engine):
    """Pages with 40 KB of random hex each, so the frame is over one read chunk and its records are framed
    before its checksum, at its end, is checked."""
    rng = random.Random(7)
    pages = [article_page(f"Page {i}", prose(i)) + f"<!-- {rng.randbytes(20_000).hex()} -->" for i in range(60)]
    records = b"".join(response(f"https://big.example/{i}", page.encode()) for i, page in enumerate(pages))
    data = bytearray(zstandard.ZstdCompressor(write_checksum=True).compress(records))
    assert len(data) > 1 << 20
    data[-2] ^= 0x01  # in the frame's checksum: every record decodes as written, and the check fails
    docs, stats = read(write(tmp_path / "one-frame.warc.zst", bytes(data)), warc_engine=warc_engine)
    faults = reason_counts(stats)
    assert docs == [] and faults["failed.read_corrupt_zstd"] == 1 and faults["failed.read_unverified_record"] >= 20
    assert stats["in"] == sum(faults.values())
    cut, stats = read(write(tmp_path / "cut.warc.zst", bytes(data[:-3])), warc_engine=warc_engine)
    assert len(cut) == stats["out"] >= 20 and reason_counts(stats) == {"failed.read_truncated_zstd": 1}


@pytest.mark.parametrize("kind, compress", [("bz2", bz2.compress), ("xz", lzma.compress)])
def test_a_warc_bz2_or_xz_is_read_and_its_records_wait_for_the_streams_check(tmp_path, warc_engine, kind, compress):
    """One stream for the whole file: its records go out when its check at the end holds, and not at all
    when it fails; a cut gives out what was decoded before it, counted."""
    records = english_warc(0, 6)
    clean, stats = read(write(tmp_path / "crawl.warc.gz", gzip_members(records)), warc_engine=warc_engine)
    data = bytearray(compress(b"".join(records)))
    docs, stats = read(write(tmp_path / f"crawl.warc.{kind}", bytes(data)), warc_engine=warc_engine)
    assert [d.text for d in docs] == [d.text for d in clean] and reason_counts(stats) == {}
    data[-2] ^= 0x01  # in the stream's closing check (bz2's combined CRC, xz's footer)
    docs, stats = read(write(tmp_path / f"bad.warc.{kind}", bytes(data)), warc_engine=warc_engine)
    faults = reason_counts(stats)  # decoded before the check failed, records are counted unverified; or none was
    assert docs == [] and faults[f"failed.read_corrupt_{kind}"] == 1
    assert set(faults) <= {f"failed.read_corrupt_{kind}", "failed.read_unverified_record"}
    assert stats["in"] == sum(faults.values())
    cut, stats = read(write(tmp_path / f"cut.warc.{kind}", bytes(data[:-3])), warc_engine=warc_engine)
    assert len(cut) == stats["out"] and reason_counts(stats) == {f"failed.read_truncated_{kind}": 1}


class CountingFile(io.BytesIO):
    def __init__(self, data: bytes):
        super().__init__(data)
        self.bytes_read = 0

    def read(self, size: int = -1) -> bytes:
        out = super().read(size)
        self.bytes_read += len(out)
        return out


@pytest.mark.parametrize("cut", [0, 3])
def test_a_one_member_gzip_is_proven_whole_by_its_trailer_not_by_inflating_it_again(cut):
    from fastwarc.stream_io import GzipReader

    from tasks.ingest.warc import VerifiedGzip

    data = gzip.compress(b"".join(gzip.decompress(m) for m in _big_members(40)), mtime=0)
    data = data[: len(data) - cut]
    source = VerifiedGzip(GzipReader(io.BytesIO(data)))
    assert sum(len(chunk) for chunk in source) > 1 << 20
    raw = CountingFile(data)
    assert source.ends_complete(raw) is (cut == 0)
    assert raw.bytes_read == (8 if cut == 0 else 8 + len(data))  # a cut trailer: zlib inflates it to be sure


@pytest.mark.parametrize("case", list(BIG_GZIP_CASES))
def test_fastwarc_gzip_gives_out_verified_records_and_smelt_reads_on_after_a_fault(tmp_path, case):
    from tasks.ingest.warc import _read_fast_gzip

    path = tmp_path / "big.warc.gz"
    path.write_bytes(BIG_GZIP_CASES[case](_big_members()))
    (smelt_docs, smelt_stats), (fastwarc_docs, fastwarc_stats) = _both_engines(path)
    assert fastwarc_docs == smelt_docs and dict(fastwarc_stats) == dict(smelt_stats)
    assert sum(v for k, v in smelt_stats.items() if k.startswith("failed.")) == (not case.startswith("clean"))
    fast = _read_fast_gzip(normalize_url(str(path)), ReaderConfig(), Stats(), "response")
    given_out = []
    try:
        while True:
            given_out.append(next(fast))
    except StopIteration as stop:
        resume_at = stop.value
    if case.startswith("clean"):
        assert resume_at is None and given_out == smelt_docs
    elif case.startswith("one member"):  # nothing is verified before the end of the only member
        assert resume_at == 0 and given_out == []
    else:  # the pages before the fault came from FastWARC's reader; smelt's reads on from there
        assert 0 < resume_at and 0 < len(given_out) < len(smelt_docs) and given_out == smelt_docs[:len(given_out)]


def test_fastwarc_gzip_holds_back_a_bounded_amount(tmp_path, monkeypatch):
    from tasks.ingest import warc

    path = tmp_path / "one-member.warc.gz"
    path.write_bytes(gzip.compress(b"".join(gzip.decompress(m) for m in _big_members(20)), mtime=0))
    url, cfg = normalize_url(str(path)), ReaderConfig(max_payload_bytes=100_000)

    def resumes_at():
        fast = warc._read_fast_gzip(url, cfg, Stats(), "response")
        while True:
            try:
                next(fast)
            except StopIteration as stop:
                return stop.value

    assert resumes_at() is None  # whole and verified at its end: FastWARC's reader read it all
    monkeypatch.setattr(warc, "UNVERIFIED_HOLD_CHARS", 100_000)  # a few pages: the only member is far larger
    assert resumes_at() == 0  # gave up holding pages back: smelt's decompression reads it from the start
    (smelt_docs, smelt_stats), (fastwarc_docs, fastwarc_stats) = [read(url, warc_engine=e, max_payload_bytes=100_000)
                                                                  for e in WARC_ENGINES]
    assert len(fastwarc_docs) == 20 and fastwarc_docs == smelt_docs and dict(fastwarc_stats) == dict(smelt_stats)


def _damaged_archive(rng: random.Random, pages: list[bytes]) -> bytes:
    """Some pages in gzip members of 1 to 20 records at random levels, then one random fault (or none)."""
    chosen, members = rng.sample(pages, rng.randint(1, 30)), []
    while chosen:
        k = rng.choice([1, 1, 1, 2, 5, 20])
        members.append(gzip.compress(b"".join(chosen[:k]), mtime=0, compresslevel=rng.choice([0, 1, 6])))
        chosen = chosen[k:]
    data = bytearray(b"".join(members))
    fault, at = rng.choice(["none", "cut", "overwrite", "bit", "junk", "gap"]), rng.randrange(len(data))
    if fault == "cut":
        del data[at:]
    elif fault == "overwrite":
        data[at: at + 4] = rng.randbytes(4)
    elif fault == "bit":
        data[at] ^= 1 << rng.randrange(8)
    elif fault == "junk":
        data += rng.randbytes(rng.randint(1, 50))
    elif fault == "gap":
        del data[at: at + rng.randint(1, 2000)]
    return bytes(data)


def test_randomly_damaged_gzip_archives_read_alike_with_either_engine(tmp_path):
    rng = random.Random(7)
    pages = [response(f"https://damaged.example/{i}", article_page(f"Page {i}", prose(i)).encode() * rng.choice([1, 5, 40, 300]))
             for i in range(60)]
    faults = Stats()
    for trial in range(40):
        path = tmp_path / f"damaged-{trial}.warc.gz"
        path.write_bytes(_damaged_archive(rng, pages))
        (smelt_docs, smelt_stats), (fastwarc_docs, fastwarc_stats) = _both_engines(path)
        assert fastwarc_docs == smelt_docs and dict(fastwarc_stats) == dict(smelt_stats), trial
        faults += {k: v for k, v in smelt_stats.items() if k.startswith("failed.")}
    assert {"failed.read_corrupt_gzip", "failed.read_truncated_gzip"} <= set(faults)  # the damage did damage


def test_reads_a_warc_over_http(tmp_path):
    write(tmp_path / "a.warc.gz", gzip_members(english_warc(0, 2)))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        (url,) = expand_inputs([f"{base}/a.warc.gz"])
        docs, stats = read(url)
        assert len(docs) == 2 and stats["bytes_in"] > 0
        with pytest.raises(InputError, match="missing.warc.gz"):
            expand_inputs([f"{base}/missing.warc.gz"])
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------------------------------------
# JSONL and Parquet


ROWS = [
    {"id": "doc-1", "url": "https://a.example/1", "text": "First document."},
    {"text": "No id given.", "source": "code", "meta": {"repo": "r"}},
    "",  # blank line: not a record
    '{"text": "unterminated',
    {"text": "   "},
    {"title": "no text field"},
]


def test_jsonl_records_become_documents_and_bad_lines_are_counted(tmp_path):
    url = write(tmp_path / "a.jsonl", jsonl(ROWS))
    docs, stats = read(url)
    assert [(d.id, d.url, d.text, d.source) for d in docs[:1]] == [("doc-1", "https://a.example/1", "First document.", "web")]
    assert docs[1].source == "code" and docs[1].meta == {"repo": "r", "format": "code"} and len(docs[1].id) == 32
    assert reason_counts(stats) == {"failed.read_bad_record": 2, "dropped.read_empty": 1}
    assert stats["in"] == 5


def _gzip_prefix_lines(data: bytes) -> int:
    return zlib.decompressobj(31).decompress(data).count(b"\n")


def _zstd_prefix_lines(data: bytes) -> int:
    return zstandard.ZstdDecompressor().decompressobj().decompress(data).count(b"\n")


@pytest.mark.parametrize("suffix,compress,prefix_lines", [
    (".jsonl.gz", lambda b: gzip.compress(b, mtime=0), _gzip_prefix_lines),
    (".jsonl.zst", lambda b: zstandard.ZstdCompressor().compress(b), _zstd_prefix_lines),
    (".jsonl.bz2", bz2.compress, lambda data: bz2.BZ2Decompressor().decompress(data).count(b"\n")),
    (".jsonl.xz", lzma.compress, lambda data: lzma.LZMADecompressor().decompress(data).count(b"\n")),
])
def test_compressed_jsonl_is_read_and_truncation_keeps_complete_lines(tmp_path, suffix, compress, prefix_lines):
    data = jsonl([{"text": f"document number {i} " + "x" * 200} for i in range(300)])
    docs, _ = read(write(tmp_path / f"a{suffix}", compress(data)))
    assert len(docs) == 300
    cut = compress(data)[: len(compress(data)) // 2]
    docs, stats = read(write(tmp_path / f"b{suffix}", cut))
    kind = {".gz": "gzip", ".zst": "zstd", ".bz2": "bz2", ".xz": "xz"}[suffix[suffix.rindex("."):]]
    assert len(docs) == prefix_lines(cut) < 300
    assert reason_counts(stats) == {f"failed.read_truncated_{kind}": 1}


@pytest.mark.parametrize("suffix,compress", [
    (".jsonl.gz", lambda b: gzip.compress(b, mtime=0)), (".jsonl.zst", zstandard.ZstdCompressor(write_checksum=True).compress),
    (".jsonl.bz2", bz2.compress), (".jsonl.xz", lzma.compress)])
def test_a_corrupt_member_of_a_concatenated_jsonl_costs_only_its_lines(tmp_path, suffix, compress):
    """Three files' worth concatenated (``cat a.gz b.gz c.gz``), the middle one's data damaged: its lines
    are counted, the members around it read. The whole rest of the file was lost before."""
    parts = [[{"text": f"part {p} line {i}"} for i in range(50)] for p in range(3)]
    members = [compress(jsonl(rows)) for rows in parts]
    middle = bytearray(members[1])
    middle[len(middle) // 2] ^= 0xFF
    docs, stats = read(write(tmp_path / f"a{suffix}", members[0] + bytes(middle) + members[2]))
    assert [d.text for d in docs] == [r["text"] for r in parts[0] + parts[2]]
    faults = reason_counts(stats)
    assert faults["failed.read_corrupt_file"] == 1 and set(faults) <= {"failed.read_corrupt_file",
                                                                        "failed.read_unverified_record"}
    assert stats["in"] == 100 + sum(faults.values())


def test_concatenated_zstd_frames_are_all_read(tmp_path):
    frames = b"".join(zstandard.ZstdCompressor().compress(jsonl([{"text": f"frame {i}"}])) for i in range(3))
    docs, stats = read(write(tmp_path / "a.jsonl.zst", frames))
    assert [d.text for d in docs] == ["frame 0", "frame 1", "frame 2"] and reason_counts(stats) == {}


def test_an_overlong_jsonl_line_is_skipped(tmp_path):
    url = write(tmp_path / "a.jsonl", jsonl([{"text": "y" * 5000}, {"text": "short"}]))
    docs, stats = read(url, max_payload_bytes=1000)
    assert [d.text for d in docs] == ["short"] and reason_counts(stats) == {"dropped.read_too_large": 1}


def test_parquet_rows_become_documents(tmp_path):
    table = pa.table({"id": ["p1", None], "text": ["Parquet text.", ""], "url": ["https://p.example/", None]})
    pq.write_table(table, tmp_path / "a.parquet")
    docs, stats = read("file://" + str(tmp_path / "a.parquet"))
    assert [(d.id, d.url, d.text) for d in docs] == [("p1", "https://p.example/", "Parquet text.")]
    assert reason_counts(stats) == {"dropped.read_empty": 1}


def test_parquet_without_text_column_and_corrupt_files_are_counted_not_raised(tmp_path):
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "a.parquet")
    assert reason_counts(read("file://" + str(tmp_path / "a.parquet"))[1]) == {"failed.read_corrupt_file": 1}
    url = write(tmp_path / "b.parquet", b"PAR1 this is not parquet")
    assert reason_counts(read(url)[1]) == {"failed.read_corrupt_file": 1}
    url = write(tmp_path / "c.warc.gz", b"not gzip at all")
    assert reason_counts(read(url)[1]) == {"failed.read_corrupt_gzip": 1}


def test_a_flipped_bit_in_a_parquet_file_with_page_checksums_never_gives_out_a_wrong_row(tmp_path):
    """Read without checking page CRCs, a file written with them gave out wrong rows for 146 of 301
    flipped bits (the same share as a file without them, which nothing can check). A bad row group
    costs only itself."""
    rng = random.Random(3)
    texts = [" ".join(rng.choice(["alpha", "beta", "river", "stone", "bread"]) for _ in range(40)) + f" {i}"
             for i in range(600)]
    buffer = io.BytesIO()
    pq.write_table(pa.table({"text": texts}), buffer, write_page_checksum=True, row_group_size=200)
    data = buffer.getvalue()
    groups = [texts[i:i + 200] for i in range(0, 600, 200)]
    counted = resumed = 0
    for at in range(4, len(data) - 8, len(data) // 150):
        flipped = bytearray(data)
        flipped[at] ^= 0x10
        docs, stats = read(write(tmp_path / "a.parquet", bytes(flipped)))
        given = [d.text for d in docs]
        assert given in [sum((g for j, g in enumerate(groups) if j not in lost), []) for lost in
                         ({0}, {1}, {2}, {0, 1, 2}, set())], at  # whole row groups, unchanged, or none
        counted += bool(reason_counts(stats))
        resumed += given[-200:] == texts[-200:] and len(given) < 600  # a bad group before the last one
    assert counted >= 140 and resumed >= 40


def test_a_parquet_string_that_is_not_utf8_is_counted_not_raised(tmp_path):
    """pyarrow reads the page and raises UnicodeDecodeError only when the row becomes a Python string."""
    buffer = io.BytesIO()
    pq.write_table(pa.table({"text": ["first row", "a" * 64 + " second row"]}), buffer, compression="none")
    data = bytearray(buffer.getvalue())
    data[data.index(b"a" * 64) + 10] = 0xFF
    docs, stats = read(write(tmp_path / "a.parquet", bytes(data)))
    assert docs == [] and reason_counts(stats) == {"failed.read_corrupt_file": 1}


# ---------------------------------------------------------------------------------------------
# Inputs


def test_expand_inputs_expands_globs_and_folders_and_reads_each_file_once(tmp_path):
    for name in ("a.warc.gz", "b.jsonl", "notes.txt", "sub/c.parquet"):
        write(tmp_path / name, b"x")
    base = "file://" + str(tmp_path)
    urls = expand_inputs([f"{base}/*.warc.gz", str(tmp_path), f"{base}/b.jsonl"])
    assert urls == [f"{base}/a.warc.gz", f"{base}/b.jsonl", f"{base}/sub/c.parquet"]


def test_expand_inputs_works_on_memory_urls():
    fs = fsspec.filesystem("memory")
    fs.pipe("/readers-test/x.warc", b"x")
    assert expand_inputs("memory://readers-test/*.warc") == ["memory:///readers-test/x.warc"]


@pytest.mark.parametrize("bad", ["/nonexistent/crawl.warc.gz", "/nonexistent/*.warc.gz", "s3://some-bucket/crawl.warc.gz"])
def test_an_unreadable_input_url_raises_an_error_naming_it(bad):
    with pytest.raises(InputError, match=re.escape(bad.rsplit("/", 1)[-1])):
        expand_inputs([bad])


def test_a_file_of_unknown_format_raises_a_clear_error(tmp_path):
    url = write(tmp_path / "notes.txt", b"x")
    assert input_format(url) is None
    with pytest.raises(InputError, match="reader.format"):
        read(url)
    assert input_format(url, "jsonl") == "jsonl"


def test_http_body_shorter_than_its_content_length_is_counted_as_truncated(tmp_path, warc_engine):
    import io

    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    from tasks.ingest.config import ReaderConfig
    from tasks.ingest.readers import read_documents

    body = b"<html><body><p>" + b"cut off " * 20
    out = io.BytesIO()
    writer = WARCWriter(out, gzip=True)
    for uri, declared in (("https://a.example/cut", len(body) + 500), ("https://a.example/ok", len(body))):
        headers = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=utf-8"),
                                              ("Content-Length", str(declared))], protocol="HTTP/1.1")
        writer.write_record(writer.create_warc_record(uri, "response", payload=io.BytesIO(body), http_headers=headers))
    path = tmp_path / "cut.warc.gz"
    path.write_bytes(out.getvalue())
    stats = Stats()
    docs = list(read_documents(str(path), ReaderConfig(warc_engine=warc_engine), stats))
    assert [d.url for d in docs] == ["https://a.example/ok"]
    assert stats["dropped.read_truncated_payload"] == 1


# ---------------------------------------------------------------------------------------------
# Remote inputs that misbehave: one sentence naming the URL, within the configured timeouts.


class _RawHTTP:
    """A one-file HTTP server on 127.0.0.1 that answers HEAD honestly, then either never answers a
    GET (``silent``) or sends a body shorter than its Content-Length and hangs up (``cut``)."""

    def __init__(self, mode: str, body: bytes) -> None:
        import socket

        self.mode, self.body, self.release = mode, body, threading.Event()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)  # accept wakes up to notice close()
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.release.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                request = conn.recv(65536)
                head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (len(self.body) * 10)
                if request.startswith(b"HEAD"):
                    conn.sendall(head)
                elif self.mode == "silent":
                    self.release.wait(30)
                else:
                    conn.sendall(head + self.body)

    def close(self) -> None:
        self.release.set()
        self.thread.join(timeout=35)
        self.sock.close()


@pytest.mark.parametrize(("mode", "message"), [("silent", "timed out"), ("cut", "failed part-way")])
def test_a_remote_input_that_hangs_or_is_cut_short_is_an_error_naming_it(mode, message):
    import time

    from tasks.ingest.readers import RemoteReadError

    server = _RawHTTP(mode, b"".join(english_warc(0, 2)))
    url = f"http://127.0.0.1:{server.port}/crawl.warc"
    try:
        start = time.monotonic()
        with pytest.raises(RemoteReadError, match=f"reading {re.escape(url)} {message}"):
            read(url, connect_timeout_s=2, read_timeout_s=1)
        assert time.monotonic() - start < 20
    finally:
        server.close()
