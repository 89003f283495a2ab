"""Readers of source code at any fsspec URL → a stream of ``Document``s (``source = "code"``).

Inputs: JSONL (optionally .gz/.zst/.bz2/.xz) and Parquet files of source-file records (``repo``,
``path``, ``content``, optional ``license``, ``url``; field names in config), tar archives (.tar, .tar.gz,
.tgz, .tar.bz2, .tar.xz, .tar.zst) and zip archives of repositories, read member by member, and plain
folder trees (a local checkout), listed once and split into chunks of files. A tar archive is streamed
(no seeking), so one member at a time is in memory, and its compression and tar framing are checked
to their ends; a zip archive is read through its central directory, which fsspec serves with range
requests on remote stores.

Each file is checked the same way whatever its container: over ``max_file_bytes`` it is skipped
unread, a NUL byte among its first ``binary_detection_bytes`` makes it binary, bytes that none of
``encodings`` decodes strictly make it undecodable. A document's id is a hash of (repo, path); its
url locates the bytes (the file, ``<archive>#<member>``, or the record's ``url``); its meta holds
repo, path, license (None when the record has none) and language (set by the language step). An
archive's repo is its file name without the suffix; a tree's is the folder's name.

Counters: ``in`` (files and records seen), ``out`` (documents yielded),
``not_regular_files`` (links, devices: not read), ``skipped_dirs`` (tree folders named in
``skip_dirs``, never entered), ``bytes_in``, ``dropped.code_{binary,undecodable,too_large,empty,
skipped_dir}`` (the last: archive members inside a ``skip_dirs`` folder),
``failed.code_{bad_record,corrupt_file,truncated_file,bad_member,missing_file,unverified_record,
unverified_member}`` (the last two: JSONL lines and tar.gz members read before a checksum that then
failed, never given out). Data faults are counted, never raised; network and permission errors
raise so the work item is retried.
"""

from __future__ import annotations

import dataclasses
import logging
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import fsspec

from tasks.compression import READ_CHUNK, UNVERIFIED_HOLD_CHARS, CorruptData, checked_stream, sniff_compression
from tasks.counters import Stats
from tasks.objectstore import remote_options
from tasks.storage import filesystem, normalize_url
from tasks.documents import Document
from tasks.ingest.base import doc_id
from tasks.ingest.code.config import CodeReaderConfig
from tasks.ingest.readers import GLOB_CHARS, InputError, http_input, input_size
from tasks.records import read_json_lines, read_parquet_rows

log = logging.getLogger(__name__)

# Longest suffix first: ".tar.gz" is a tar archive, not a gzipped file.
CODE_SUFFIXES: tuple[tuple[str, str], ...] = (
    (".jsonl.gz", "jsonl"), (".jsonl.zst", "jsonl"), (".jsonl.bz2", "jsonl"), (".jsonl.xz", "jsonl"),
    (".jsonl", "jsonl"),
    (".json.gz", "jsonl"), (".ndjson", "jsonl"),
    (".parquet", "parquet"),
    (".tar.gz", "tar"), (".tgz", "tar"), (".tar.bz2", "tar"), (".tbz2", "tar"), (".tar.xz", "tar"),
    (".txz", "tar"), (".tar.zst", "tar"), (".tzst", "tar"), (".tar", "tar"),
    (".zip", "zip"),
)
TREE = "tree"
NOT_REGULAR = -1  # the listed size of a tree entry that is a link, not a file
# JSON escaping can grow text up to six-fold (\u00XX); a record line is allowed that much, plus the fields.
JSON_ESCAPE_FACTOR = 6
RECORD_FIELDS_BYTES = 64 * 1024


@dataclasses.dataclass(frozen=True)
class CodeInput:
    """One work item: a records or archive file, or a chunk of a folder tree.

    ``files`` (tree chunks only) holds (path relative to ``url``, size) pairs; a symbolic link has
    size ``NOT_REGULAR`` and is never followed (it may point outside the tree).
    """

    url: str
    kind: str  # jsonl | parquet | tar | zip | tree
    files: tuple[tuple[str, int], ...] = ()

    @property
    def key(self) -> str:
        """What identifies the item's input, for its completion marker."""
        if self.kind != TREE:
            return self.url
        first, last = self.files[0][0], self.files[-1][0]
        return f"{self.url}#{len(self.files)}:{first}..{last}"


# --------------------------------------------------------------------------------------------
# Inputs


def code_input_kind(url: str, configured: str = "auto") -> str | None:
    """How to read the file ``url``: ``configured`` unless "auto", else from its name (None: unknown)."""
    if configured != "auto":
        return configured
    name = url.lower().rsplit("/", 1)[-1]
    return next((kind for suffix, kind in CODE_SUFFIXES if name.endswith(suffix)), None)


def _ignored(path: str) -> bool:
    """Hidden and underscore files (``.DS_Store``, Spark's ``_SUCCESS``) never decide a folder's kind."""
    return path.rsplit("/", 1)[-1].startswith((".", "_"))


def expand_code_inputs(urls: str | Sequence[str], cfg: CodeReaderConfig | None = None) -> list[str]:
    """Input URLs: records/archive files and source-tree folders; globs expanded, order kept.

    A folder is a source tree, or (``reader.folders``: "records", or "auto" when every file in it
    is one) a collection of JSONL/Parquet/tar/zip files, which are listed instead. Raises
    ``InputError`` naming the first URL that matches nothing or cannot be read.
    """
    cfg = cfg or CodeReaderConfig()
    out: dict[str, None] = {}
    for url in [urls] if isinstance(urls, str) else list(urls):
        url = normalize_url(url)
        try:
            out.update(dict.fromkeys(_expand_one(url, cfg)))
        except InputError:
            raise
        except (ImportError, OSError, ValueError) as e:  # no s3fs/gcsfs, unknown protocol, refused, no permission
            raise InputError(f"cannot read code input {url}: {e}") from e
    return list(out)


def _expand_one(url: str, cfg: CodeReaderConfig) -> list[str]:
    fs, path = filesystem(url)
    if (one := http_input(fs, url, "code input")) is not None:
        return one
    if any(ch in path for ch in GLOB_CHARS):
        found = []
        for p in sorted(fs.glob(path)):
            if fs.isdir(p):
                found += _expand_folder(fs, p, cfg)
            elif code_input_kind(p, cfg.format) is not None:
                found.append(p)
        if not found:
            raise InputError(f"code input {url} matches no JSONL, Parquet, tar or zip files and no folders")
    elif fs.isdir(path):
        found = _expand_folder(fs, path, cfg)
    elif fs.exists(path):
        if code_input_kind(path, cfg.format) is None:
            raise InputError(
                f"cannot tell how to read code input {url}: name a .jsonl(.gz), .parquet, .tar(.gz), .tgz or "
                ".zip file or a folder, or set reader.format"
            )
        found = [path]
    else:
        raise InputError(f"code input {url} does not exist")
    return [fs.unstrip_protocol(p) for p in found]


def _expand_folder(fs: fsspec.AbstractFileSystem, path: str, cfg: CodeReaderConfig) -> list[str]:
    if cfg.folders == TREE:
        return [path]
    records = []
    for file, _ in walk_files(fs, path, cfg.skip_dirs):
        if _ignored(file):
            continue
        if code_input_kind(file) is None:
            if cfg.folders == "auto":
                return [path]  # one source file makes it a tree: no need to list the rest
            continue
        records.append(file)
    if not records:
        kinds = "JSONL, Parquet, tar or zip files" if cfg.folders == "records" else "files"
        raise InputError(f"code input folder {fs.unstrip_protocol(path)} holds no {kinds}")
    return sorted(records)


def walk_files(fs: fsspec.AbstractFileSystem, root: str, skip_dirs: Sequence[str],
               stats: Stats | None = None) -> Iterator[tuple[str, dict]]:
    """(path, info) of every file under ``root``, never entering a folder named in ``skip_dirs``
    (counted as ``skipped_dirs``) or a linked folder (it may point outside the tree or loop)."""
    skip = frozenset(skip_dirs)
    for _, dirs, files in fs.walk(root, detail=True, on_error="raise"):
        for name in [d for d, info in dirs.items() if d in skip or info.get("islink")]:
            del dirs[name]
            if stats is not None:
                stats.add("skipped_dirs")
        for info in files.values():
            yield info["name"], info


def plan_code_inputs(urls: Sequence[str], cfg: CodeReaderConfig, stats: Stats | None = None) -> list[CodeInput]:
    """Work items for ``urls``: one per records/archive file, folder trees split into chunks of
    at most ``dir_chunk_files`` files or ``dir_chunk_bytes`` bytes (files in path order)."""
    items: list[CodeInput] = []
    for url in expand_code_inputs(urls, cfg):
        fs, path = filesystem(url)
        if url.startswith(("http://", "https://")) or not fs.isdir(path):
            items.append(CodeInput(url, code_input_kind(url, cfg.format) or ""))
            continue
        items += _tree_chunks(url, list_tree(url, cfg, stats), cfg)
    return items


def list_tree(url: str, cfg: CodeReaderConfig, stats: Stats | None = None) -> list[tuple[str, int]]:
    """(relative path, size) of every file under the folder ``url`` outside ``skip_dirs``, in path
    order; links have size ``NOT_REGULAR``."""
    fs, root = filesystem(url)
    root = root.rstrip("/")
    return sorted(
        (p[len(root):].lstrip("/"), NOT_REGULAR if info.get("islink") else int(info.get("size") or 0))
        for p, info in walk_files(fs, root, cfg.skip_dirs, stats)
    )


def _tree_chunks(url: str, files: list[tuple[str, int]], cfg: CodeReaderConfig) -> list[CodeInput]:
    chunks: list[CodeInput] = []
    current: list[tuple[str, int]] = []
    size = 0
    for entry in files:
        nbytes = max(entry[1], 0)
        if current and (len(current) >= cfg.dir_chunk_files or size + nbytes > cfg.dir_chunk_bytes):
            chunks.append(CodeInput(url, TREE, tuple(current)))
            current, size = [], 0
        current.append(entry)
        size += nbytes
    if current:
        chunks.append(CodeInput(url, TREE, tuple(current)))
    return chunks


# --------------------------------------------------------------------------------------------
# One source file, whatever its container


class _SourceChecks:
    """The per-file checks every reader applies, with the counters they emit."""

    def __init__(self, cfg: CodeReaderConfig, stats: Stats):
        self.cfg, self.stats = cfg, stats
        self.skip_dirs = frozenset(cfg.skip_dirs)

    def in_skipped_dir(self, path: str) -> bool:
        if self.skip_dirs.isdisjoint(path.split("/")[:-1]):
            return False
        self.stats.add("dropped.code_skipped_dir")
        return True

    def too_large(self, nbytes: int) -> bool:
        if nbytes <= self.cfg.max_file_bytes:
            return False
        self.stats.add("dropped.code_too_large")
        return True

    def decode(self, data: bytes) -> str | None:
        """The text of a file's bytes, or None with the reason counted."""
        if self.too_large(len(data)):
            return None
        if b"\x00" in data[: self.cfg.binary_detection_bytes]:
            self.stats.add("dropped.code_binary")
            return None
        for encoding in self.cfg.encodings:
            try:
                text = data.decode(encoding)
            except UnicodeDecodeError:
                continue
            return self.text(text.removeprefix("\ufeff"))  # a byte-order mark is not content
        self.stats.add("dropped.code_undecodable")
        return None

    def text(self, text: str) -> str | None:
        """Checks on text: decoded bytes, or content that arrives as text (JSONL, Parquet strings)."""
        if "\x00" in text[: self.cfg.binary_detection_bytes]:
            self.stats.add("dropped.code_binary")
            return None
        if not text.strip():
            self.stats.add("dropped.code_empty")
            return None
        return text

    def document(self, text: str, repo: str, path: str, url: str, license: Any = None) -> Document:
        self.stats.add("out")
        return Document(
            id=doc_id("code", repo, path),
            url=url,
            text=text,
            source="code",
            meta={"repo": repo, "path": path, "license": license, "language": ""},
        )


def clean_member_path(name: str) -> str:
    return name.replace("\\", "/").removeprefix("./").lstrip("/")


def archive_repo(url: str) -> str:
    """The repository an archive holds, named after the archive: ``requests-2.31.0.tar.gz`` → ``requests-2.31.0``."""
    name = url.rsplit("/", 1)[-1]
    lowered = name.lower()
    suffix = next((s for s, kind in CODE_SUFFIXES if lowered.endswith(s) and kind in ("tar", "zip")), "")
    return name[: len(name) - len(suffix)] if suffix else name


# --------------------------------------------------------------------------------------------
# Readers


def read_code(item: CodeInput, cfg: CodeReaderConfig, stats: Stats) -> Iterator[Document]:
    """Documents of one work item, read with the reader its kind calls for."""
    if item.kind == TREE:
        yield from read_tree(item, cfg, stats)
        return
    readers = {"jsonl": read_jsonl, "parquet": read_parquet, "tar": read_tar, "zip": read_zip}
    if item.kind not in readers:
        raise InputError(f"cannot tell how to read {item.url}; set reader.format to jsonl, parquet, tar or zip")
    stats.add("bytes_in", input_size(item.url))
    yield from readers[item.kind](item.url, cfg, stats)


def read_tree(item: CodeInput, cfg: CodeReaderConfig, stats: Stats) -> Iterator[Document]:
    """The chunk ``item.files`` of the folder tree at ``item.url``; the repo is the folder's name."""
    fs, root = filesystem(item.url)
    root = root.rstrip("/")
    repo = root.rsplit("/", 1)[-1]
    checks = _SourceChecks(cfg, stats)
    for rel, nbytes in item.files:
        stats.add("in")
        full = f"{root}/{rel}"
        if nbytes == NOT_REGULAR:
            stats.add("not_regular_files")
            continue
        if checks.in_skipped_dir(rel) or checks.too_large(nbytes):
            continue
        stats.add("bytes_in", nbytes)
        try:
            with fs.open(full, "rb") as f:
                data = f.read(cfg.max_file_bytes + 1)
        except FileNotFoundError:
            stats.add("failed.code_missing_file")
            log.warning("%s: listed but gone before it was read", fs.unstrip_protocol(full))
            continue
        if (text := checks.decode(data)) is not None:
            yield checks.document(text, repo, rel, fs.unstrip_protocol(full))


def read_tar(url: str, cfg: CodeReaderConfig, stats: Stats) -> Iterator[Document]:
    """Regular-file members of a tar archive, plain or compressed (gzip, bz2, xz, zstd), streamed in order.

    Compressed data is inflated by ``checked_stream``, not by tarfile (its gzip stream checks no CRC, and
    it stops at the tar end marker, before any format's trailer), and read to its end after the last
    member. Documents are held back (up to ``UNVERIFIED_HOLD_CHARS``) until that check: an archive is most
    often one compressed stream, so its checksum comes at its end. If the data proves corrupt, the held
    documents are counted ``failed.code_unverified_member``, not given out; a truncation gives them out
    (nothing after the cut can be checked). A missing end marker or a garbled header ends the archive
    with a counted fault, where tarfile would stop quietly (``_CheckedTarInfo``), so an archive cut
    between members is never taken as whole.
    """
    repo = archive_repo(url)
    with fsspec.open(url, "rb", **remote_options(url)) as raw:
        kind = sniff_compression(raw)
        stream = checked_stream(raw, kind) if kind else raw
        held: list[Document] = []
        held_chars = 0
        counts = Stats() if kind else stats  # the held documents' counts, added when they go out
        checks = _SourceChecks(cfg, counts)
        try:
            with tarfile.open(fileobj=stream, mode="r|", tarinfo=_CheckedTarInfo) as archive:
                while (member := archive.next()) is not None:
                    archive.members.clear()  # a stream needs no index; it would grow with the member count
                    if member.isdir():
                        continue
                    counts.add("in")
                    path = clean_member_path(member.name)
                    if not member.isfile():
                        counts.add("not_regular_files")
                        continue
                    if checks.in_skipped_dir(path) or checks.too_large(member.size):
                        continue
                    data = archive.extractfile(member).read()
                    if (text := checks.decode(data)) is not None:
                        held.append(checks.document(text, repo, path, f"{url}#{path}"))
                        held_chars += len(text) + 512  # and a Document's own objects, about 450 bytes
                    if not kind or held_chars > UNVERIFIED_HOLD_CHARS + cfg.max_file_bytes:
                        yield from _give_out(held, counts, stats)
                        held_chars = 0
                while kind and stream.read(READ_CHUNK):  # the rest of the compressed data, for its checksums
                    pass
        except (tarfile.TarError, EOFError, CorruptData) as e:
            truncated = isinstance(e, EOFError) or "unexpected end" in str(e)
            stats.add(f"failed.code_{'truncated' if truncated else 'corrupt'}_file")
            log.warning("%s: unreadable tar data, skipping the rest of the archive: %s", url, e)
            if not truncated and held:
                counts.add("out", -len(held))
                counts.add("failed.code_unverified_member", len(held))
                held.clear()
        if kind:
            yield from _give_out(held, counts, stats)


def _give_out(held: list[Document], counts: Stats, stats: Stats) -> Iterator[Document]:
    """The held documents, their counts added to ``stats`` first; both emptied."""
    if counts is not stats:
        stats += counts
        counts.clear()
    yield from held
    held.clear()


class _CheckedTarInfo(tarfile.TarInfo):
    """tarfile ends an archive without a word at an empty, cut or garbled header past the first;
    these raise instead. Only a zero block (the end-of-archive marker) ends it cleanly."""

    @classmethod
    def fromtarfile(cls, tar: tarfile.TarFile) -> tarfile.TarInfo:
        try:
            return super().fromtarfile(tar)
        except (tarfile.EmptyHeaderError, tarfile.TruncatedHeaderError) as e:
            if tar.offset == 0:
                raise
            raise tarfile.ReadError(f"unexpected end of data at byte {tar.offset}, before the end-of-archive "
                                    f"marker: {e}") from None
        except tarfile.InvalidHeaderError as e:
            if tar.offset == 0:
                raise
            raise tarfile.ReadError(f"bad member header at byte {tar.offset}: {e}") from None


def read_zip(url: str, cfg: CodeReaderConfig, stats: Stats) -> Iterator[Document]:
    """Regular-file members of a zip archive, in central-directory order."""
    checks = _SourceChecks(cfg, stats)
    repo = archive_repo(url)
    with fsspec.open(url, "rb", **remote_options(url)) as raw:
        try:
            archive = zipfile.ZipFile(raw)
        except (zipfile.BadZipFile, EOFError) as e:
            stats.add("failed.code_corrupt_file")
            log.warning("%s: not a readable zip archive: %s", url, e)
            return
        with archive:
            for info in archive.infolist():
                if info.is_dir():
                    continue
                stats.add("in")
                path = clean_member_path(info.filename)
                if stat.S_ISLNK(info.external_attr >> 16):
                    stats.add("not_regular_files")
                    continue
                if checks.in_skipped_dir(path) or checks.too_large(info.file_size):
                    continue
                try:
                    with archive.open(info) as member:
                        data = member.read(cfg.max_file_bytes + 1)
                except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as e:
                    stats.add("failed.code_bad_member")  # CRC mismatch, unsupported compression, encrypted
                    log.warning("%s: cannot read member %s: %s", url, info.filename, e)
                    continue
                if (text := checks.decode(data)) is not None:
                    yield checks.document(text, repo, path, f"{url}#{path}")


def _record_document(record: Any, checks: _SourceChecks, cfg: CodeReaderConfig, fallback_id: str) -> Document | None:
    """A JSONL/Parquet record as a Document, or None with the reason counted."""
    content = record.get(cfg.content_field) if isinstance(record, dict) else None
    if isinstance(content, (bytes, bytearray)):
        text = checks.decode(bytes(content))
    elif isinstance(content, str):
        text = None if checks.too_large(len(content.encode("utf-8", "surrogatepass"))) else checks.text(content)
    else:
        checks.stats.add("failed.code_bad_record")
        return None
    if text is None:
        return None
    repo = str(record.get(cfg.repo_field) or "")
    path = clean_member_path(str(record.get(cfg.path_field) or ""))
    doc = checks.document(text, repo, path, str(record.get("url") or ""), record.get(cfg.license_field) or None)
    if not repo and not path:
        doc.id = doc_id("code", fallback_id)
    return doc


def read_jsonl(url: str, cfg: CodeReaderConfig, stats: Stats) -> Iterator[Document]:
    """Source-file records, one JSON object per line; blank lines are not records."""
    checks = _SourceChecks(cfg, stats)
    max_line = JSON_ESCAPE_FACTOR * cfg.max_file_bytes + RECORD_FIELDS_BYTES
    for line_no, record in read_json_lines(url, max_line, stats, prefix="code", truncated="code_truncated_file"):
        if (doc := _record_document(record, checks, cfg, f"{url}:{line_no}")) is not None:
            yield doc


def read_parquet(url: str, cfg: CodeReaderConfig, stats: Stats) -> Iterator[Document]:
    """Source-file records from a Parquet file with a string or binary content column."""
    checks = _SourceChecks(cfg, stats)
    wanted = (cfg.repo_field, cfg.path_field, cfg.content_field, cfg.license_field, "url")
    for row, record in read_parquet_rows(url, cfg.content_field, wanted, stats, prefix="code", batch_size=256):
        if (doc := _record_document(record, checks, cfg, f"{url}:{row}")) is not None:
            yield doc
