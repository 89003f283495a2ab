"""The document record and its Parquet schema (the ``documents`` datasets that ingest writes and dedup,
tokenize and trace read): one definition, the ``Document`` dataclass, from which the columns are derived.

``pa.Table.from_pylist(rows, schema=...)`` silently drops a key its schema lacks, so a field added to
``Document`` must reach the schema by itself: ``DOCUMENT_COLUMNS`` is computed from the dataclass, and a
field of a type with no column type fails at import. ``meta`` is a JSON object string for source-specific
fields (code: repo, path, license, language; web: WARC record id, quality measurements), so the schema stays
fixed.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any


@dataclasses.dataclass
class Document:
    id: str
    url: str
    text: str
    source: str = "web"  # "web" | "code"
    lang: str = ""
    lang_score: float = math.nan
    quality_score: float = math.nan  # NaN when no classifier ran
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_row(self) -> dict[str, Any]:
        """The Parquet row: fields as they are, ``meta`` as JSON (no deep copy, which
        ``dataclasses.asdict`` makes of every meta dict: ~6% of a shard's CPU under cProfile)."""
        row = {name: getattr(self, name) for name in DOCUMENT_COLUMNS}
        row["meta"] = json.dumps(self.meta, sort_keys=True)
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> "Document":
        row = dict(row)
        row["meta"] = json.loads(row.get("meta") or "{}")
        return cls(**row)


# A field's annotation → its column type; ``meta`` (a dict) is stored as a JSON string.
_COLUMN_TYPES = {"str": "string", "float": "float", "dict[str, Any]": "string"}


def columns(record: type) -> dict[str, str]:
    """Column name → type of a record dataclass, in field order; a field with no column type is refused."""
    unknown = [f"{f.name}: {f.type}" for f in dataclasses.fields(record) if f.type not in _COLUMN_TYPES]
    if unknown:
        raise TypeError(f"{record.__name__} has fields no Parquet column type is given for ({', '.join(unknown)}); "
                        f"add their types to tasks/documents.py's _COLUMN_TYPES")
    return {f.name: _COLUMN_TYPES[f.type] for f in dataclasses.fields(record)}


DOCUMENT_COLUMNS: dict[str, str] = columns(Document)


def document_schema():
    """The Parquet schema of a documents shard, one column per ``Document`` field in field order."""
    import pyarrow as pa

    types = {"string": pa.string(), "float": pa.float32()}
    return pa.schema([(name, types[t]) for name, t in DOCUMENT_COLUMNS.items()])
