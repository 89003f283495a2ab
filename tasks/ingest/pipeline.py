"""One ingest work item: an input file → a document shard, streamed through the step chain.

read → URL filter → extract → language → Gopher repetition → Gopher quality → C4 → FineWeb →
(quality classifier) → PII masking → ``docs-NNNNN.parquet``; FineWeb's order, so the cheap URL
check runs before extraction and PII masking runs on what is kept.

Besides each step's own counters, the shard's stats hold the funnel: ``funnel.<step>.out`` (documents
leaving the step) and ``funnel.<step>.<dropped|failed>.<reason>`` (what the step removed), so
``stage.funnel`` can show every drop under the step that made it. Shards are written with a fixed
row-group size and no timestamps, so a redone shard is byte-identical.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import time
from collections.abc import Iterable, Iterator

from tasks import datasets
from tasks.datasets import ShardInfo, ShardResult, Stats
from tasks.ingest.base import Document, Filter, Step
from tasks.ingest.config import IngestConfig, OutputConfig
from tasks.ingest.readers import read_documents

READ_STEP = "read"
EXCLUDED = "excluded"  # sub-folder of the output holding dropped documents, when asked for


def build_steps(cfg: IngestConfig) -> list[Step]:
    """The enabled document steps, in order, each built from its own config section."""
    from tasks.ingest.classifier import QualityClassifierFilter
    from tasks.ingest.extract import Extract
    from tasks.ingest.langid import LanguageFilter
    from tasks.ingest.pii import PIIMasker
    from tasks.ingest.quality import C4QualityFilter, FineWebQualityFilter, GopherQualityFilter, GopherRepetitionFilter
    from tasks.ingest.urlfilter import URLFilter

    chain = [
        (cfg.url_filter.enabled, URLFilter, cfg.url_filter),
        (True, Extract, cfg.extract),
        (cfg.lang.enabled, LanguageFilter, cfg.lang),
        (cfg.gopher_repetition.enabled, GopherRepetitionFilter, cfg.gopher_repetition),
        (cfg.gopher_quality.enabled, GopherQualityFilter, cfg.gopher_quality),
        (cfg.c4.enabled, C4QualityFilter, cfg.c4),
        (cfg.fineweb.enabled, FineWebQualityFilter, cfg.fineweb),
        (cfg.classifier.enabled, QualityClassifierFilter, cfg.classifier),
        (cfg.pii.enabled, PIIMasker, cfg.pii),
    ]
    return [step(section) for enabled, step, section in chain if enabled]


def step_names(steps: list[Step]) -> list[str]:
    return [READ_STEP, *(step.name for step in steps)]


def shard_name(shard_index: int) -> str:
    return f"docs-{shard_index:05d}.parquet"


# --------------------------------------------------------------------------------------------
# Running the chain


def _counted(docs: Iterable[Document], counter: Stats, key: str) -> Iterator[Document]:
    for doc in docs:
        counter.add(key)
        yield doc


def run_steps(
    docs: Iterable[Document], steps: list[Step], step_stats: dict[str, Stats], rejects=None
) -> Iterator[Document]:
    """Chain ``steps`` lazily over ``docs``; each step counts into its own ``step_stats[name]``.

    ``rejects`` (anything with ``append``) receives the documents filters drop.
    """
    for step in steps:
        stats = step_stats.setdefault(step.name, Stats())
        docs = step.run(docs, stats, rejects) if isinstance(step, Filter) else step.run(docs, stats)
        docs = _counted(docs, stats, f"funnel.{step.name}.out")
    return docs


def merge_step_stats(step_stats: dict[str, Stats]) -> Stats:
    """All steps' counters, plus ``funnel.<step>.<reason>`` attributing each drop to its step."""
    total = Stats()
    for name, stats in step_stats.items():
        total += stats
        for key, value in stats.items():
            if key.startswith(("dropped.", "failed.")):
                total.add(f"funnel.{name}.{key}", value)
    return total


class ParquetSink:
    """Appends documents to a Parquet file in row groups of a fixed size (deterministic bytes)."""

    def __init__(self, f, cfg: OutputConfig):
        import pyarrow.parquet as pq

        self._schema = datasets.document_schema()
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


def write_parquet(docs: Iterable[Document], cfg: OutputConfig, f) -> int:
    """Write ``docs`` to the open file ``f`` as a document shard; returns the row count."""
    sink = ParquetSink(f, cfg)
    for doc in docs:
        sink.append(doc)
    return sink.close()


# --------------------------------------------------------------------------------------------
# One work item


def ingest_shard(input_url: str, output_url: str, shard_index: int, cfg: IngestConfig) -> ShardResult:
    """Read, filter and write one input file as shard ``docs-<shard_index>.parquet`` of ``output_url``.

    Idempotent (``datasets.run_shard``): a finished shard is reused, an unfinished one is redone
    from scratch and comes out byte-identical. With ``output.write_exclusions`` the documents the
    filters drop go to ``<output_url>/excluded/<same name>`` with ``meta.dropped_by`` (the shard's
    info has ``extra.excluded``); records that fail reading or extraction hold no text worth
    inspecting and are only counted.
    """
    name = shard_name(shard_index)
    work = functools.partial(_ingest_file, input_url, output_url, name, cfg)
    return datasets.run_shard(output_url, work_key(name, input_url, cfg), work)


def work_key(name: str, input_url: str, cfg: IngestConfig) -> str:
    """The shard's completion key: a marker left by another input or config is never reused."""
    blob = datasets.canonical_json([input_url, dataclasses.asdict(cfg)])
    return f"{name.removesuffix('.parquet')}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def ingest_work_item(item: tuple[int, str], output_url: str, cfg: IngestConfig) -> ShardResult:
    """``ingest_shard`` over an ``(index, input URL)`` pair: the unit a ``MapFn`` fans out."""
    index, input_url = item
    return ingest_shard(input_url, output_url, index, cfg)


def _ingest_file(input_url: str, output_url: str, name: str, cfg: IngestConfig) -> ShardResult:
    started = time.perf_counter()
    steps = build_steps(cfg)
    step_stats: dict[str, Stats] = {READ_STEP: Stats()}
    read_stats = step_stats[READ_STEP]
    docs = _counted(read_documents(input_url, cfg.reader, read_stats), read_stats, f"funnel.{READ_STEP}.out")
    if cfg.output.write_exclusions:
        shards = list(_write_with_exclusions(docs, steps, step_stats, output_url, name, cfg.output))
    else:
        write = functools.partial(write_parquet, run_steps(docs, steps, step_stats), cfg.output)
        shards = [datasets.write_shard(output_url, name, write)]
    stats = merge_step_stats(step_stats)
    stats.add("docs_out", shards[0].rows)
    stats.add("time.shard_s", time.perf_counter() - started)
    return ShardResult(shards, stats)


def _write_with_exclusions(docs, steps, step_stats, output_url: str, name: str, cfg: OutputConfig) -> tuple[ShardInfo, ShardInfo]:
    """(kept shard, excluded shard) in one pass: the kept shard is written while the excluded one is open."""
    kept: list[ShardInfo] = []

    def write_excluded(g) -> int:
        rejects = ParquetSink(g, cfg)
        write = functools.partial(write_parquet, run_steps(docs, steps, step_stats, rejects), cfg)
        kept.append(datasets.write_shard(output_url, name, write))
        return rejects.close()

    excluded = datasets.write_shard(datasets.join(output_url, EXCLUDED), name, write_excluded)
    return kept[0], dataclasses.replace(excluded, name=f"{EXCLUDED}/{name}", extra={"excluded": True})
