"""Scanning SQL text: which statements a query holds, and whether they only read.

``scan_sql`` splits the text into statements, skipping comments and quoted
text, and notes each statement's leading keyword and named parameters;
``check_read_only`` refuses anything but one SELECT/WITH/VALUES/EXPLAIN
statement, saying what it refused.  No database is involved: the read-only
connection (``query.open_readonly``) is the second line of defence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from modtrace.core.errors import UsageError

# Statements a query may be: they read.  EXPLAIN only describes a plan (on
# PostgreSQL, EXPLAIN ANALYZE of a write still meets the read-only transaction).
READ_KEYWORDS = frozenset({"SELECT", "WITH", "VALUES", "EXPLAIN"})

# Statements that write or change the session: named in the refusal when one
# of them is what the user sent.
WRITE_KEYWORDS = frozenset({
    "INSERT", "UPDATE", "DELETE", "REPLACE", "MERGE", "UPSERT", "DROP", "CREATE", "ALTER",
    "TRUNCATE", "ATTACH", "DETACH", "PRAGMA", "VACUUM", "REINDEX", "ANALYZE", "GRANT", "REVOKE",
    "COPY", "CALL", "DO", "SET", "RESET", "BEGIN", "START", "COMMIT", "END", "ROLLBACK",
    "SAVEPOINT", "RELEASE", "LOCK", "LISTEN", "NOTIFY", "UNLISTEN", "REFRESH", "CLUSTER",
    "COMMENT", "DISCARD", "PREPARE", "EXECUTE", "DEALLOCATE", "LOAD", "CHECKPOINT", "SECURITY",
})

# Words that make a statement that starts as a read write after all:
# PostgreSQL's data-modifying CTEs (WITH d AS (DELETE ...)), SQLite's
# WITH ... INSERT, SELECT ... INTO (creates a table) and row locks.
_WRITES_INSIDE_READ = frozenset({"INSERT", "UPDATE", "DELETE", "MERGE", "INTO"})


class QueryRefused(UsageError):
    """A statement that is not a single read-only query."""


# --- scanning SQL text ----------------------------------------------------------------


@dataclass(frozen=True)
class ScannedSql:
    """SQL text as the driver will see it, and what is in it.

    ``bindable`` has comments blanked out and colons inside literals and
    quoted identifiers escaped (``\\:``), so that SQLAlchemy's ``text()``
    binds exactly ``params``.  ``words`` are the upper-cased bare words outside
    literals and comments, per statement.
    """

    bindable: str
    params: tuple[str, ...]
    statements: tuple[tuple[str, ...], ...]


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")


def scan_sql(sql: str) -> ScannedSql:
    """Tokenise just enough SQL to find parameters, statements and keywords."""
    out: list[str] = []
    params: list[str] = []
    statements: list[list[str]] = [[]]
    i, n = 0, len(sql)
    while i < n:
        ch = sql[i]
        nxt = sql[i + 1] if i + 1 < n else ""
        if ch == "-" and nxt == "-":
            end = sql.find("\n", i)
            end = n if end < 0 else end
            out.append(" ")
            i = end
        elif ch == "/" and nxt == "*":
            end = sql.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append(" ")
            i = end
        elif ch in ("'", '"'):
            j = i + 1
            while j < n:
                if sql[j] == ch:
                    if j + 1 < n and sql[j + 1] == ch:  # doubled quote inside
                        j += 2
                        continue
                    break
                j += 1
            out.append(sql[i:j + 1].replace(":", "\\:"))
            i = j + 1
        elif ch == ":":
            if nxt == ":":  # PostgreSQL cast; never a parameter
                out.append("\\:\\:")
                i += 2
                continue
            m = _WORD.match(sql, i + 1)
            prev = sql[i - 1] if i else ""
            if m and not (prev.isalnum() or prev == "_"):
                if m.group(0) not in params:
                    params.append(m.group(0))
                out.append(":" + m.group(0))
                i = m.end()
            else:
                out.append("\\:")
                i += 1
        elif ch == ";":
            statements.append([])
            out.append(ch)
            i += 1
        elif ch.isalpha() or ch == "_":
            m = _WORD.match(sql, i)
            assert m is not None
            statements[-1].append(m.group(0).upper())
            out.append(m.group(0))
            i = m.end()
        elif ch.isdigit():
            # a number such as 1e6 is not the word "e6"
            j = i
            while j < n and (sql[j].isalnum() or sql[j] in "._"):
                j += 1
            out.append(sql[i:j])
            i = j
        else:
            out.append(ch)
            i += 1
    return ScannedSql(
        bindable="".join(out),
        params=tuple(params),
        statements=tuple(tuple(s) for s in statements if s),
    )


def check_read_only(scanned: ScannedSql) -> None:
    """Refuse anything but one read-only statement, saying what was refused."""
    if not scanned.statements:
        raise QueryRefused("query refused: no SQL statement given")
    if len(scanned.statements) > 1:
        kinds = ", ".join(s[0] for s in scanned.statements)
        raise QueryRefused(f"query refused: one statement at a time; got {len(scanned.statements)} ({kinds})")
    words = scanned.statements[0]
    allowed = "only read-only statements (SELECT/WITH/VALUES/EXPLAIN) are allowed"
    if words[0] not in READ_KEYWORDS:
        hint = " (read pragmas with SELECT * FROM pragma_table_info('spans') and the like)" if words[0] == "PRAGMA" else ""
        raise QueryRefused(f"query refused: {allowed}; got {words[0]}{hint}")
    inside = next((w for w in words if w in _WRITES_INSIDE_READ), None)
    if inside is None and any(a == "FOR" and b in ("SHARE", "KEY", "NO") for a, b in zip(words, words[1:], strict=False)):
        inside = "FOR SHARE"
    if inside is not None:
        raise QueryRefused(f"query refused: {allowed}; this {words[0]} statement contains {inside}")
