"""Engines and connections: turn ``--db`` into a checked SQLAlchemy engine.

``--db`` (or ``MODTRACE_DB``) is a file path or any SQLAlchemy URL; the
default is ``./modtrace.db``.  Before anything touches a SQLite file we check
that it is ours: a file that is not SQLite, or a SQLite database of another
application, is refused and left byte-identical.  Read commands never create
a database.

Nothing here opens a descriptor of the database file (or its ``-wal``/``-shm``)
besides SQLite: closing any descriptor of a file drops every POSIX lock the
process holds on it, SQLite's included, and another process may then
checkpoint and reset the write-ahead log under this process's connections
(the user's own ``sqlite3`` ones too), which then read a torn database.  So
the file's header is judged by SQLite (``file is not a database``) and ranks
that create the schema at once serialise on a side file, ``<db>.modtrace-lock``.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, OperationalError
from sqlalchemy.pool import NullPool, QueuePool

from modtrace.core.errors import StoreError, UsageError
from modtrace.store.base import Store, check_revision, read_revision

try:
    import fcntl
except ImportError:  # not POSIX: _file_lock falls back to an exclusively created lock file
    fcntl = None  # type: ignore[assignment]

__all__ = ["Store", "check_revision", "open_store", "read_revision", "resolve_db"]

DEFAULT_DB = "modtrace.db"
# SQLite's smallest page: a non-empty file shorter than one page is not a SQLite database
# (SQLite itself would take a one-byte file for an empty database and write over it).
MIN_SQLITE_BYTES = 512
LOCK_SUFFIX = ".modtrace-lock"
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


def sqlite_files(db: str | None) -> list[Path]:
    """The files of the SQLite database ``db`` names (see ``resolve_db``): the database and
    SQLite's ``-wal``, ``-shm`` and ``-journal`` beside it; none for a server's URL."""
    target = resolve_db(db)
    if _is_url(target):
        try:
            parsed = make_url(target)
        except ArgumentError:
            return []
        if not parsed.drivername.startswith("sqlite") or parsed.database in (None, "", ":memory:"):
            return []
        target = parsed.database
    path = Path(target).expanduser().absolute()
    return [path, *(path.with_name(path.name + s) for s in ("-wal", "-shm", "-journal"))]


def kept_open(store: Store) -> Store:
    """``store``'s database through an engine of its own that keeps its connections open between
    uses (the others open one per use): for a caller that makes many short reads and writes, as
    the analysis that follows a recording does (several a round; opening one costs 1.5 ms on
    SQLite, more over a network).  The caller disposes of it."""
    if store.path is not None:
        engine = _sqlite_engine(store.path, kept=True)
    else:
        engine = _pg_engine(store.engine.url.render_as_string(hide_password=False), kept=True)
    return Store(engine=engine, label=store.label, path=store.path)


def _sqlite_engine(path: Path, *, readonly: bool = False, immutable: bool = False, kept: bool = False) -> Engine:
    if immutable:
        # On a read-only filesystem SQLite cannot create the WAL index (-shm)
        # a WAL database needs; nothing can change the file there, so say so.
        url = f"sqlite:///file:{path}?mode=ro&immutable=1&uri=true"
    elif readonly:
        url = f"sqlite:///file:{path}?mode=ro&uri=true"
    else:
        url = f"sqlite:///{path}"
    # kept: a connection may be used by another thread than the one that opened it (one at a time)
    engine = create_engine(url, poolclass=QueuePool, pool_size=1, max_overflow=4,
                           connect_args={"check_same_thread": False}) if kept else create_engine(url, poolclass=NullPool)
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


def _pg_engine(url: str, *, kept: bool = False) -> Engine:
    try:
        return create_engine(url, poolclass=QueuePool, pool_size=1, max_overflow=4) if kept else (
            create_engine(url, poolclass=NullPool))
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
    """Validate a SQLite path from its metadata alone. Returns True if it is new or empty.

    The header is not read here (a descriptor of the file, closed, would drop the
    process's SQLite locks): SQLite reads it at the first connection, and
    ``_read_revision_sqlite`` turns its ``file is not a database`` into the refusal."""
    try:
        st = path.stat()
    except FileNotFoundError:
        if not create:
            raise StoreError(f"no modtrace database at {path} (record a run first, or pass --db)") from None
        if not path.parent.is_dir():
            raise StoreError(f"cannot create {path}: directory {path.parent} does not exist") from None
        return True
    except PermissionError:
        raise StoreError(f"cannot read {path}: permission denied") from None
    if stat.S_ISDIR(st.st_mode):
        raise StoreError(f"{path} is a directory, not a database file")
    if not os.access(path, os.R_OK):
        raise StoreError(f"cannot read {path}: permission denied")
    if st.st_size == 0:
        if not create:
            raise StoreError(f"{path} is empty, not a modtrace database")
        return True
    if st.st_size < MIN_SQLITE_BYTES:
        raise StoreError(_not_sqlite(path))
    return False


def _not_sqlite(path: Path | str) -> str:
    return f"{path} is not a SQLite database; refusing to touch it"


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
    except DatabaseError as exc:
        # SQLITE_NOTADB: SQLite read the header and it is not its own (it wrote nothing).
        if getattr(exc.orig, "sqlite_errorcode", 26) == 26 and "not a database" in str(exc.orig):
            raise StoreError(_not_sqlite(store.label)) from None
        raise StoreError(f"cannot read {store.label}: {exc.orig}") from None


def lock_path(path: Path) -> Path:
    """The side file ranks lock to create ``path``'s schema one at a time (``_file_lock``)."""
    return path.with_name(f"{path.name}{LOCK_SUFFIX}")


@contextmanager
def _file_lock(path: Path, *, shared: bool = False) -> Iterator[None]:
    # Ranks of one launch may all find the database missing: a BSD lock lets one
    # create it.  It is taken on a side file, never on the database: the descriptor
    # closed after would drop SQLite's POSIX locks of this process on the database.
    # A shared lock (read-only, never creates) waits for a creator holding it.
    # The creator removes the side file once the schema is committed, still holding
    # it: a rank that then locks a new file of that name, or the removed one it had
    # opened, finds the schema and creates nothing.  After a failure it is left
    # (an empty file, harmless): the next creator locks it.
    if fcntl is None:
        with _lock_file(path, shared=shared):
            yield
        return
    lock = lock_path(path)
    try:
        fd = os.open(lock, os.O_RDONLY) if shared else os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        if not shared:
            raise StoreError(f"cannot create {lock} (the lock that lets one process create {path.name}): "
                             f"{exc.strerror}") from None
        # No side file we can open: no modtrace of ours is creating the database.
        fd = -1
    if fd < 0:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        yield
        if not shared:
            lock.unlink(missing_ok=True)
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
