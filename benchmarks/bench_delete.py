"""``modtrace delete`` of an analysed run: the wall time of the command, beside the command's floor.

For each database: a synthetic run of ``--events`` events (the analysis benchmarks' shape),
analysed (spans, issues, tree), then deleted with ``modtrace delete bench --yes`` in a fresh
interpreter, as a retention job runs it; repeated ``--repeats`` times (a new run each time).
The floor is ``modtrace runs --limit 1`` on the same database (interpreter, imports, opening
the database).  The figures are medians; the rows deleted per repeat are checked equal.  The
last line is a JSON summary.

    python benchmarks/bench_delete.py [--db URL]... [--pg URL] [--events 300000] [--repeats 3]

Without ``--db`` a SQLite file in a temporary directory is used; ``--pg URL`` adds a
scratch schema of that PostgreSQL server (dropped afterwards).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this tree's modtrace and benchmarks

from benchmarks._common import (  # noqa: E402
    drop_schema,
    fresh_schema,
    load_average,
    median,
    run_modtrace,
    write_recording,
)

SCHEMA = "modtrace_bench_delete"


def measure(db: str, events: int, repeats: int) -> dict[str, Any]:
    deletes, floors, rows = [], [], set()
    for _ in range(repeats):
        write_recording(db, events)
        run_modtrace(["analyze", "bench", "--db", db])
        floors.append(run_modtrace(["runs", "--limit", "1", "--db", db])[0])
        wall, done = run_modtrace(["delete", "bench", "--yes", "--db", db])
        deletes.append(wall)
        m = re.search(r": ([\d,]+) rows", done.stdout)
        rows.add(int(m.group(1).replace(",", "")) if m else -1)
    if len(rows) != 1:
        raise SystemExit(f"rows deleted differ between repeats: {sorted(rows)}")
    total = rows.pop()
    beyond = median(deletes) - median(floors)  # none on a busy machine when the delete itself is that short
    return {"db": db if "://" not in db else db.split("@")[-1], "events": events, "rows": total,
            "delete_s": round(median(deletes), 3), "floor_s": round(median(floors), 3),
            "rows_per_s": round(total / beyond) if beyond > 0 else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", action="append", default=None, help="a SQLite file or database URL (repeatable)")
    ap.add_argument("--pg", metavar="URL", default=None, help="also a scratch schema of this PostgreSQL server")
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dbs = args.db or [str(Path(tmp) / "delete.db")]
        if args.pg:
            dbs.append(fresh_schema(args.pg, SCHEMA))
        results = []
        try:
            for db in dbs:
                r = measure(db, args.events, args.repeats)
                results.append(r)
                print(f"{r['db']}: {r['rows']:,} rows ({r['events']:,} events) deleted in {r['delete_s']} s "
                      f"(the command's floor {r['floor_s']} s; "
                      + (f"{r['rows_per_s']:,} rows/s beyond it)" if r["rows_per_s"] else "within the floor's noise)"))
        finally:
            if args.pg:
                drop_schema(args.pg, SCHEMA)
    print(json.dumps({"load_average": load_average(), "results": results}))


if __name__ == "__main__":
    main()
