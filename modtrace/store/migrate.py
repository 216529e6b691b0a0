"""Alembic, driven from the installed package.

The migration scripts ship inside the wheel as ``modtrace/migrations``; in a
source checkout (editable install) they are the repository's top-level
``migrations/``.  Nothing here needs an ``alembic.ini``.
"""

from __future__ import annotations

import zlib
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from modtrace.core.errors import StoreError
from modtrace.store.base import SchemaTooOld, Store, check_revision, read_revision
from modtrace.store.schema import HEAD, metadata

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def migrations_dir() -> Path:
    for candidate in (_PACKAGE_DIR / "migrations", _PACKAGE_DIR.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise StoreError("modtrace's migration scripts are missing from this installation")


def alembic_config(store: Store | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    if store is not None:
        cfg.attributes["engine"] = store.engine
    return cfg


def script_revisions() -> list[str]:
    """Revision ids of the migration scripts, oldest first."""
    script = ScriptDirectory.from_config(alembic_config())
    return [rev.revision for rev in reversed(list(script.walk_revisions()))]


_PG_LOCK_KEY = zlib.crc32(b"modtrace-migrate")


def upgrade(store: Store, revision: str = "head") -> tuple[str | None, str]:
    """Upgrade to ``revision``; returns (revision before, revision after).

    Refuses a database that holds tables of ours without a version (another
    application's tables of the same names).  On PostgreSQL an advisory lock
    serialises ranks that start at once.
    """
    cfg = alembic_config(store)
    with store.engine.connect() as conn:
        if store.dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK_KEY})
            conn.commit()
        try:
            rev, _ = read_revision(store.engine)
            if rev is None:
                clash = set(inspect(conn).get_table_names()) & set(metadata.tables)
                if clash:
                    raise StoreError(
                        f"{store.label} already has tables named {', '.join(sorted(clash))} "
                        "that modtrace did not create; refusing to touch them"
                    )
            elif revision == "head" and rev != HEAD:
                check_known(rev, store.label)
            if rev != HEAD or revision != "head":
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, revision)
                conn.commit()
            after, _ = read_revision(store.engine)
        finally:
            if store.dialect == "postgresql":
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK_KEY})
                conn.commit()
    assert after is not None
    return rev, after


def check_known(rev: str, label: str) -> None:
    """Raise for a revision newer than this modtrace (an older one is fine to upgrade)."""
    try:
        check_revision(rev, label)
    except SchemaTooOld:
        pass
