"""The shipped step queries of an analysed run, in this tree and in another one, side by side.

Writes, in each tree's own database (a SQLite file and, with ``--pg``, a scratch
PostgreSQL schema, each created by that tree's modtrace at its own schema
revision), two completed training runs of the analysis benchmarks' shape
(``bench`` and ``bench2``: a ~600-module model, forward and backward every
step, optimizer steps), analyses both with that tree's ``modtrace analyze``,
and then times ``modtrace query step_breakdown``, ``slowest_steps`` and
``call_counts`` of ``bench`` (each a fresh interpreter, as a user runs it:
``cli``) and the query's SQL alone (the tree's ``queries/NAME.sql`` run on a
connection held open, rows fetched: ``sql``), every tree, database and query
taking turns in each repeat; the figures are medians.  On PostgreSQL the
database's statistics are refreshed (ANALYZE) before timing, in every tree.  The outputs of the trees are compared: the same rows, ``step_rule``
aside (a column the older queries lack).  The last line is a JSON summary.

    python benchmarks/bench_steps.py [--spans 90000] [--repeats 5] [--pg URL] [--other LABEL=PATH]...

``--other``: a checkout of another commit (``git worktree add /tmp/old COMMIT``), whose
modtrace runs its own commands on its own databases, shown as LABEL.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this tree's modtrace and benchmarks

from benchmarks._common import (  # noqa: E402
    REPO,
    drop_schema,
    fresh_schema,
    interleave,
    load_average,
    median,
    run_modtrace,
)

QUERIES = ("step_breakdown", "slowest_steps", "call_counts")
RUNS = ("bench", "bench2")

# Run in a child with the tree's modtrace first on the path: the recording as that tree's writer stores it.
WRITE = """
import sys
sys.path[:0] = [sys.argv[1], sys.argv[2]]
from benchmarks._common import write_recording
for name in sys.argv[5:]:
    write_recording(sys.argv[3], int(sys.argv[4]), name=name)
"""


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree)}


def prepare(tree: Path, db: str, events: int) -> None:
    """The two runs written and analysed by ``tree``'s modtrace into ``db``."""
    subprocess.run([sys.executable, "-c", WRITE, str(tree), str(REPO), db, str(events), *RUNS], check=True,
                   cwd=tree, env=_env(tree))
    for run in RUNS:
        run_modtrace(["analyze", run, "--db", db], cwd=tree, env=_env(tree))
    if "://" in db:  # every tree planned from statistics (a tree that does not refresh them would not be)
        import sqlalchemy as sa

        engine = sa.create_engine(db)
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")
        engine.dispose()


def query(tree: Path, db: str, name: str) -> tuple[float, str]:
    wall, done = run_modtrace(["query", name, "--run", "bench", "--db", db, "--format", "csv"], cwd=tree,
                              env=_env(tree))
    return wall, done.stdout


def sql_query(engine: Any, tree: Path, name: str) -> int:
    """The tree's query ``name`` run on ``engine`` for run ``bench``: its rows fetched, counted."""
    import sqlalchemy as sa

    text = (tree / "queries" / f"{name}.sql").read_text()
    sql = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))  # the header names parameters
    with engine.connect() as conn:
        run_id = conn.execute(sa.text("SELECT id FROM runs WHERE name = 'bench'")).scalar_one()
        params = {k: v for k, v in {"run_id": run_id, "limit": 10}.items() if f":{k}" in sql}
        return len(conn.execute(sa.text(sql), params).all())


def _rows(out: str) -> list[dict[str, str]]:
    """The CSV's rows without step_rule, numbers rounded (float formatting may differ)."""
    rows = []
    for row in csv.DictReader(io.StringIO(out)):
        row.pop("step_rule", None)
        rows.append({k: (f"{float(v):.6g}" if v.replace(".", "", 1).replace("-", "", 1).isdigit() else v)
                     for k, v in row.items()})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spans", type=int, default=90_000, help="spans of each run (two events per span)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pg", default=None, help="also on this PostgreSQL URL (scratch schemas)")
    parser.add_argument("--other", action="append", default=[], metavar="LABEL=PATH",
                        help="a checkout of another commit to compare with (repeatable)")
    args = parser.parse_args()
    trees = {"this": REPO, **{o.split("=", 1)[0]: Path(o.split("=", 1)[1]).resolve() for o in args.other}}
    summary: dict[str, Any] = {"benchmark": "steps", "spans_per_run": args.spans, "runs": len(RUNS),
                               "repeats": args.repeats, "load_average_before": load_average()}
    schemas: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        dbs: dict[str, str] = {}
        for label in trees:
            dbs[f"{label}:sqlite"] = os.path.join(tmp, f"{label}.db")
            if args.pg:
                schemas.append(f"modtrace_bench_steps_{label}")
                dbs[f"{label}:postgresql"] = fresh_schema(args.pg, schemas[-1])
        for key, db in dbs.items():
            prepare(trees[key.split(":")[0]], db, 2 * args.spans)
        import sqlalchemy as sa

        engines = {key: sa.create_engine(db if "://" in db else f"sqlite:///{db}") for key, db in dbs.items()}
        outputs: dict[str, str] = {}
        candidates: dict[str, Any] = {}
        for key, db in dbs.items():
            for q in QUERIES:
                candidates[f"{key}:{q}"] = partial(query, trees[key.split(":")[0]], db, q)
                candidates[f"sql:{key}:{q}"] = partial(sql_query, engines[key], trees[key.split(":")[0]], q)

        def keep(name: str, result: Any) -> None:
            if isinstance(result, tuple):
                outputs[name] = result[1]

        samples = interleave(candidates, args.repeats, after=keep).wall
        summary["load_average_after"] = load_average()
        for engine in engines.values():
            engine.dispose()
        for schema in schemas:
            drop_schema(args.pg, schema)
    summary["median_ms"] = {name: round(median(v) * 1000, 1) for name, v in samples.items()}
    summary["runs_ms"] = {name: [round(x * 1000, 1) for x in v] for name, v in samples.items()}
    summary["same_rows_as_this"] = {
        f"{label}:{dialect}:{q}": _rows(outputs[f"this:{dialect}:{q}"]) == _rows(outputs[f"{label}:{dialect}:{q}"])
        for label in trees if label != "this"
        for dialect in ("sqlite", "postgresql") for q in QUERIES if f"this:{dialect}:{q}" in outputs
    }
    print(f"{args.spans:,} spans per run, {len(RUNS)} runs per database; medians of {args.repeats} interleaved repeats, ms")
    dialects = [d for d in ("sqlite", "postgresql") if f"this:{d}:{QUERIES[0]}" in samples]
    print(f"  {'query':<20}" + "".join(f"{f'{label}:{d}':>20}" for d in dialects for label in trees))
    for kind, prefix in (("cli", ""), ("sql", "sql:")):
        for q in QUERIES:
            print(f"  {f'{q} ({kind})':<20}" + "".join(f"{summary['median_ms'][f'{prefix}{label}:{d}:{q}']:>20.1f}"
                                                      for d in dialects for label in trees))
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
