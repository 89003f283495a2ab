"""Bad inputs, one row each: what the reader yields and counts, or the one error it raises.

Every reader row also checks the accounting: ``in`` = ``out`` + every ``dropped.read_*`` and
``failed.read_*`` count, so no record is ever lost without a reason.
"""

from __future__ import annotations

import gzip
import io
import json
import random
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tasks import contract, records, verified_reads
from tasks.counters import Stats
from tasks.ingest.config import ReaderConfig
from tasks.ingest.readers import InputError, expand_inputs, read_documents
from tests.tasks.ingest.crawl_files import conversion, english_warc, gzip_members, other_record, response

R0, R1, R2 = english_warc(0, 3)
URLS = ["https://news.example/story-0", "https://news.example/story-1", "https://news.example/story-2"]
PAGE = b"<html><body><p>A short page that is long enough to keep.</p></body></html>"


def header(record: bytes, name: bytes, value: bytes | None) -> bytes:
    """``record`` with WARC header ``name`` set to ``value`` (removed when None)."""
    head, sep, rest = record.partition(b"\r\n\r\n")
    pattern = re.compile(rb"^" + re.escape(name) + rb": [^\r\n]*\r\n", re.MULTILINE)
    head += b"\r\n"
    head = pattern.sub(b"" if value is None else name + b": " + value + b"\r\n", head, count=1)
    return head[:-2] + sep + rest


def lie(record: bytes, delta: int) -> bytes:
    length = int(re.search(rb"Content-Length: (\d+)", record).group(1))
    return header(record, b"Content-Length", b"%d" % (length + delta))


def flip_inside_member(members: list[bytes], k: int) -> bytes:
    """gzip members joined, with bytes in the middle of member ``k``'s deflate data overwritten."""
    member = bytearray(members[k])
    middle = len(member) // 2
    member[middle: middle + 8] = b"\xff" * 8
    return b"".join(members[:k] + [bytes(member)] + members[k + 1:])


def members(*records: bytes) -> list[bytes]:
    return [gzip.compress(r, mtime=0) for r in records]


def parquet_bytes(table: pa.Table) -> bytes:
    out = io.BytesIO()
    pq.write_table(table, out)
    return out.getvalue()


# (case, file name, bytes, reader config, URLs of the documents read, reasons counted)
READER_CASES = [
    ("clean plain WARC", "a.warc", R0 + R1 + R2, {}, URLS, {}),
    ("clean per-record gzip WARC", "a.warc.gz", gzip_members([R0, R1, R2]), {}, URLS, {}),
    ("clean whole-file gzip WARC", "a.warc.gz", gzip.compress(R0 + R1 + R2, mtime=0), {}, URLS, {}),
    ("WARC/1.1 records", "a.warc", R0.replace(b"WARC/1.0", b"WARC/1.1", 1) + R1, {}, URLS[:2], {}),
    ("Content-Length 60 short", "a.warc", R0 + lie(R1, -60) + R2, {}, [URLS[0], URLS[2]], {"failed.read_bad_length": 1}),
    ("Content-Length 80 long", "a.warc", R0 + lie(R1, 80) + R2, {}, [URLS[0], URLS[2]], {"failed.read_bad_length": 1}),
    ("Content-Length 1e9 long, gzip", "a.warc.gz", gzip_members([R0, lie(R1, 10**9), R2]), {}, [URLS[0], URLS[2]],
     {"failed.read_bad_length": 1}),
    ("Content-Length past end of file", "a.warc", R0 + lie(R1, 100_000), {}, URLS[:1], {"failed.read_bad_length": 1}),
    ("lying length, whole-file gzip", "a.warc.gz", gzip.compress(R0 + lie(R1, 40) + R2, mtime=0), {},
     [URLS[0], URLS[2]], {"failed.read_bad_length": 1}),
    ("Content-Length not a number", "a.warc", R0 + header(R1, b"Content-Length", b"lots") + R2, {},
     [URLS[0], URLS[2]], {"failed.read_no_length": 1}),
    ("Content-Length missing", "a.warc", R0 + header(R1, b"Content-Length", None) + R2, {}, [URLS[0], URLS[2]],
     {"failed.read_no_length": 1}),
    ("WARC-Target-URI missing", "a.warc", R0 + header(R1, b"WARC-Target-URI", None) + R2, {}, [URLS[0], URLS[2]],
     {"failed.read_no_target_uri": 1}),
    ("WARC-Date not a date", "a.warc", R0 + header(R1, b"WARC-Date", b"yesterday") + R2, {}, [URLS[0], URLS[2]],
     {"failed.read_bad_date": 1}),
    ("WARC-Type missing", "a.warc", R0 + header(R1, b"WARC-Type", None) + R2, {}, [URLS[0], URLS[2]],
     {"failed.read_bad_header": 1}),
    ("version line mangled", "a.warc", R0 + R1.replace(b"WARC/1.0", b"WARX/1.0", 1) + R2, {}, [URLS[0], URLS[2]],
     {"failed.read_bad_header": 1}),
    ("garbage between records", "a.warc", R0 + b"\x00\x01junk bytes\r\n" + R1 + R2, {}, URLS,
     {"failed.read_bad_header": 1}),
    ("header block never ends", "a.warc", R0 + b"WARC/1.0\r\n" + b"X-Pad: y\r\n" * 8000, {}, URLS[:1],
     {"failed.read_bad_header": 1}),
    ("record trailer missing", "a.warc", R0 + R1[:-4] + R2, {}, [URLS[0], URLS[2]], {"failed.read_bad_length": 1}),
    ("corrupt deflate data in member 2", "a.warc.gz", flip_inside_member(members(R0, R1, R2), 1), {},
     [URLS[0], URLS[2]], {"failed.read_corrupt_gzip": 1}),
    ("corrupt gzip header of member 2", "a.warc.gz",
     b"".join(members(R0)) + b"\x00\x00" + members(R1)[0][2:] + b"".join(members(R2)), {}, [URLS[0], URLS[2]],
     {"failed.read_corrupt_gzip": 1}),
    ("two corrupt members in a row", "a.warc.gz",
     flip_inside_member([*members(R0), flip_inside_member(members(R1), 0), *members(R2, R0)], 2), {},
     [URLS[0], URLS[0]], {"failed.read_corrupt_gzip": 1}),
    ("gzip truncated in the last member", "a.warc.gz", gzip_members([R0, R1, R2])[:-200], {}, URLS[:2],
     {"failed.read_truncated_gzip": 1}),
    ("plain WARC cut inside the last body", "a.warc", R0 + R1 + R2[:-300], {}, URLS[:2], {"failed.read_bad_length": 1}),
    ("empty .warc.gz", "a.warc.gz", b"", {}, [], {}),
    ("empty .warc", "a.warc", b"", {}, [], {}),
    ("not gzip at all", "a.warc.gz", b"definitely not gzip", {}, [], {"failed.read_corrupt_gzip": 1}),
    ("request and metadata records", "a.warc", other_record("https://x/") + other_record("https://x/", "metadata") + R0,
     {}, URLS[:1], {}),
    ("HTTP 404", "a.warc", response("https://x.example/404", PAGE, status="404 Not Found") + R0, {}, URLS[:1],
     {"dropped.read_http_status": 1}),
    ("image payload", "a.warc", response("https://x.example/a.png", b"\x89PNG" + bytes(40), "image/png") + R0, {},
     URLS[:1], {"dropped.read_non_html": 1}),
    ("undecodable payload", "a.warc", response("https://x.example/", bytes(range(256)) * 8, "text/html") + R0, {},
     URLS[:1], {"dropped.read_undecodable": 1}),
    ("payload over max_payload_bytes", "a.warc", R0 + R1, {"max_payload_bytes": 200}, [],
     {"dropped.read_too_large": 2}),
    ("empty payload", "a.warc", response("https://x.example/empty", b"   ") + R0, {}, URLS[:1], {"dropped.read_empty": 1}),
    ("WET record without target URI", "a.warc.wet.gz",
     gzip_members([header(conversion("https://a.example/1", "Some text."), b"WARC-Target-URI", None),
                   conversion("https://a.example/2", "More text.")]), {}, ["https://a.example/2"],
     {"failed.read_no_target_uri": 1}),
    ("JSONL bad line in the middle", "a.jsonl", b'{"text": "one"}\n{"text": \n{"text": "two"}\n', {}, ["", ""],
     {"failed.read_bad_record": 1}),
    ("JSONL line that is a list", "a.jsonl", b'[1, 2]\n{"text": "two"}\n', {}, [""], {"failed.read_bad_record": 1}),
    ("JSONL text not a string", "a.jsonl", b'{"text": 5}\n{"text": "two"}\n', {}, [""], {"failed.read_bad_record": 1}),
    ("JSONL invalid UTF-8", "a.jsonl", b'{"text": "\xff\xfe"}\n{"text": "two"}\n', {}, [""],
     {"dropped.read_undecodable": 1}),
    ("JSONL gzip without its trailer", "a.jsonl.gz",
     gzip.compress(b"".join(b'{"text": "line %d"}\n' % i for i in range(50)), mtime=0)[:-8], {}, [""] * 50,
     {"failed.read_truncated_gzip": 1}),
    ("JSONL zstd truncated", "a.jsonl.zst", zstandard.ZstdCompressor().compress(b'{"text": "one"}\n' * 50)[:-5], {},
     None, {"failed.read_truncated_zstd": 1}),
    ("JSONL overlong line", "a.jsonl", b'{"text": "' + b"x" * 5000 + b'"}\n{"text": "two"}\n', {"max_payload_bytes": 1000},
     [""], {"dropped.read_too_large": 1}),
    ("Parquet that is not Parquet", "a.parquet", b"PAR1 not really", {}, [], {"failed.read_corrupt_file": 1}),
    ("Parquet without a text column", "a.parquet", parquet_bytes(pa.table({"body": ["x"]})), {}, [],
     {"failed.read_corrupt_file": 1}),
    ("Parquet with its footer cut", "a.parquet", parquet_bytes(pa.table({"text": ["a", "b"]}))[:-20], {}, [],
     {"failed.read_corrupt_file": 1}),
]


@pytest.mark.parametrize(("case", "name", "data", "cfg", "urls", "reasons"), READER_CASES, ids=[c[0] for c in READER_CASES])
def test_a_bad_input_is_counted_and_costs_only_itself(tmp_path, case, name, data, cfg, urls, reasons):
    path = tmp_path / name
    path.write_bytes(data)
    stats = Stats()
    docs = list(read_documents(str(path), ReaderConfig(**cfg), stats))
    counted = {k: v for k, v in stats.items() if k.startswith(("dropped.", "failed."))}
    assert counted == reasons
    if urls is not None:
        assert [d.url for d in docs] == urls
    assert stats.get("in", 0) == stats.get("out", 0) + sum(counted.values()) and stats.get("out", 0) == len(docs)


def flipped_jsonl_gz(path) -> set[str]:
    """A JSONL.gz past one read chunk inflated, one bit flipped a quarter in: the deflate data still
    decodes (to wrong lines) and only the CRC at the end tells. Returns the true texts."""
    rng = random.Random(0)
    texts = [f"line {i} {rng.randbytes(12).hex()}" for i in range(30_000)]
    data = bytearray(gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in texts).encode(), mtime=0))
    data[len(data) // 4] ^= 0x10
    path.write_bytes(bytes(data))
    return set(texts)


def test_records_of_a_jsonl_gz_whose_checksum_fails_are_counted_never_given_out(tmp_path):
    """Before they were held, 22,069 records went out here, 14,543 of them wrong."""
    flipped_jsonl_gz(tmp_path / "a.jsonl.gz")
    stats = Stats()
    assert list(read_documents(str(tmp_path / "a.jsonl.gz"), ReaderConfig(), stats)) == []
    assert stats["in"] > 20_000 and stats.get("out", 0) == 0
    assert {k: v for k, v in stats.items() if k.startswith("failed.")} == {
        "failed.read_corrupt_file": 1, "failed.read_unverified_record": stats["in"] - 1}


def test_past_the_hold_limit_jsonl_records_go_out_before_their_checksum(tmp_path, monkeypatch):
    monkeypatch.setattr(records, "UNVERIFIED_HOLD_CHARS", 0)
    texts = flipped_jsonl_gz(tmp_path / "a.jsonl.gz")
    stats = Stats()
    docs = list(read_documents(str(tmp_path / "a.jsonl.gz"), ReaderConfig(max_payload_bytes=1000), stats))
    assert any(d.text not in texts for d in docs)  # the fault is counted, not caught, past the limit
    assert stats["failed.read_corrupt_file"] == 1
    assert stats.get("failed.read_unverified_record", 0) == stats["in"] - 1 - len(docs) < 20  # ≤ 1,000 bytes held


def dataset(tmp_path) -> contract.Manifest:
    url = str(tmp_path / "ds")
    shard = contract.write_shard(url, "part-0.bin", lambda f: f.write(bytes(range(256)) * 64) and 1)
    return contract.commit(url, "tokens", "fp", [shard], {})


def _missing(tmp_path):
    (tmp_path / "ds" / "part-0.bin").unlink()


def _truncated(tmp_path):
    path = tmp_path / "ds" / "part-0.bin"
    path.write_bytes(path.read_bytes()[:-1])


def _flipped(tmp_path):
    path = tmp_path / "ds" / "part-0.bin"
    blob = bytearray(path.read_bytes())
    blob[100] ^= 0x80
    path.write_bytes(bytes(blob))


def _rewrite_manifest(change):
    def apply(tmp_path):
        path = tmp_path / "ds" / contract.MANIFEST
        path.write_text(change(path.read_text()))
    return apply


DATASET_CASES = [
    ("shard missing", _missing, "part-0.bin of .* is missing"),
    ("shard one byte short", _truncated, r"part-0.bin of .* is 16383 bytes, the manifest says 16384"),
    ("shard with one flipped bit", _flipped, "part-0.bin of .* does not match its manifest checksum"),
    ("manifest truncated", _rewrite_manifest(lambda t: t[: len(t) // 2]), "manifest.json is unreadable"),
    ("manifest not JSON", _rewrite_manifest(lambda t: "<html>"), "manifest.json is unreadable"),
    ("manifest with a shard lacking fields", _rewrite_manifest(
        lambda t: json.dumps({**json.loads(t), "shards": [{"name": "part-0.bin"}]})), "manifest.json is unreadable"),
    ("manifest with an unknown checksum algorithm", _rewrite_manifest(lambda t: re.sub(r'"xxh3_128:', '"md5:', t)),
     "unknown checksum algorithm 'md5'"),
]


@pytest.mark.parametrize(("case", "damage", "message"), DATASET_CASES, ids=[c[0] for c in DATASET_CASES])
def test_a_damaged_dataset_is_one_error_naming_what_is_wrong(tmp_path, case, damage, message):
    manifest = dataset(tmp_path)
    damage(tmp_path)
    with pytest.raises(contract.DatasetError, match=message):
        verified_reads.read_shard(contract.open_dataset(manifest.meta["url"]), "part-0.bin")


@pytest.mark.parametrize("url", ["foo://bucket/crawl.warc.gz", "/no/such/dir/*.warc.gz", "/no/such/file.warc"])
def test_an_input_url_naming_nothing_readable_is_one_sentence(url):
    with pytest.raises(InputError, match=re.escape(url.rsplit("/", 1)[-1])):
        expand_inputs([url])
