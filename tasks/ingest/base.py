"""Pipeline steps for document stages: a step transforms a stream of documents and counts.

Modelled on datatrove's PipelineStep/BaseFilter: a ``Step`` has a ``name`` and ``run(docs, stats)``
that yields documents; a ``Filter`` answers one question per document through ``keep`` and the
base class does the counting (``<name>.in``, ``<name>.kept``, ``dropped.<reason>``). Steps hold
only config values so they pickle to Dask workers.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Iterator
from typing import Any

from tasks.datasets import Stats


@dataclasses.dataclass
class Document:
    id: str
    url: str
    text: str
    source: str = "web"
    lang: str = ""
    lang_score: float = math.nan
    quality_score: float = math.nan
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_row(self) -> dict[str, Any]:
        row = dataclasses.asdict(self)
        row["meta"] = json.dumps(self.meta, sort_keys=True)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Document":
        row = dict(row)
        row["meta"] = json.loads(row.get("meta") or "{}")
        return cls(**row)


class Step:
    """One named transformation of a document stream."""

    name: str = "step"

    def run(self, docs: Iterable[Document], stats: Stats) -> Iterator[Document]:
        raise NotImplementedError


class Filter(Step):
    """Keeps or drops each document; subclasses implement ``keep`` only.

    ``keep`` returns True, False (dropped under ``<name>``) or ``(False, reason)``; reasons are
    namespaced API strings such as ``gopher_short_doc``.
    """

    def keep(self, doc: Document) -> bool | tuple[bool, str]:
        raise NotImplementedError

    def run(self, docs: Iterable[Document], stats: Stats, rejects: list[Document] | None = None) -> Iterator[Document]:
        for doc in docs:
            stats.add(f"{self.name}.in")
            verdict = self.keep(doc)
            ok, reason = (verdict, self.name) if isinstance(verdict, bool) else verdict
            if ok:
                stats.add(f"{self.name}.kept")
                yield doc
            else:
                stats.add(f"dropped.{reason}")
                if rejects is not None:
                    doc.meta["dropped_by"] = reason
                    rejects.append(doc)
