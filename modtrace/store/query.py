"""Read-only SQL over a modtrace database: the query library and its runner.

The library is the repository's ``queries/*.sql`` (shipped in the wheel as
``modtrace/queries``).  Each file is one statement that starts with a comment
header::

    -- One line saying what the query answers.
    --
    -- Optional paragraphs explaining definitions and caveats.
    --
    -- Parameters:
    --   :run_id   the run (modtrace query --run RUN)
    --   :limit    most rows to return (default: 20)
    --
    -- Columns:
    --   fqn       module's fully qualified name
    --   self_ms   exclusive time, milliseconds

Parameters are SQL named parameters (``:name``) bound by the driver, never
formatted into the text.  A parameter called ``run_id`` or ending in ``_run``
takes a run reference (name, id, ``@``, ``@~N``) and is bound as the run's id.

Queries run on a connection that cannot write: SQLite is opened read-only
(``mode=ro``, ``query_only``, and an authorizer that denies anything but
reads), PostgreSQL in a ``READ ONLY`` transaction that is rolled back.  Before
that, ``check_read_only`` refuses anything but one SELECT/WITH/VALUES/EXPLAIN
statement with a message that says what was refused (``sql_scan``).
"""

from __future__ import annotations

import difflib
import re
import shlex
import sqlite3
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event, text
from sqlalchemy.exc import DBAPIError, StatementError

from modtrace.core.errors import ModtraceError, StoreError, UsageError
from modtrace.store.engine import Store, open_store
from modtrace.store.sql_scan import (
    READ_KEYWORDS,
    WRITE_KEYWORDS,
    QueryRefused,
    ScannedSql,
    check_read_only,
    scan_sql,
)

__all__ = [
    "ANALYSIS_RELATIONS", "AnalysisNotStored", "ParamDoc", "Query", "QueryRefused", "Result", "ScannedSql",
    "bind_params", "check_read_only", "execute", "library", "library_query", "open_readonly", "queries_dir",
    "read_query", "require_analysis", "resolve_query", "run_query", "scan_sql",
]

_PACKAGE_DIR = Path(__file__).resolve().parent.parent

# --- the library ------------------------------------------------------------------------


@dataclass(frozen=True)
class ParamDoc:
    name: str
    description: str
    default: str | None = None

    @property
    def is_run(self) -> bool:
        return is_run_param(self.name)


@dataclass(frozen=True)
class Query:
    """One query: its SQL and what its header says about it."""

    name: str
    sql: str
    purpose: str = ""
    description: str = ""
    params: tuple[ParamDoc, ...] = ()
    columns: tuple[tuple[str, str], ...] = ()
    path: Path | None = None
    scanned: ScannedSql = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "scanned", scan_sql(self.sql))

    @property
    def param_names(self) -> tuple[str, ...]:
        return self.scanned.params

    def param_doc(self, name: str) -> ParamDoc | None:
        return next((p for p in self.params if p.name == name), None)


def is_run_param(name: str) -> bool:
    """Parameters that take a run reference and are bound as a run id."""
    return name == "run_id" or name.endswith("_run")


def queries_dir() -> Path:
    """The query library: inside the package when installed, else the repository's queries/."""
    for candidate in (_PACKAGE_DIR / "queries", _PACKAGE_DIR.parent / "queries"):
        if candidate.is_dir() and any(candidate.glob("*.sql")):
            return candidate
    raise StoreError("modtrace's query library is missing from this installation")


_DEFAULT = re.compile(r"\(default:?\s*([^)]*)\)")
_ENTRY = re.compile(r"^(\s+):?([A-Za-z_]\w*)\s{2,}(\S.*)$")


def parse_header(sql: str) -> tuple[str, str, tuple[ParamDoc, ...], tuple[tuple[str, str], ...]]:
    """(purpose, description, parameters, columns) from a query's leading comment block.

    The first paragraph is the purpose, later ones the description, up to a
    ``Parameters:`` or ``Columns:`` line.  Entries of those sections are
    indented ``name  description`` lines (two spaces or more between);
    a line indented deeper continues the entry above it.
    """
    lines: list[str] = []
    for raw in sql.splitlines():
        stripped = raw.strip()
        if not stripped.startswith("--"):
            if stripped:
                break
            continue
        body = stripped[2:]
        lines.append(body[1:] if body.startswith(" ") else body)
    paragraphs: list[list[str]] = [[]]
    entries: dict[str, list[list[str]]] = {"parameters": [], "columns": []}
    section: str | None = None
    indent = 0
    for line in lines:
        word = line.strip()
        if word.lower() in ("parameters:", "columns:"):
            section = word[:-1].lower()
            continue
        if section is None:
            if word:
                paragraphs[-1].append(word)
            elif paragraphs[-1]:
                paragraphs.append([])
            continue
        if not word:
            continue
        m = _ENTRY.match(line)
        found = entries[section]
        if m and (not found or len(m.group(1)) <= indent):
            indent = len(m.group(1))
            found.append([m.group(2), m.group(3).strip()])
        elif found:
            found[-1][1] += " " + word
    texts = [" ".join(p) for p in paragraphs if p]
    params = tuple(
        ParamDoc(name, desc, (d.group(1).strip() if (d := _DEFAULT.search(desc)) else None))
        for name, desc in entries["parameters"]
    )
    columns = tuple((name, desc) for name, desc in entries["columns"])
    return (texts[0] if texts else ""), "\n\n".join(texts[1:]), params, columns


def read_query(path: Path, name: str | None = None) -> Query:
    try:
        sql = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
    purpose, description, params, columns = parse_header(sql)
    return Query(
        name=name or path.stem, sql=sql, purpose=purpose, description=description,
        params=params, columns=columns, path=path,
    )


def library() -> list[Query]:
    """Every query of the library, by name."""
    return [read_query(p) for p in sorted(queries_dir().glob("*.sql"))]


def library_query(name: str) -> Query:
    """The library query called ``name`` (with or without .sql); unknown names suggest close ones."""
    base = name[:-4] if name.endswith(".sql") else name
    path = queries_dir() / f"{base}.sql"
    if path.is_file():
        return read_query(path)
    names = sorted(p.stem for p in queries_dir().glob("*.sql"))
    close = difflib.get_close_matches(base, names, n=3, cutoff=0.5)
    if not close:
        close = [n for n in names if base and (base in n or n in base)][:3]
    hint = f"; did you mean {', '.join(close)}?" if close else "; `modtrace query --list` shows them"
    raise UsageError(f"no query named {base!r} in the library{hint}")


def resolve_query(arg: str) -> Query:
    """NAME of a library query, PATH of a .sql file, or the text of one statement.

    Text with whitespace, or a single SQL keyword, is a statement; an existing
    file with a .sql suffix or a path separator is a file; anything else names
    a library query.
    """
    s = arg.strip()
    if any(c.isspace() for c in s) or s.upper() in READ_KEYWORDS | WRITE_KEYWORDS:
        return Query(name="statement", sql=arg)
    path = Path(s).expanduser()
    if path.is_file() and (path.suffix == ".sql" or "/" in s):
        return read_query(path)
    if "/" in s:
        raise UsageError(f"no query file {s!r}")
    return library_query(s)


# --- parameters -------------------------------------------------------------------------


def coerce(value: str) -> int | float | str:
    """A command-line value as the driver should bind it: integer, decimal or text."""
    v = value.strip()
    if re.fullmatch(r"[+-]?\d+", v):
        return int(v)
    if re.fullmatch(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?", v):
        return float(v)
    return value


def bind_params(store: Store, query: Query, given: Mapping[str, str]) -> dict[str, Any]:
    """Values for every parameter of ``query``: given, else the header's default.

    Run parameters are resolved to run ids.  A missing parameter, or one the
    query does not take, is a usage error naming it.
    """
    from modtrace.store.runs import resolve_run

    wanted = query.param_names
    extra = [k for k in given if k not in wanted]
    if extra:
        takes = ", ".join(f":{p}" for p in wanted) or "no parameters"
        raise UsageError(f"query {query.name} takes no parameter :{extra[0]} (it takes {takes})")
    values: dict[str, Any] = {}
    for name in wanted:
        doc = query.param_doc(name)
        raw = given.get(name, doc.default if doc else None)
        if raw is None:
            how = "--run RUN or --param run_id=RUN" if name == "run_id" else f"--param {name}=VALUE"
            raise UsageError(f"query {query.name} needs parameter :{name} (pass {how})")
        if is_run_param(name):
            values[name] = resolve_run(store, str(raw)).id
        else:
            values[name] = coerce(str(raw))
    return values


# --- read-only execution ----------------------------------------------------------------


def open_readonly(db: str | None) -> Store:
    """Open the database for reading only: version-checked, never created, never written.

    On SQLite the connections are read-only (``open_store(readonly=True)``)
    and an authorizer refuses anything but reads.
    """
    store = open_store(db, readonly=True)
    if store.is_sqlite:
        _deny_writes(store.engine)
    return store


# Authorizer actions a read needs (sqlite3 constants): everything else is denied.
_SQLITE_READ_ACTIONS = frozenset({
    sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE,
})

# Pragmas whose argument names a thing to describe, never a value to set.
_READ_PRAGMAS = frozenset({
    "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
    "foreign_key_list", "database_list", "collation_list", "function_list", "module_list",
    "pragma_list", "compile_options",
})


# Set when the authorizer denies something on this thread: the statement then
# failed because it was refused, whatever the message says.
_denials = threading.local()


def _authorize(action: int, arg1: str | None, arg2: str | None, dbname: str | None, source: str | None) -> int:
    verdict = _verdict(action, arg1, arg2, source)
    if verdict == sqlite3.SQLITE_DENY:
        _denials.seen = True
    return verdict


def _verdict(action: int, arg1: str | None, arg2: str | None, source: str | None) -> int:
    if action in _SQLITE_READ_ACTIONS:
        if action == sqlite3.SQLITE_FUNCTION and arg2 and arg2.lower() == "load_extension":
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_UPDATE and arg1 == "sqlite_master" and source is None:
        # SQLite asks this while it works out a view's columns for
        # pragma_table_info; the file is open read-only, so nothing is written.
        return sqlite3.SQLITE_OK
    if action == sqlite3.SQLITE_PRAGMA and arg1 is not None and arg1.lower() in _READ_PRAGMAS:
        return sqlite3.SQLITE_OK  # pragma_table_info('spans') and the like
    return sqlite3.SQLITE_DENY


def _deny_writes(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _install(dbapi_conn: Any, _record: Any) -> None:
        # Installed after the read-only PRAGMAs of the engine's own listener.
        dbapi_conn.set_authorizer(_authorize)


@dataclass(frozen=True)
class Result:
    columns: list[str]
    rows: list[tuple[Any, ...]]
    # Why an empty result may not mean what it seems (``run_lookalikes``); the CLI prints them.
    notes: tuple[str, ...] = ()


def _plain(value: Any) -> Any:
    # PostgreSQL returns NUMERIC for SUM/AVG of integers; SQLite returns int/float.
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() and value.as_tuple().exponent == 0 else float(value)
    if isinstance(value, memoryview):
        return bytes(value).hex()
    if isinstance(value, bytes):
        return value.hex()
    return value


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    msg = str(orig).strip().splitlines()
    return msg[0] if msg else type(orig).__name__


# How the database says it refused a write: our SQLite authorizer denied it,
# SQLite's result code says so (SQLITE_AUTH 23, SQLITE_READONLY 8; Python >= 3.11
# gives the code), or PostgreSQL's SQLSTATE is read_only_sql_transaction.
_SQLITE_REFUSED = frozenset({23, 8})
_PG_READ_ONLY_SQL_TRANSACTION = "25006"


def _is_write_refused(exc: BaseException) -> bool:
    if getattr(_denials, "seen", False):
        return True
    orig = getattr(exc, "orig", None)
    code = getattr(orig, "sqlite_errorcode", None)
    if code is not None:
        return (int(code) & 0xFF) in _SQLITE_REFUSED  # extended codes carry the primary one in the low byte
    return getattr(orig, "sqlstate", None) == _PG_READ_ONLY_SQL_TRANSACTION


def execute(store: Store, query: Query, params: Mapping[str, Any]) -> Result:
    """Run ``query`` with bound ``params`` on a connection that cannot write; nothing is committed."""
    check_read_only(query.scanned)
    stmt = text(query.scanned.bindable)
    _denials.seen = False
    try:
        with store.engine.connect() as conn:
            try:
                if store.dialect == "postgresql":
                    conn.exec_driver_sql("SET TRANSACTION READ ONLY")
                cursor = conn.execute(stmt, dict(params))
                columns = list(cursor.keys()) if cursor.returns_rows else []
                rows = [tuple(_plain(v) for v in row) for row in cursor] if cursor.returns_rows else []
            finally:
                conn.rollback()
    except (DBAPIError, StatementError) as exc:
        msg = _first_line(exc)
        if _is_write_refused(exc):
            raise QueryRefused(f"query refused: the connection is read-only ({msg})") from None
        what = "query" if query.path is None else f"query {query.name}"
        raise ModtraceError(f"{what} failed: {msg}") from None
    return Result(columns, rows)


# The relations that hold a run's analysis (empty for a run until it is stored), as
# ``ScannedSql.statements`` spells words.
ANALYSIS_RELATIONS = frozenset({"SPANS", "NESTING_ISSUES", "SPAN_ROWS", "SPAN_DEVICE_ROWS", "SPAN_COUNTER_ROWS", "TREE_NODES"})

# Why a run's analysis cannot answer, by runs.analysis state.
_NOT_STORED = {
    "none": "is not analysed yet",
    "partial": "is analysed for only some of its ranks",
    "stale": "was analysed before its recording ended",
}


class AnalysisNotStored(ModtraceError):
    """A query reads the analysis of a run whose analysis is not stored (runs.analysis)."""


def require_analysis(store: Store, query: Query, params: Mapping[str, Any]) -> None:
    """Refuse a query that reads the analysis relations for a run parameter's run whose
    analysis is not stored: their rows for it would be missing or partial, and an empty
    table would read as an answer.  (The query runs read-only, so it cannot store them.)"""
    from sqlalchemy import select

    from modtrace.store.schema import runs

    words = set().union(*query.scanned.statements)
    reads = sorted(w.lower() for w in words & ANALYSIS_RELATIONS)
    run_ids = [params[p] for p in query.param_names if is_run_param(p) and p in params]
    if not reads or not run_ids:
        return
    with store.engine.connect() as conn:
        found = conn.execute(select(runs.c.id, runs.c.name, runs.c.analysis).where(runs.c.id.in_(run_ids))).all()
    for run_id in run_ids:
        for _, name, state in (r for r in found if r[0] == run_id):
            if state != "stored":
                what = "the query" if query.path is None else f"query {query.name}"
                raise AnalysisNotStored(
                    f"run {name!r} {_NOT_STORED.get(state, 'has no stored analysis')} (runs.analysis = {state}) and "
                    f"{what} reads its {' and '.join(reads)}; store them first: modtrace analyze {shlex.quote(name)}")


def run_query(
    db: str | None, query: Query, given: Mapping[str, str] | None = None
) -> Result:
    """Open ``db`` read-only, bind ``given`` (strings, as from the command line) and run ``query``
    (refused for a run whose analysis it reads and is not stored: ``require_analysis``)."""
    check_read_only(query.scanned)
    store = open_readonly(db)
    try:
        params = bind_params(store, query, given or {})
        require_analysis(store, query, params)
        result = execute(store, query, params)
        if not result.rows:
            result = replace(result, notes=run_lookalikes(store, query, given or {}))
        return result
    finally:
        store.dispose()


def run_lookalikes(store: Store, query: Query, given: Mapping[str, str]) -> tuple[str, ...]:
    """Notes for text parameters whose value is a run reference.

    Only ``run_id`` and ``*_run`` parameters are resolved to run ids; any other
    binds as the text given, so ``-p rid=baseline`` compares ids with the word
    ``baseline`` and silently matches nothing.  Numbers bind as numbers and are
    left alone (an id given as a number is what the query wants).
    """
    from modtrace.store.runs import resolve_run

    notes = []
    for name in query.param_names:
        raw = given.get(name)
        if raw is None or is_run_param(name) or not isinstance(coerce(raw), str):
            continue
        try:
            run = resolve_run(store, raw)
        except ModtraceError:
            continue
        notes.append(
            f":{name} was bound as the text {raw!r}, not as run {run.name!r} (id {run.id}); only parameters "
            f"named run_id or ending in _run take a run reference (give --param {name}={run.id} for its id)"
        )
    return tuple(notes)
