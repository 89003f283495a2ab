"""Code readers on real files the tests build: JSONL, Parquet, tar and zip archives, folder trees."""

from __future__ import annotations

import gzip
import io
import json
import os
import random
import tarfile
import tracemalloc
import uuid
import zipfile

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tasks.counters import Stats
from tasks.ingest.code import readers as code_readers
from tasks.ingest.code.config import CodeReaderConfig
from tasks.ingest.code.readers import (
    NOT_REGULAR,
    CodeInput,
    archive_repo,
    expand_code_inputs,
    list_tree,
    plan_code_inputs,
    read_code,
)
from tasks.ingest.readers import InputError

GOOD = "def add(a, b):\n    return a + b\n"
LATIN1 = "# caf\u00e9 cr\u00e8me\nprint('na\u00efve')\n".encode("latin-1")  # not UTF-8
PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))


def read_item(item: CodeInput, **cfg):
    stats = Stats()
    docs = list(read_code(item, CodeReaderConfig(**cfg), stats))
    return docs, stats


def read_url(url: str, **cfg):
    items = plan_code_inputs([url], CodeReaderConfig(**cfg))
    stats = Stats()
    docs = [d for item in items for d in read_code(item, CodeReaderConfig(**cfg), stats)]
    return docs, stats


def reasons(stats: Stats) -> dict:
    return {k: v for k, v in sorted(stats.items()) if k.startswith(("dropped.", "failed."))}


def jsonl_gz(path, lines: list[bytes | dict]) -> str:
    body = b"".join(line if isinstance(line, bytes) else (json.dumps(line) + "\n").encode() for line in lines)
    path.write_bytes(gzip.compress(body, mtime=0))
    return str(path)


def tar_bytes(members: dict[str, bytes], mode: str = "w:gz", extra=()) -> bytes:
    """A tar archive; ``w:zst`` is zstd with a checksum, as the zstd tool writes it (tarfile has no zstd)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w" if mode == "w:zst" else mode) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra:
            tar.addfile(info)
    if mode == "w:zst":
        return zstandard.ZstdCompressor(write_checksum=True).compress(buffer.getvalue())
    return buffer.getvalue()


def zip_bytes(members: dict[str, bytes], compression=zipfile.ZIP_DEFLATED) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


ARCHIVE_MEMBERS = {
    "./repo/src/app.py": GOOD.encode(),
    "repo/assets/logo.png": PNG,
    "repo/legacy.py": LATIN1,
    "repo/big.py": b"x = 1\n" * 200,
    "repo/.git/config": b"[core]\n",
    "repo/empty.py": b"   \n",
    "repo/bom.py": b"\xef\xbb\xbfimport os\n",
}


# ---------------------------------------------------------------------------------------------
# JSONL and Parquet records


def test_jsonl_records_become_code_documents_with_repo_path_and_license(tmp_path):
    url = jsonl_gz(tmp_path / "files.jsonl.gz", [
        {"repo": "acme/tools", "path": "src/add.py", "content": GOOD, "license": "MIT"},
        {"repo": "acme/tools", "path": "./src/sub.py", "content": GOOD.replace("+", "-")},
    ])
    docs, stats = read_url(url)
    assert [d.meta for d in docs] == [
        {"repo": "acme/tools", "path": "src/add.py", "license": "MIT", "language": ""},
        {"repo": "acme/tools", "path": "src/sub.py", "license": None, "language": ""},
    ]
    assert all(d.source == "code" and d.text.startswith("def ") for d in docs)
    assert stats["in"] == 2 and stats["out"] == 2
    assert stats["bytes_in"] == os.path.getsize(url)
    again, _ = read_url(url)
    assert [d.id for d in again] == [d.id for d in docs] and docs[0].id != docs[1].id


def test_bad_jsonl_records_are_counted_under_their_reason_and_skipped(tmp_path):
    url = jsonl_gz(tmp_path / "files.jsonl.gz", [
        {"repo": "r", "path": "ok.py", "content": GOOD},
        {"repo": "r", "path": "blob.py", "content": "\x89PNG\x00\x00data"},
        b'{"repo": "r", "path": "latin.py", "content": "caf\xe9"}\n',
        {"repo": "r", "path": "big.py", "content": "x" * 101},
        b'{"repo": "r", "path": "huge.py", "content": "' + b"y" * 800 + b'"}\n',
        b"{not json\n",
        {"repo": "r", "path": "none.py"},
        {"repo": "r", "path": "blank.py", "content": "  \n\t"},
        b"\n",
    ])
    docs, stats = read_url(url, max_file_bytes=100)
    assert [d.meta["path"] for d in docs] == ["ok.py"]
    assert reasons(stats) == {
        "dropped.code_binary": 1, "dropped.code_empty": 1, "dropped.code_too_large": 2,
        "dropped.code_undecodable": 1, "failed.code_bad_record": 2,
    }
    assert stats["in"] == 8  # the blank line is not a record


def test_a_truncated_jsonl_gz_keeps_the_records_before_the_cut(tmp_path):
    body = gzip.compress(b"".join((json.dumps({"repo": "r", "path": f"{i}.py", "content": GOOD * 50}) + "\n").encode()
                                  for i in range(40)), mtime=0)
    url = tmp_path / "cut.jsonl.gz"
    url.write_bytes(body[: len(body) // 2])
    docs, stats = read_url(str(url))
    assert 0 < len(docs) < 40
    assert reasons(stats) == {"failed.code_truncated_file": 1}


def test_record_field_names_are_configurable(tmp_path):
    url = jsonl_gz(tmp_path / "stack.jsonl.gz", [
        {"max_stars_repo_name": "a/b", "max_stars_repo_path": "x.go", "text": "package main\n",
         "max_stars_repo_licenses": ["MIT", "Apache-2.0"]},
    ])
    (doc,), _ = read_url(url, content_field="text", path_field="max_stars_repo_path",
                         repo_field="max_stars_repo_name", license_field="max_stars_repo_licenses")
    assert doc.meta == {"repo": "a/b", "path": "x.go", "license": ["MIT", "Apache-2.0"], "language": ""}


def test_parquet_records_with_text_or_binary_content_are_read(tmp_path):
    path = tmp_path / "files.parquet"
    pq.write_table(pa.table({
        "repo": ["r", "r", "r"], "path": ["a.py", "b.py", "c.py"],
        "content": [GOOD.encode(), LATIN1, PNG],
    }), path)
    docs, stats = read_url(str(path))
    assert [d.meta["path"] for d in docs] == ["a.py"] and docs[0].text == GOOD
    assert reasons(stats) == {"dropped.code_binary": 1, "dropped.code_undecodable": 1}

    pq.write_table(pa.table({"repo": ["r"], "path": ["a.py"], "content": [GOOD]}), path)
    docs, _ = read_url(str(path))
    assert [d.text for d in docs] == [GOOD]


def test_a_parquet_file_without_the_content_column_is_counted_not_raised(tmp_path):
    path = tmp_path / "files.parquet"
    pq.write_table(pa.table({"repo": ["r"], "path": ["a.py"], "text": [GOOD]}), path)
    docs, stats = read_url(str(path))
    assert docs == [] and reasons(stats) == {"failed.code_corrupt_file": 1}


# ---------------------------------------------------------------------------------------------
# Archives


@pytest.mark.parametrize("name,mode", [("repo.tar.gz", "w:gz"), ("repo.tgz", "w:gz"), ("repo.tar", "w"),
                                       ("repo.tar.xz", "w:xz"), ("repo.tar.bz2", "w:bz2"), ("repo.tar.zst", "w:zst")])
def test_tar_archives_are_streamed_member_by_member_with_bad_files_counted(tmp_path, name, mode):
    link = tarfile.TarInfo("repo/link.py")
    link.type, link.linkname = tarfile.SYMTYPE, "src/app.py"
    folder = tarfile.TarInfo("repo/docs")
    folder.type = tarfile.DIRTYPE
    (tmp_path / name).write_bytes(tar_bytes(ARCHIVE_MEMBERS, mode, extra=[link, folder]))
    docs, stats = read_url(str(tmp_path / name), max_file_bytes=1000)
    assert [(d.meta["repo"], d.meta["path"]) for d in docs] == [("repo", "repo/src/app.py"), ("repo", "repo/bom.py")]
    assert docs[1].text == "import os\n"  # the byte-order mark is not content
    assert docs[0].url.endswith(f"{name}#repo/src/app.py")
    assert reasons(stats) == {
        "dropped.code_binary": 1, "dropped.code_empty": 1, "dropped.code_skipped_dir": 1,
        "dropped.code_too_large": 1, "dropped.code_undecodable": 1,
    }
    assert stats["in"] == 8 and stats["not_regular_files"] == 1


def seeded_members(count: int) -> dict[str, bytes]:
    """Source files with an incompressible tail, so a gzip cut lands in every member's bytes."""
    rng = random.Random(count)
    return {f"r/m{i:02d}.py": (f"value_{i} = {i}\n" * 40).encode() + rng.randbytes(400).hex().encode()
            for i in range(count)}


def read_bytes(path, data: bytes, **cfg):
    """Documents and counts of ``data`` written at ``path`` (its name picks the reader)."""
    path.write_bytes(data)
    return read_url(str(path), **cfg)


def kept_in_order(docs, members: dict[str, bytes]) -> int:
    """How many documents were read, checking they are the archive's first members, unchanged."""
    assert [(d.meta["path"], d.text.encode()) for d in docs] == list(members.items())[: len(docs)]
    return len(docs)


def test_a_tar_cut_anywhere_before_its_end_marker_is_one_counted_truncation(tmp_path):
    """Cuts at member boundaries, inside headers and inside data; tarfile alone takes a cut at a
    boundary or in a header for the archive's end and reads on without a word."""
    members = seeded_members(5)
    data = tar_bytes(members, mode="w")
    data_ends, offset = [], 0
    for content in members.values():
        data_ends.append(offset + 512 + len(content))
        offset += 512 + -(-len(content) // 512) * 512
    end_marker = offset
    path = tmp_path / "cut.tar"
    for cut in range(512, end_marker + 512, 256):
        docs, stats = read_bytes(path, data[:cut])
        assert reasons(stats) == {"failed.code_truncated_file": 1}, cut
        assert kept_in_order(docs, members) == sum(end <= cut for end in data_ends), cut
    for cut in (end_marker + 512, len(data)):  # a first zero block ends the archive, as for GNU tar
        docs, stats = read_bytes(path, data[:cut])
        assert reasons(stats) == {} and kept_in_order(docs, members) == len(members)


COMPRESSED_TARS = [("a.tar.gz", "w:gz"), ("a.tar.xz", "w:xz"), ("a.tar.bz2", "w:bz2"), ("a.tar.zst", "w:zst")]


@pytest.mark.parametrize("name,mode", COMPRESSED_TARS)
def test_a_compressed_tar_cut_anywhere_is_one_counted_truncation_after_the_members_before_it(tmp_path, name, mode):
    """Every cut past the format's magic, and each of the last 64 bytes (xz's index and footer, bz2's and
    zstd's checksums): tarfile inflating xz or bz2 itself read the members and stopped at the tar end
    marker, so a cut in the trailer passed, and a bz2 cut before its first block end read as corrupt."""
    members = seeded_members(5)
    data = tar_bytes(members, mode)
    path = tmp_path / name
    kept = []
    for cut in sorted({*range(6, len(data), 37), *range(len(data) - 64, len(data))}):
        docs, stats = read_bytes(path, data[:cut])
        assert reasons(stats) == {"failed.code_truncated_file": 1}, cut
        kept.append(kept_in_order(docs, members))
    assert kept == sorted(kept) and kept[0] == 0 and kept[-1] == len(members)  # decoded before a cut: given out
    docs, stats = read_bytes(path, data)
    assert reasons(stats) == {} and kept_in_order(docs, members) == len(members)


@pytest.mark.parametrize("name,mode", COMPRESSED_TARS)
def test_a_flipped_bit_in_a_compressed_tar_is_counted_or_harmless_never_a_wrong_document(tmp_path, name, mode):
    """At every 7th byte, and each of the last 16: tarfile's gzip stream checks no CRC, so a flip inside a
    member's text was read as good. A flip that changes no output (gzip's timestamp, bz2's block-size
    digit) is harmless; any other is one counted fault, and what is given out is the archive's own."""
    members = seeded_members(5)
    data = tar_bytes(members, mode)
    path = tmp_path / name
    positions = sorted({*range(0, len(data), 7), *range(len(data) - 16, len(data))})
    harmless = 0
    for at in positions:
        flipped = bytearray(data)
        flipped[at] ^= 0x01
        docs, stats = read_bytes(path, bytes(flipped))
        given = kept_in_order(docs, members)
        if reasons(stats):
            assert sum(reasons(stats).values()) == 1 and set(reasons(stats)) <= {
                "failed.code_corrupt_file", "failed.code_truncated_file", "failed.code_unverified_member"}, at
        else:
            assert given == len(members), at
            harmless += 1
    assert harmless <= 6, harmless


def flipped_big_tar_gz(tmp_path) -> tuple[str, dict[str, bytes]]:
    """A tar.gz past one read chunk inflated, a bit flipped a quarter in: the deflate data still
    decodes, to one wrong member, and only the CRC at the end tells."""
    members = seeded_members(600)
    data = bytearray(tar_bytes(members))
    data[len(data) // 4] ^= 0x10
    path = tmp_path / "flipped.tar.gz"
    path.write_bytes(bytes(data))
    return str(path), members


def test_documents_of_a_tar_gz_whose_checksum_fails_are_counted_never_given_out(tmp_path):
    url, members = flipped_big_tar_gz(tmp_path)
    docs, stats = read_url(url)
    assert docs == []
    assert reasons(stats) == {"failed.code_corrupt_file": 1, "failed.code_unverified_member": stats["in"]}
    assert stats["in"] > 400 and stats.get("out", 0) == 0  # every member read before the end is accounted for


def test_past_the_hold_limit_a_tar_gz_gives_its_documents_out_before_its_checksum(tmp_path, monkeypatch):
    monkeypatch.setattr(code_readers, "UNVERIFIED_HOLD_CHARS", 0)
    url, members = flipped_big_tar_gz(tmp_path)
    docs, stats = read_url(url, max_file_bytes=10_000)
    assert sum(members[d.meta["path"]].decode() != d.text for d in docs) == 1  # the fault is counted, not caught
    assert stats["failed.code_corrupt_file"] == 1 and len(docs) > 400
    assert stats.get("failed.code_unverified_member", 0) == stats["in"] - len(docs) < 10  # ≤ 10,000 characters held


def test_a_garbled_member_header_ends_the_tar_with_a_counted_fault(tmp_path):
    members = seeded_members(3)
    data = bytearray(tar_bytes(members, mode="w"))
    second = 512 + -(-len(members["r/m00.py"]) // 512) * 512
    data[second + 100] ^= 0xFF  # inside the mode field: the header checksum no longer holds
    path = tmp_path / "garbled.tar"
    path.write_bytes(bytes(data))
    docs, stats = read_url(str(path))
    assert kept_in_order(docs, members) == 1
    assert reasons(stats) == {"failed.code_corrupt_file": 1}


def test_reading_a_tar_holds_no_index_that_grows_with_its_member_count(tmp_path):
    """tarfile keeps every header in a stream too: 10,000 more members held 4.4 MB more."""
    peaks = []
    for count in (2_000, 12_000):
        members = {f"r/f{i:05d}.py": b"x = %d\n" % i for i in range(count)}
        path = tmp_path / f"many-{count}.tar"  # not gzip, whose documents are held until its checksum
        path.write_bytes(tar_bytes(members, mode="w"))
        tracemalloc.start()
        docs = sum(1 for _ in read_code(plan_code_inputs([str(path)], CodeReaderConfig())[0],
                                        CodeReaderConfig(), Stats()))
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert docs == count
    assert peaks[1] - peaks[0] < 2 << 20, peaks


def test_zip_archives_are_read_member_by_member_with_bad_files_counted(tmp_path):
    path = tmp_path / "repo-1.0.zip"
    path.write_bytes(zip_bytes(ARCHIVE_MEMBERS))
    docs, stats = read_url(str(path), max_file_bytes=1000)
    assert [(d.meta["repo"], d.meta["path"]) for d in docs] == [("repo-1.0", "repo/src/app.py"),
                                                              ("repo-1.0", "repo/bom.py")]
    assert reasons(stats) == {
        "dropped.code_binary": 1, "dropped.code_empty": 1, "dropped.code_skipped_dir": 1,
        "dropped.code_too_large": 1, "dropped.code_undecodable": 1,
    }


def test_a_zip_member_whose_checksum_fails_is_counted_and_the_rest_are_read(tmp_path):
    data = bytearray(zip_bytes({"a.py": b"alpha = 1\n" * 5, "b.py": b"beta = 2\n" * 5}, zipfile.ZIP_STORED))
    position = data.index(b"alpha = 1")
    data[position] = ord("A")  # stored bytes change; the recorded CRC no longer matches
    path = tmp_path / "bad.zip"
    path.write_bytes(bytes(data))
    docs, stats = read_url(str(path))
    assert [d.meta["path"] for d in docs] == ["b.py"]
    assert reasons(stats) == {"failed.code_bad_member": 1}


def test_a_file_that_is_not_a_zip_archive_is_a_corrupt_file(tmp_path):
    path = tmp_path / "fake.zip"
    path.write_bytes(b"this is not a zip archive at all" * 10)
    docs, stats = read_url(str(path))
    assert docs == [] and reasons(stats) == {"failed.code_corrupt_file": 1}


def test_archive_repo_names_drop_the_archive_suffix():
    assert archive_repo("s3://b/requests-2.31.0.tar.gz") == "requests-2.31.0"
    assert archive_repo("file:///x/Repo.ZIP") == "Repo"
    assert archive_repo("file:///x/tool.tgz") == "tool"


# ---------------------------------------------------------------------------------------------
# Folder trees


def make_tree(root) -> None:
    files = {
        "pkg/__init__.py": b"",
        "pkg/core.py": GOOD.encode(),
        "pkg/legacy.py": LATIN1,
        "pkg/data/logo.png": PNG,
        "README.md": b"# Tool\n\nAdds numbers.\n",
        ".git/objects/ab/cdef": b"x\x9c\x00binary",
        ".git/HEAD": b"ref: refs/heads/main\n",
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    (root / "pkg" / "alias.py").symlink_to(root / "pkg" / "core.py")


def test_a_folder_tree_is_read_as_one_repository_with_vcs_folders_never_entered(tmp_path):
    root = tmp_path / "tool"
    make_tree(root)
    docs, stats = read_url(str(root))
    assert sorted(d.meta["path"] for d in docs) == ["README.md", "pkg/core.py"]
    assert {d.meta["repo"] for d in docs} == {"tool"}
    core = next(d for d in docs if d.meta["path"] == "pkg/core.py")
    assert core.url == f"file://{root}/pkg/core.py" and core.text == GOOD
    assert reasons(stats) == {"dropped.code_binary": 1, "dropped.code_empty": 1, "dropped.code_undecodable": 1}
    assert stats["not_regular_files"] == 1  # the link is not followed
    assert stats["in"] == 6


def test_listing_a_tree_skips_vcs_folders_and_marks_links(tmp_path):
    root = tmp_path / "tool"
    make_tree(root)
    stats = Stats()
    listing = dict(list_tree(str(root), CodeReaderConfig(), stats))
    assert not any(rel.startswith(".git/") for rel in listing)
    assert listing["pkg/alias.py"] == NOT_REGULAR and listing["pkg/core.py"] == len(GOOD)
    assert stats["skipped_dirs"] == 1


def test_a_tree_is_split_into_chunks_that_cover_every_file_once(tmp_path):
    root = tmp_path / "many"
    for i in range(7):
        (root / f"d{i % 2}").mkdir(parents=True, exist_ok=True)
        (root / f"d{i % 2}" / f"f{i}.py").write_text(f"value_{i} = {i}\n" * 10)
    items = plan_code_inputs([str(root)], CodeReaderConfig(dir_chunk_files=3))
    assert [len(item.files) for item in items] == [3, 3, 1]
    assert len({item.key for item in items}) == 3
    by_bytes = plan_code_inputs([str(root)], CodeReaderConfig(dir_chunk_bytes=300))
    assert all(sum(size for _, size in item.files) <= 300 for item in by_bytes) and len(by_bytes) > 1
    for plan in (items, by_bytes):
        stats = Stats()
        docs = [d for item in plan for d in read_code(item, CodeReaderConfig(), stats)]
        assert sorted(d.meta["path"] for d in docs) == sorted(f"d{i % 2}/f{i}.py" for i in range(7))


def test_a_tree_on_an_in_memory_filesystem_is_read():
    root = f"memory://tree-{uuid.uuid4().hex[:8]}"
    fs = fsspec.filesystem("memory")
    fs.pipe(f"{root}/src/main.rs".removeprefix("memory://"), b"fn main() {}\n")
    fs.pipe(f"{root}/src/blob.bin".removeprefix("memory://"), PNG)
    try:
        docs, stats = read_url(root)
        assert [d.meta["path"] for d in docs] == ["src/main.rs"]
        assert reasons(stats) == {"dropped.code_binary": 1}
    finally:
        fs.rm(root.removeprefix("memory://"), recursive=True)


def test_a_file_gone_between_listing_and_reading_is_counted(tmp_path):
    root = tmp_path / "t"
    root.mkdir()
    (root / "a.py").write_text(GOOD)
    (root / "b.py").write_text(GOOD)
    (item,) = plan_code_inputs([str(root)], CodeReaderConfig())
    (root / "b.py").unlink()
    docs, stats = read_item(item)
    assert [d.meta["path"] for d in docs] == ["a.py"]
    assert reasons(stats) == {"failed.code_missing_file": 1}


# ---------------------------------------------------------------------------------------------
# Inputs


def test_folders_of_records_expand_to_their_files_and_other_folders_are_trees(tmp_path):
    records = tmp_path / "dump"
    records.mkdir()
    for name in ("b.jsonl.gz", "a.parquet", "_SUCCESS", ".DS_Store"):
        (records / name).write_bytes(b"")
    tree = tmp_path / "repo"
    tree.mkdir()
    (tree / "main.py").write_text(GOOD)
    (tree / "fixtures.zip").write_bytes(b"")
    assert expand_code_inputs([str(records), str(tree)]) == [
        f"file://{records}/a.parquet", f"file://{records}/b.jsonl.gz", f"file://{tree}"]
    assert expand_code_inputs([str(records)], CodeReaderConfig(folders="tree")) == [f"file://{records}"]
    assert expand_code_inputs([str(tree)], CodeReaderConfig(folders="records")) == [f"file://{tree}/fixtures.zip"]


def test_globs_expand_to_record_files_and_folders_in_order(tmp_path):
    for name in ("x-1.tar.gz", "x-2.zip", "x-3.txt"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "x-4").mkdir()
    (tmp_path / "x-4" / "a.py").write_text(GOOD)
    found = expand_code_inputs([str(tmp_path / "x-*")])
    assert found == [f"file://{tmp_path}/{n}" for n in ("x-1.tar.gz", "x-2.zip", "x-4")]


@pytest.mark.parametrize("make,message", [
    (lambda p: str(p / "missing.jsonl"), "does not exist"),
    (lambda p: str(p / "nothing-*.jsonl"), "matches no"),
    (lambda p: (p / "notes.txt").write_text("hi") and str(p / "notes.txt"), "cannot tell how to read"),
    (lambda p: (p / "empty").mkdir() or str(p / "empty"), "holds no files"),
    (lambda p: "nosuchprotocol://bucket/code.jsonl", "Protocol not known"),
])
def test_an_unreadable_input_url_is_one_clear_error_naming_it(tmp_path, make, message):
    url = make(tmp_path)
    with pytest.raises(InputError, match=message) as raised:
        expand_code_inputs([url])
    assert url.rsplit("/", 1)[-1].replace("*", "") in str(raised.value).replace("*", "")


def test_a_records_folder_without_records_is_an_error(tmp_path):
    (tmp_path / "a.py").write_text(GOOD)
    with pytest.raises(InputError, match="no JSONL, Parquet, tar or zip files"):
        expand_code_inputs([str(tmp_path)], CodeReaderConfig(folders="records"))
