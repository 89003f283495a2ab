"""The documents schema is the ``Document`` dataclass's: a field added to one cannot be dropped by the other."""

import dataclasses
import pyarrow as pa
import pytest

from tasks.documents import DOCUMENT_COLUMNS, Document, columns, document_schema


def test_the_schema_has_one_column_per_document_field_in_field_order():
    assert list(DOCUMENT_COLUMNS) == [field.name for field in dataclasses.fields(Document)]
    assert document_schema().names == list(DOCUMENT_COLUMNS)


def test_every_field_survives_a_parquet_table_round_trip():
    """``pa.Table.from_pylist(rows, schema=...)`` silently drops a key the schema lacks: a document with no
    field at its default comes back equal only if every field has a column."""
    doc = Document(id="d1", url="https://example.org/a", text="Some text.", source="code", lang="en",
                   lang_score=0.5, quality_score=0.25, meta={"repo": "r", "path": "p.py"})
    defaults = Document(id="", url="", text="")
    assert all(getattr(doc, f.name) != getattr(defaults, f.name) for f in dataclasses.fields(Document)), \
        "set every field, a new one too, away from its default"
    table = pa.Table.from_pylist([doc.to_row()], schema=document_schema())
    assert [Document.from_row(row) for row in table.to_pylist()] == [doc]


def test_a_field_of_a_type_with_no_column_type_is_refused_where_the_columns_are_derived():
    @dataclasses.dataclass
    class Wider(Document):
        tags: list[str] = dataclasses.field(default_factory=list)

    with pytest.raises(TypeError, match=r"Wider has fields no Parquet column type is given for \(tags: list\[str\]\)"):
        columns(Wider)
