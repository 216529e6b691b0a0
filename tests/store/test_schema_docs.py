"""docs/schema.md against the live schema, on SQLite and PostgreSQL: every
public relation has a section, every section lists exactly the relation's live
columns, each with a type that matches the database and a meaning, and times
say their unit. The library queries read only documented relations.

(tests/test_migrations.py checks that the doc covers ``PUBLIC_RELATIONS``;
this checks the doc against the database itself, so neither can drift.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import sqlalchemy as sa

from modtrace.store.engine import open_store
from modtrace.store.query import library, scan_sql
from modtrace.store.schema import PUBLIC_RELATIONS

DOC = Path(__file__).resolve().parents[2] / "docs" / "schema.md"

Row = tuple[str, str, str]  # column, type, meaning


def documented() -> dict[str, tuple[str, list[Row]]]:
    """relation -> (table | view, its rows), from the doc's ``## `name` (kind)`` sections."""
    text = DOC.read_text()
    out: dict[str, tuple[str, list[Row]]] = {}
    for name, kind, body in re.findall(r"^## `(\w+)` \((table|view)\)\n(.*?)(?=^## |\Z)", text, re.M | re.S):
        rows = re.findall(r"^\| `(\w+)` \| ([^|]*) \| (.*) \|$", body, re.M)
        out[name] = (kind, [(c, t.strip(), m.strip()) for c, t, m in rows])
    return out


def test_the_doc_documents_exactly_the_public_relations() -> None:
    docs = documented()
    assert set(docs) == set(PUBLIC_RELATIONS)
    intro = DOC.read_text().split("**Storage tables**")[0]
    listed = set(re.findall(r"`(\w+)`", intro.split("**Public relations**")[1]))
    assert listed == set(PUBLIC_RELATIONS), "the intro's list of public relations"
    for name, (_, rows) in docs.items():
        columns = [c for c, _, _ in rows]
        assert len(columns) == len(set(columns)), f"{name} lists a column twice"
        assert all(meaning for _, _, meaning in rows), f"{name} has a column without a meaning"


def test_times_say_their_unit() -> None:
    for name, (_, rows) in documented().items():
        for column, type_, meaning in rows:
            if column.endswith("_ns"):
                assert type_ == "integer" and "nanoseconds" in meaning.lower(), (name, column, meaning)
            if column.endswith("_at"):
                assert "UTC" in meaning or "utc" in meaning.lower(), (name, column, meaning)


_TYPES = {"integer": (sa.Integer,), "text": (sa.String, sa.Text), "real": (sa.Float, sa.Numeric)}


def test_the_doc_matches_the_live_schema(any_db: str) -> None:
    store = open_store(any_db, create=True)
    try:
        with store.engine.connect() as conn:
            inspector = sa.inspect(conn)
            tables, views = set(inspector.get_table_names()), set(inspector.get_view_names())
            for name, (kind, rows) in documented().items():
                assert name in (tables if kind == "table" else views), f"{name} is not a {kind}"
                live = {c["name"]: c["type"] for c in inspector.get_columns(name)}
                assert {c for c, _, _ in rows} == set(live), (
                    f"{name}: undocumented {sorted(set(live) - {c for c, _, _ in rows})}, "
                    f"documented but missing {sorted({c for c, _, _ in rows} - set(live))}"
                )
                for column, type_, _ in rows:
                    assert type_ in _TYPES, (name, column, type_)
                    live_type = live[column]
                    if isinstance(live_type, sa.types.NullType):
                        continue  # SQLite does not type view expressions
                    assert isinstance(live_type, _TYPES[type_]), (name, column, type_, live_type)
    finally:
        store.dispose()


_RELATION = re.compile(r"\b(?:FROM|JOIN)\s+([A-Za-z_]\w*)", re.I)


@pytest.mark.parametrize("query", library(), ids=lambda q: q.name)
def test_library_queries_read_only_public_relations(query) -> None:  # type: ignore[no-untyped-def]
    sql = scan_sql(query.sql).bindable  # comments blanked out
    ctes = set(re.findall(r"\b(\w+)\s+AS\s*\(", sql, re.I))
    used = {m for m in _RELATION.findall(sql)} - ctes
    assert used and used <= set(PUBLIC_RELATIONS), f"{query.name} reads {sorted(used - set(PUBLIC_RELATIONS))}"
