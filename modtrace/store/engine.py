"""Engines and connections: turn ``--db`` into a checked SQLAlchemy engine.

``--db`` (or ``MODTRACE_DB``) is a file path or any SQLAlchemy URL; the
default is ``./modtrace.db``.  Before anything touches a SQLite file we check
that it is ours: a file that is not SQLite, or a SQLite database of another
application, is refused and left byte-identical.  Read commands never create
a database.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError
from sqlalchemy.pool import NullPool

from modtrace.core.errors import StoreError, UsageError
from modtrace.store.base import Store, check_revision, read_revision

try:
    import fcntl
except ImportError:  # not POSIX: _file_lock falls back to a lock file
    fcntl = None  # type: ignore[assignment]

__all__ = ["Store", "check_revision", "open_store", "read_revision", "resolve_db"]

DEFAULT_DB = "modtrace.db"
SQLITE_MAGIC = b"SQLite format 3\x00"
BUSY_TIMEOUT_MS = 60_000  # MODTRACE_BUSY_TIMEOUT_MS overrides it (a writer retries past it, see store.retry)


def busy_timeout_ms() -> int:
    raw = os.environ.get("MODTRACE_BUSY_TIMEOUT_MS")
    try:
        return max(0, int(raw)) if raw else BUSY_TIMEOUT_MS
    except ValueError:
        raise UsageError(f"MODTRACE_BUSY_TIMEOUT_MS must be a whole number of milliseconds, not {raw!r}") from None


def resolve_db(db: str | None) -> str:
    """The database the user meant: explicit ``--db``, then ``MODTRACE_DB``, then the default."""
    if db:
        return db
    return os.environ.get("MODTRACE_DB") or DEFAULT_DB


def _is_url(db: str) -> bool:
    return "://" in db


def _sqlite_engine(path: Path, *, readonly: bool = False, immutable: bool = False) -> Engine:
    if immutable:
        # On a read-only filesystem SQLite cannot create the WAL index (-shm)
        # a WAL database needs; nothing can change the file there, so say so.
        url = f"sqlite:///file:{path}?mode=ro&immutable=1&uri=true"
    elif readonly:
        url = f"sqlite:///file:{path}?mode=ro&uri=true"
    else:
        url = f"sqlite:///{path}"
    engine = create_engine(url, poolclass=NullPool)
    busy_ms = busy_timeout_ms()

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Per-connection settings only: nothing here writes to the file, so
        # opening a database we then refuse leaves it untouched.
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {busy_ms}")
        cur.execute("PRAGMA foreign_keys = ON")
        cur.execute("PRAGMA synchronous = NORMAL")
        if readonly:
            cur.execute("PRAGMA query_only = ON")
        cur.close()

    return engine


def _pg_engine(url: str) -> Engine:
    try:
        return create_engine(url, poolclass=NullPool)
    except ArgumentError as exc:
        raise UsageError(f"invalid database URL {url!r}: {exc}") from None
    except ModuleNotFoundError as exc:
        raise StoreError(
            f"the driver for {url.split('://')[0]} is not installed ({exc.name}); "
            "for PostgreSQL install modtrace[postgres]"
        ) from None


def _describe(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def _check_sqlite_file(path: Path, *, create: bool) -> bool:
    """Validate a SQLite path without writing to it. Returns True if it is new or empty."""
    if path.is_dir():
        raise StoreError(f"{path} is a directory, not a database file")
    if not path.exists():
        if not create:
            raise StoreError(f"no modtrace database at {path} (record a run first, or pass --db)")
        if not path.parent.is_dir():
            raise StoreError(f"cannot create {path}: directory {path.parent} does not exist")
        return True
    try:
        with path.open("rb") as fh:
            head = fh.read(len(SQLITE_MAGIC))
    except PermissionError:
        raise StoreError(f"cannot read {path}: permission denied") from None
    if not head:
        if not create:
            raise StoreError(f"{path} is empty, not a modtrace database")
        return True
    if head != SQLITE_MAGIC:
        raise StoreError(f"{path} is not a SQLite database; refusing to touch it")
    return False


def open_store(db: str | None = None, *, create: bool = False, check: bool = True, readonly: bool = False) -> Store:
    """Open the database named by ``db`` (see ``resolve_db``).

    With ``create`` a missing database is created at head (the caller is
    about to write).  Without it, a missing database is an error and nothing
    is created.  With ``check`` the schema revision must be head.  With
    ``readonly`` a SQLite file is opened and checked through read-only
    connections that refuse writes (``PRAGMA query_only``), so not even a
    WAL checkpoint touches it.
    """
    if readonly and create:
        raise ValueError("a database opened read-only cannot be created")
    target = resolve_db(db)
    if _is_url(target):
        return _open_url(target, create=create, check=check, readonly=readonly)
    path = Path(target).expanduser().absolute()
    fresh = _check_sqlite_file(path, create=create)
    if fresh and readonly:
        raise StoreError(f"{path} is empty, not a modtrace database")
    if create and path.exists() and not os.access(path, os.W_OK):
        raise StoreError(f"{path} is read-only; cannot record into it")
    if create and not fresh:
        if not os.access(path.parent, os.W_OK):
            raise StoreError(f"cannot write next to {path}: directory is read-only (SQLite needs it for its journal)")
    engine = _sqlite_engine(path, readonly=readonly, immutable=not create and _read_only_fs(path))
    store = Store(engine=engine, label=str(path), path=path)
    try:
        if fresh:
            _create_sqlite(store)
            store.created = True
        else:
            rev, has_tables = _read_revision_sqlite(store)
            if rev is None and has_tables:
                # Tables without a revision may be another process creating
                # the schema right now: it holds the creation lock until done.
                with _file_lock(path, shared=True):
                    rev, has_tables = _read_revision_sqlite(store)
            if rev is None:
                if has_tables:
                    raise StoreError(
                        f"{path} is a SQLite database of another application (no modtrace schema); refusing to touch it"
                    )
                if not create:
                    raise StoreError(f"{path} has no modtrace schema yet")
                _create_sqlite(store)
                store.created = True
            elif check:
                check_revision(rev, str(path))
    except BaseException:
        engine.dispose()
        raise
    return store


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _read_revision_sqlite(store: Store) -> tuple[str | None, bool]:
    try:
        return read_revision(store.engine)
    except OperationalError as exc:
        raise StoreError(f"cannot read {store.label}: {exc.orig}") from None


@contextmanager
def _file_lock(path: Path, *, shared: bool = False) -> Iterator[None]:
    # Ranks of one launch may all find the database missing; a BSD lock on the
    # file itself (independent of SQLite's own POSIX locks) lets one create it.
    # A shared lock (read-only descriptor, never creates) waits for that creator.
    if fcntl is None:
        with _lock_file(path, shared=shared):
            yield
        return
    fd = os.open(path, os.O_RDONLY) if shared else os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


@contextmanager
def _lock_file(path: Path, *, shared: bool) -> Iterator[None]:
    # Without flock: the creator holds PATH.lock (created exclusively); a
    # shared holder only waits until no creator holds it.
    lock = path.with_name(f"{path.name}.lock")
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            if shared:
                if not lock.exists():
                    break
            else:
                os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
                break
        except FileExistsError:
            pass
        if time.monotonic() > deadline:
            raise StoreError(f"{path}: timed out waiting for {lock} (remove it if no modtrace is creating the database)")
        time.sleep(0.05)
    try:
        yield
    finally:
        if not shared:
            lock.unlink(missing_ok=True)


def _create_sqlite(store: Store) -> None:
    assert store.path is not None
    with _file_lock(store.path):
        rev, has_tables = read_revision(store.engine)
        if rev is None and has_tables:
            raise StoreError(f"{store.label} is a SQLite database of another application; refusing to touch it")
        if rev is None:
            from modtrace.store.create import create_at_head

            with store.engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA journal_mode = WAL")
                conn.commit()
                create_at_head(conn)
        else:
            check_revision(rev, store.label)


def _open_url(url: str, *, create: bool, check: bool, readonly: bool) -> Store:
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise UsageError(f"invalid database URL {url!r}") from None
    if parsed.drivername.startswith("sqlite"):
        if parsed.database in (None, "", ":memory:"):
            if readonly:
                raise UsageError("an in-memory SQLite database has nothing to read; give a file path")
            raise UsageError("an in-memory SQLite database cannot hold a recording; give a file path")
        return open_store(parsed.database, create=create, check=check, readonly=readonly)
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
        url = parsed.render_as_string(hide_password=False)
    engine = _pg_engine(url)
    store = Store(engine=engine, label=_describe(url), path=None)
    try:
        try:
            rev, has_tables = read_revision(engine)
        except OperationalError as exc:
            raise StoreError(f"cannot connect to {store.label}: {str(exc.orig).strip().splitlines()[0]}") from None
        if rev is None:
            if has_tables and not create:
                raise StoreError(f"{store.label} has no modtrace schema")
            if not create:
                raise StoreError(f"{store.label} has no modtrace schema yet (record a run first, or run `modtrace db upgrade`)")
            from modtrace.store.migrate import upgrade

            upgrade(store)
            store.created = True
        elif check:
            check_revision(rev, store.label)
    except BaseException:
        engine.dispose()
        raise
    return store
