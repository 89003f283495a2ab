"""Pipeline steps for document stages: a step transforms a stream of documents and counts.

Modelled on datatrove's PipelineStep/BaseFilter: a ``Step`` has a ``name`` and ``process(docs,
stats)``; its ``run`` counts every document in and out (``in``, ``out``: the vocabulary of
``tasks.counters.Stats``, in the step's own ``Stats``, which the stage files under
``funnel.<step>.``). A ``Filter`` answers one question per document through ``keep``; the base
batches, counts (``dropped.<reason>``, ``skipped.<why>``) and writes rejects. Steps hold only
config values so they pickle to Dask workers.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable, Iterator
from typing import Any

from tasks.counters import Stats
from tasks.documents import Document


def doc_id(*parts: object) -> str:
    """Deterministic document id: the same record always gets the same id."""
    return hashlib.sha256("\x1f".join(map(str, parts)).encode()).hexdigest()[:32]


def batched(docs: Iterable[Document], size: int) -> Iterator[list[Document]]:
    """Consecutive chunks of at most ``size`` documents, so a model can label many per call."""
    iterator = iter(docs)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def _counted(docs: Iterable[Document], stats: Stats, key: str) -> Iterator[Document]:
    for doc in docs:
        stats.add(key)
        yield doc


def enabled_steps(chain: list[tuple[type[Step], Any]]) -> list[Step]:
    """A stage's steps in order, each built from its config section; a section with ``enabled``
    false leaves its step out (a section without ``enabled`` always runs)."""
    return [step(section) for step, section in chain if getattr(section, "enabled", True)]


class Step:
    """One named transformation of a document stream, built from its config section (whose
    ``enabled``, where it has one, switches it); a disabled step passes documents uncounted."""

    name: str = "step"
    enabled: bool = True

    def __init__(self, cfg) -> None:
        self.cfg = cfg
        self.enabled = getattr(cfg, "enabled", True)

    def run(self, docs: Iterable[Document], stats: Stats, rejects: list[Document] | None = None) -> Iterator[Document]:
        """``process`` with every document counted ``in`` and ``out``; ``rejects`` (anything with
        ``append``) receives the documents a filter drops."""
        if not self.enabled:
            return iter(docs)
        return _counted(self.process(_counted(docs, stats, "in"), stats, rejects), stats, "out")

    def process(self, docs: Iterable[Document], stats: Stats, rejects: list[Document] | None) -> Iterator[Document]:
        raise NotImplementedError


class Filter(Step):
    """Keeps or drops each document; subclasses implement ``keep`` and, where needed, two hooks.

    ``keep`` returns True, False (dropped under ``<name>``) or ``(False, reason)``; reasons are
    namespaced API strings such as ``gopher_short_doc``. ``skip_reason`` names documents the filter
    does not judge (passed on, counted ``skipped.<why>``); ``prepare`` sees each batch of
    ``batch_size`` documents first (one model call labels them all). ``count`` adds a counter of
    the filter's own from inside ``keep``.
    """

    batch_size: int = 1

    def keep(self, doc: Document) -> bool | tuple[bool, str]:
        raise NotImplementedError

    def skip_reason(self, doc: Document) -> str | None:
        return None

    def prepare(self, docs: list[Document]) -> None:
        """Work done once per batch before ``keep`` (e.g. labelling every document with a model)."""

    def count(self, key: str, value: int | float = 1) -> None:
        self._stats.add(key, value)

    def record(self, doc: Document, values: dict[str, float]) -> None:
        """Keep the values a kept document's rules measured, ``meta["quality"][<name>]``: what ``smelt trace``
        shows for a document a spike drew (4 significant digits; the text holds the exact ones)."""
        doc.meta.setdefault("quality", {})[self.name] = {k: float(f"{v:.4g}") for k, v in values.items()}

    def process(self, docs: Iterable[Document], stats: Stats, rejects: list[Document] | None) -> Iterator[Document]:
        self._stats = stats
        for batch in batched(docs, self.batch_size):
            self.prepare(batch)
            for doc in batch:
                if why := self.skip_reason(doc):
                    stats.add(f"skipped.{why}")
                    yield doc
                    continue
                verdict = self.keep(doc)
                ok, reason = (verdict, self.name) if isinstance(verdict, bool) else verdict
                if ok:
                    yield doc
                    continue
                stats.add(f"dropped.{reason}")
                if rejects is not None:
                    doc.meta["dropped_by"] = reason
                    rejects.append(doc)
