"""``modtrace tree`` of an analysed run: from its stored tree vs from its spans, side by side.

The same database and run, each ``modtrace tree`` a fresh interpreter as a
user runs it; between the two kinds of call the run's stored tree
(``tree_nodes``) is set aside and put back, so the spans' path is what a run
analysed before the stored tree existed gets.  Repeats are interleaved and
the figures are medians: under load compare the ratio, not the times.  Both
outputs are checked equal.  The last line is a JSON summary.

    python benchmarks/bench_stored_tree.py --db DB [--db URL]... [--run bench] [--repeats 7] [--pause 1] [-- TREE OPTIONS]

Make a 1M-event analysed run of the analysis benchmarks' shape with
``python benchmarks/_common.py e2e.db --events 1000000``, then ``modtrace analyze bench --db e2e.db``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this tree's modtrace and benchmarks

from benchmarks._common import load_average, median, run_modtrace  # noqa: E402


def _engine(db: str) -> sa.Engine:
    return sa.create_engine(db if "://" in db else f"sqlite:///{db}", poolclass=NullPool)


def _tree(db: str, run: str, options: list[str]) -> tuple[float, str]:
    wall, done = run_modtrace(["tree", run, "--db", db, *options])
    return wall, done.stdout


def _set_aside(engine: sa.Engine, run_id: int) -> list[tuple[Any, ...]]:
    with engine.begin() as conn:
        rows = [tuple(r) for r in conn.exec_driver_sql(f"SELECT * FROM tree_nodes WHERE run_id = {run_id}")]
        conn.exec_driver_sql(f"DELETE FROM tree_nodes WHERE run_id = {run_id}")
    return rows


def _put_back(engine: sa.Engine, rows: list[tuple[Any, ...]]) -> None:
    mark = "?" if engine.dialect.paramstyle == "qmark" else "%s"
    with engine.begin() as conn:
        conn.exec_driver_sql(f"INSERT INTO tree_nodes VALUES ({', '.join(mark for _ in rows[0])})", rows)


def measure(db: str, run: str, repeats: int, options: list[str], pause: float) -> dict[str, Any]:
    engine = _engine(db)
    try:
        with engine.connect() as conn:
            run_id = conn.exec_driver_sql(f"SELECT id FROM runs WHERE name = '{run}'").scalar_one()
            nodes = conn.exec_driver_sql(f"SELECT count(*) FROM tree_nodes WHERE run_id = {run_id}").scalar()
            spans = conn.exec_driver_sql(f"SELECT count(*) FROM span_rows WHERE run_id = {run_id}").scalar()
        if not nodes:
            raise SystemExit(f"run {run!r} in {db} has no stored tree: run `modtrace analyze {run}` first")
        stored: list[float] = []
        from_spans: list[float] = []
        for _ in range(repeats):
            time.sleep(pause)  # the previous call's work on the server (a COPY of the spans) winds down
            wall, out_stored = _tree(db, run, options)
            stored.append(wall)
            kept = _set_aside(engine, int(run_id))
            try:
                time.sleep(pause)
                wall, out_spans = _tree(db, run, options)
            finally:
                _put_back(engine, kept)
            from_spans.append(wall)
            if out_stored != out_spans:
                raise SystemExit("the stored tree's output differs from the spans'")
    finally:
        engine.dispose()
    a, b = median(stored), median(from_spans)
    return {"dialect": engine.dialect.name, "spans": spans, "nodes": nodes, "stored_median_s": a,
            "spans_median_s": b, "speedup": b / a, "stored_runs_s": stored, "spans_runs_s": from_spans}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", action="append", required=True, help="a file or URL (repeatable)")
    parser.add_argument("--run", default="bench")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--pause", type=float, default=1.0, help="seconds between two calls")
    parser.add_argument("options", nargs="*", help="tree options (after --)")
    args = parser.parse_args()
    summary: dict[str, Any] = {"benchmark": "tree", "options": args.options, "load_average_start": load_average()}
    results = [measure(db, args.run, args.repeats, args.options, args.pause) for db in args.db]
    for r in results:
        print(f"{r['dialect']:<11} {r['spans']:>9,} spans -> {r['nodes']:,} nodes: tree from the stored tree "
              f"{r['stored_median_s']:.3f}s, from the spans {r['spans_median_s']:.3f}s ({r['speedup']:.1f}x)")
    summary["results"] = results
    summary["load_average_end"] = load_average()
    print(json.dumps(summary, separators=(",", ":")))


if __name__ == "__main__":
    main()
