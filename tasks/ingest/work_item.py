"""One ingest work item, web or code: an input → a document shard, streamed through a step chain.

Web: read → URL filter → extract → language → Gopher repetition → Gopher quality → C4 → FineWeb →
(quality classifier) → PII masking (FineWeb's order, so the cheap URL check runs before extraction
and PII masking runs on what is kept). Code: read → the rules of ``tasks/ingest/code/stage.py``.
Both run through ``ingest_item``: the reader and every step count into a ``Stats`` of their own,
merged into the shard's stats under ``funnel.<step>.`` (``tasks.counters``), plus ``lang.<lang>``
(documents written per language) and ``time.shard_s``. Shards are written with a fixed row-group
size and no timestamps, so a redone shard is byte-identical.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import time
from collections.abc import Callable, Iterable, Iterator

from tasks import contract, storage
from tasks.contract import ShardInfo, ShardResult
from tasks.counters import Stats
from tasks.documents import document_schema
from tasks.counters import merge_steps
from tasks.documents import Document
from tasks.ingest.base import Step, enabled_steps
from tasks.ingest.config import IngestConfig, OutputConfig
from tasks.ingest.readers import read_documents

READ_STEP = "read"
EXCLUDED = "excluded"  # sub-folder of the output holding dropped documents, when asked for


def build_steps(cfg: IngestConfig) -> list[Step]:
    """The enabled document steps, in order, each built from its own config section."""
    from tasks.ingest.classifier import QualityClassifierFilter
    from tasks.ingest.extract import Extract
    from tasks.ingest.langid import LangIdFilter
    from tasks.ingest.pii import PIIMasker
    from tasks.ingest.quality import C4QualityFilter, FineWebQualityFilter, GopherQualityFilter, GopherRepetitionFilter
    from tasks.ingest.urlfilter import URLFilter

    return enabled_steps([
        (URLFilter, cfg.url_filter),
        (Extract, cfg.extract),
        (LangIdFilter, cfg.lang),
        (GopherRepetitionFilter, cfg.gopher_repetition),
        (GopherQualityFilter, cfg.gopher_quality),
        (C4QualityFilter, cfg.c4),
        (FineWebQualityFilter, cfg.fineweb),
        (QualityClassifierFilter, cfg.classifier),
        (PIIMasker, cfg.pii),
    ])


def step_names(steps: list[Step]) -> list[str]:
    return [READ_STEP, *(step.name for step in steps)]


def shard_name(shard_index: int) -> str:
    return f"docs-{shard_index:05d}.parquet"


class DocumentSink:
    """Appends documents to a Parquet file in row groups of a fixed size (deterministic bytes)."""

    def __init__(self, f, cfg: OutputConfig):
        import pyarrow.parquet as pq

        self._schema = document_schema()
        self._writer = pq.ParquetWriter(f, self._schema, compression=cfg.compression)
        self._rows_per_group = cfg.rows_per_row_group
        self._pending: list[dict] = []
        self.rows = 0

    def append(self, doc: Document) -> None:
        self._pending.append(doc.to_row())
        self.rows += 1
        if len(self._pending) >= self._rows_per_group:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        if self._pending:
            self._writer.write_table(pa.Table.from_pylist(self._pending, schema=self._schema))
            self._pending = []

    def close(self) -> int:
        self._flush()
        self._writer.close()
        return self.rows


# --------------------------------------------------------------------------------------------
# One work item


Reader = Callable[[Stats], Iterable[Document]]  # documents of one input, counted into the given Stats


def ingest_item(index: int, input_key: str, read: Reader, steps: list[Step], output_url: str, cfg) -> ShardResult:
    """Read, filter and write one input as shard ``docs-<index>.parquet`` of ``output_url``.

    ``input_key`` names the input and ``cfg`` is the stage's whole config (both go into the
    shard's completion key); ``cfg.output`` says how to write. Idempotent (``contract.run_shard``):
    a finished shard is reused, an unfinished one is redone from scratch and comes out
    byte-identical. With ``output.write_exclusions`` the documents the filters drop go to
    ``<output_url>/excluded/<same name>`` with ``meta.dropped_by`` (the shard's info has
    ``extra.excluded``); records that fail reading hold nothing worth inspecting and are only counted.
    """
    name = shard_name(index)
    work = functools.partial(_ingest, read, steps, output_url, name, cfg.output)
    return contract.run_shard(output_url, work_key(name, input_key, cfg), work)


def work_key(name: str, input_key: str, cfg) -> str:
    """The shard's completion key: a marker left by another input or config is never reused."""
    blob = contract.canonical_json([input_key, dataclasses.asdict(cfg)])
    return f"{name.removesuffix('.parquet')}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def web_item(item: tuple[int, str], output_url: str, cfg: IngestConfig) -> ShardResult:
    """``ingest_item`` for the web stage over an ``(index, input URL)`` pair: what a ``MapFn`` fans out."""
    index, url = item
    return ingest_item(index, url, functools.partial(read_documents, url, cfg.reader), build_steps(cfg), output_url, cfg)


def run_steps(docs: Iterable[Document], steps: list[Step], step_stats: dict[str, Stats], rejects=None) -> Iterator[Document]:
    """Chain ``steps`` lazily over ``docs``; each step counts into its own ``step_stats[name]``.

    ``rejects`` (anything with ``append``) receives the documents filters drop.
    """
    for step in steps:
        docs = step.run(docs, step_stats.setdefault(step.name, Stats()), rejects)
    return docs


def _ingest(read: Reader, steps: list[Step], output_url: str, name: str, cfg: OutputConfig) -> ShardResult:
    started = time.perf_counter()
    step_stats: dict[str, Stats] = {READ_STEP: Stats()}
    written = Stats()  # documents written per language
    shards: list[ShardInfo] = []

    def write_kept(f, rejects: DocumentSink | None = None) -> int:
        sink = DocumentSink(f, cfg)
        for doc in run_steps(read(step_stats[READ_STEP]), steps, step_stats, rejects):
            written.add(f"lang.{doc.lang or 'unknown'}")
            sink.append(doc)
        return sink.close()

    def write_both(g) -> int:  # the kept shard is written while the excluded one is open
        rejects = DocumentSink(g, cfg)
        shards.append(contract.write_shard(output_url, name, functools.partial(write_kept, rejects=rejects)))
        return rejects.close()

    if cfg.write_exclusions:
        excluded = contract.write_shard(storage.join(output_url, EXCLUDED), name, write_both)
        shards.append(dataclasses.replace(excluded, name=f"{EXCLUDED}/{name}", extra={"excluded": True}))
    else:
        shards.append(contract.write_shard(output_url, name, write_kept))
    stats = merge_steps(step_stats) + written
    stats.add("time.shard_s", time.perf_counter() - started)
    return ShardResult(shards, stats)
