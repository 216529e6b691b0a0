"""Schema revisions: the migrations build exactly the metadata, on SQLite and
PostgreSQL; every table and column is commented and the public relations are
documented; and a database frozen at each released revision upgrades cleanly.

Frozen databases live in tests/data/frozen/<revision>.db and are written once,
when a revision is released, by scripts/make_frozen_db.py.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.pool import NullPool

from modtrace.store.engine import Store, open_store, read_revision
from modtrace.store.migrate import alembic_config, migrations_dir, script_revisions, upgrade
from modtrace.store.schema import HEAD, PUBLIC_RELATIONS, REVISIONS, metadata

REPO = Path(__file__).resolve().parents[2]
FROZEN_DIR = REPO / "tests" / "data" / "frozen"
FROZEN = sorted(FROZEN_DIR.glob("*.db"))


def _diff(store: Store) -> list[object]:
    with store.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
        return list(compare_metadata(ctx, metadata))


def _bare_store(url: str) -> Store:
    """A Store with no version check, to drive Alembic to any revision."""
    engine = sa.create_engine(url if "://" in url else f"sqlite:///{url}", poolclass=NullPool)
    return Store(engine=engine, label=url, path=None if "://" in url else Path(url))


@pytest.fixture
def bare(any_db: str) -> Iterator[Store]:
    store = _bare_store(any_db)
    yield store
    store.dispose()


def test_revisions_list_matches_the_migration_scripts() -> None:
    assert script_revisions() == list(REVISIONS)
    assert HEAD == REVISIONS[-1]


def test_editable_install_uses_the_repository_migrations() -> None:
    assert migrations_dir() == REPO / "migrations"


def test_upgrading_an_empty_database_yields_exactly_the_metadata(any_db: str) -> None:
    store = open_store(any_db, create=True)
    try:
        assert read_revision(store.engine)[0] == HEAD
        assert _diff(store) == []
    finally:
        store.dispose()


def _sqlite_shape(path: Path) -> dict[str, object]:
    """Everything SQLite knows of a database's schema, formatting aside: columns, keys,
    indexes, CHECK and named constraints of every table, view definitions, the version."""
    conn = sqlite3.connect(path)
    try:
        shape: dict[str, object] = {}
        for kind, name, sql in conn.execute("SELECT type, name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"):
            flat = " ".join(re.sub(r"([(),])", r" \1 ", sql or "").split()).replace('"', "")
            if kind == "view":
                shape[f"view {name}"] = flat
            elif kind == "table":
                shape[f"table {name}"] = (
                    conn.execute(f"PRAGMA table_info({name})").fetchall(),
                    sorted(conn.execute(f"PRAGMA foreign_key_list({name})").fetchall()),
                    sorted(re.findall(r"CHECK \( .*? \) \)", flat)),
                    sorted(re.findall(r"CONSTRAINT (\w+)", flat)),
                )
            elif kind == "trigger":
                shape[f"trigger {name}"] = flat
            elif kind == "index":
                shape[f"index {name}"] = (conn.execute(f"PRAGMA index_xinfo({name})").fetchall(),
                                          conn.execute("SELECT tbl_name FROM sqlite_master WHERE name = ?", (name,)).fetchall())
        shape["version"] = conn.execute("SELECT version_num FROM alembic_version").fetchall()
        shape["journal"] = conn.execute("PRAGMA journal_mode").fetchall()
        return shape
    finally:
        conn.close()


def test_a_new_database_created_at_head_equals_one_upgraded_through_every_migration(tmp_path: Path) -> None:
    fast = open_store(str(tmp_path / "fast.db"), create=True)  # created from the metadata in one transaction
    assert fast.created
    assert _diff(fast) == []
    fast.dispose()
    slow = _bare_store(str(tmp_path / "slow.db"))
    with slow.engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA journal_mode = WAL")
    upgrade(slow)
    slow.dispose()
    fast_shape, slow_shape = _sqlite_shape(tmp_path / "fast.db"), _sqlite_shape(tmp_path / "slow.db")
    assert set(fast_shape) == set(slow_shape)
    for key in slow_shape:
        assert fast_shape[key] == slow_shape[key], key
    assert fast_shape["version"] == [(HEAD,)]


def test_downgrade_to_base_and_back_to_head(bare: Store) -> None:
    upgrade(bare)
    cfg = alembic_config(bare)
    with bare.engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "base")
        conn.commit()
        inspector = sa.inspect(conn)
        assert set(inspector.get_table_names()) == {"alembic_version"}
        assert inspector.get_view_names() == []
    assert upgrade(bare) == (None, HEAD)
    assert _diff(bare) == []


def test_every_table_and_column_has_a_comment() -> None:
    missing = [t.name for t in metadata.sorted_tables if not t.comment]
    missing += [f"{t.name}.{c.name}" for t in metadata.sorted_tables for c in t.columns if not c.comment]
    assert missing == []


def test_comments_reach_postgres(pg_url: str) -> None:
    store = open_store(pg_url, create=True)
    try:
        with store.engine.connect() as conn:
            inspector = sa.inspect(conn)
            for table in metadata.sorted_tables:
                assert inspector.get_table_comment(table.name)["text"] == table.comment
                live = {c["name"]: c.get("comment") for c in inspector.get_columns(table.name)}
                assert live == {c.name: c.comment for c in table.columns}
    finally:
        store.dispose()


def test_public_relations_expose_their_columns(any_db: str) -> None:
    store = open_store(any_db, create=True)
    try:
        with store.engine.connect() as conn:
            inspector = sa.inspect(conn)
            for relation, columns in PUBLIC_RELATIONS.items():
                live = [c["name"] for c in inspector.get_columns(relation)]
                assert set(columns) <= set(live), (relation, sorted(set(columns) - set(live)))
                conn.execute(sa.text(f"SELECT * FROM {relation} WHERE 1 = 0")).all()
    finally:
        store.dispose()


def test_events_are_indexed_by_run_and_seq(any_db: str) -> None:
    store = open_store(any_db, create=True)
    try:
        with store.engine.connect() as conn:
            inspector = sa.inspect(conn)
            keys = [inspector.get_pk_constraint("events")["constrained_columns"]]
            keys += [ix["column_names"] for ix in inspector.get_indexes("events")]
        assert any(k[0] == "run_id" and "seq" in k for k in keys), keys
    finally:
        store.dispose()


def test_schema_reference_documents_every_public_column() -> None:
    doc = (REPO / "docs" / "schema.md").read_text()
    sections = dict(re.findall(r"^## `(\w+)` \((?:table|view)\)\n(.*?)(?=^## |\Z)", doc, re.M | re.S))
    for relation, columns in PUBLIC_RELATIONS.items():
        assert relation in sections, f"docs/schema.md has no section for {relation}"
        listed = set(re.findall(r"^\| `(\w+)` \|", sections[relation], re.M))
        assert set(columns) <= listed, (relation, sorted(set(columns) - listed))


# --- frozen databases ----------------------------------------------------------------


def test_every_released_revision_is_frozen() -> None:
    # Every revision before head has been released and must stay upgradable;
    # head is frozen when it is released (scripts/make_frozen_db.py).
    frozen = {p.stem for p in FROZEN}
    missing = [rev for rev in REVISIONS[:-1] if rev not in frozen]
    assert not missing, f"no frozen database for {missing}; see scripts/make_frozen_db.py"
    assert frozen <= set(REVISIONS), f"frozen databases of unknown revisions: {sorted(frozen - set(REVISIONS))}"


def _frozen_revision(path: Path) -> str:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return str(conn.execute("SELECT version_num FROM alembic_version").fetchone()[0])
    finally:
        conn.close()


def _counts(engine: sa.Engine, tables: list[str]) -> dict[str, int]:
    with engine.connect() as conn:
        return {t: int(conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one()) for t in tables}


def _frozen_tables(path: Path) -> list[str]:
    engine = sa.create_engine(f"sqlite:///file:{path}?mode=ro&uri=true", poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return [t for t in sa.inspect(conn).get_table_names() if t != "alembic_version"]
    finally:
        engine.dispose()


@pytest.mark.parametrize("frozen", FROZEN, ids=[p.stem for p in FROZEN])
def test_frozen_database_upgrades_cleanly(frozen: Path, tmp_path: Path, run_cli, digest) -> None:  # type: ignore[no-untyped-def]
    rev = frozen.stem
    db = tmp_path / frozen.name
    shutil.copyfile(frozen, db)
    assert _frozen_revision(db) == rev
    tables = _frozen_tables(db)
    engine = sa.create_engine(f"sqlite:///{db}", poolclass=NullPool)
    before_counts = _counts(engine, tables)
    assert before_counts["events"] > 0 and before_counts["runs"] > 0

    if rev != HEAD:  # an older database is refused, untouched, until upgraded
        before = digest(db)
        result = run_cli("runs", "--db", str(db))
        assert (result.code, result.err) == (
            1, f"modtrace: error: {db} uses schema revision {rev}, older than this modtrace's {HEAD}; "
               f"run `modtrace db upgrade --db {db}`\n")
        assert digest(db) == before

    result = run_cli("db", "upgrade", "--db", str(db))
    expected = f"{db}: already at head ({HEAD})\n" if rev == HEAD else f"{db}: upgraded {rev} -> {HEAD}\n"
    assert (result.code, result.out, result.err) == (0, expected, "")

    store = open_store(str(db))
    try:
        assert _diff(store) == []
        assert _counts(store.engine, tables) == before_counts
        n_events = _counts(store.engine, ["event_log"])["event_log"]
        assert n_events == before_counts["events"]
    finally:
        store.dispose()
        engine.dispose()
    listed = run_cli("runs", "--db", str(db), "--format", "csv")
    assert listed.code == 0
    assert {line.split(",")[1] for line in listed.out.splitlines()[1:]} == {"frozen-ddp", "frozen-crashed"}
    assert _analysis_states(db) == _expected_analysis_states(rev)


def _analysis_states(db: Path | str) -> dict[str, str]:
    """runs.analysis by run name, and run_ranks.analysis by (run name, rank)."""
    engine = sa.create_engine(db if isinstance(db, str) else f"sqlite:///{db}", poolclass=NullPool)
    try:
        with engine.connect() as conn:
            found = {str(n): str(a) for n, a in conn.exec_driver_sql("SELECT name, analysis FROM runs")}
            found.update({f"{n}/{k}": str(a) for n, k, a in conn.exec_driver_sql(
                "SELECT r.name, k.rank, k.analysis FROM run_ranks k JOIN runs r ON r.id = k.run_id")})
            return found
    finally:
        engine.dispose()


def _expected_analysis_states(rev: str) -> dict[str, str]:
    """Revision 0012 fills the analysis state from what was stored: the frozen files analyse
    frozen-ddp (both ranks) from revision 0002, when spans were first stored, and never frozen-crashed."""
    ddp = "stored" if rev >= "0002" else "none"
    return {"frozen-ddp": ddp, "frozen-ddp/0": ddp, "frozen-ddp/1": ddp,
            "frozen-crashed": "none", "frozen-crashed/0": "none"}


@pytest.mark.parametrize("frozen", FROZEN, ids=[p.stem for p in FROZEN])
def test_frozen_data_upgrades_on_postgres(frozen: Path, pg_url: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    """The same data, loaded into PostgreSQL at the frozen revision, upgrades to head."""
    rev = frozen.stem
    target = _bare_store(pg_url)
    source = sa.create_engine(f"sqlite:///file:{frozen}?mode=ro&uri=true", poolclass=NullPool)
    try:
        upgrade(target, revision=rev)
        src_meta = sa.MetaData()
        src_meta.reflect(source)
        dst_meta = sa.MetaData()
        dst_meta.reflect(target.engine)
        tables = [t.name for t in src_meta.sorted_tables if t.name != "alembic_version"]
        with source.connect() as src, target.engine.begin() as dst:
            for name in tables:
                rows = [dict(r._mapping) for r in src.execute(sa.select(src_meta.tables[name]))]
                if rows:
                    dst.execute(sa.insert(dst_meta.tables[name]), rows)
            dst.exec_driver_sql("SELECT setval(pg_get_serial_sequence('runs', 'id'), (SELECT max(id) FROM runs))")
        before_counts = _counts(target.engine, tables)

        result = run_cli("db", "upgrade", "--db", pg_url)
        assert result.code == 0, result
        store = open_store(pg_url)
        try:
            assert _diff(store) == []
            assert _counts(store.engine, tables) == before_counts
        finally:
            store.dispose()
        assert _analysis_states(pg_url) == _expected_analysis_states(rev)
    finally:
        target.dispose()
        source.dispose()
