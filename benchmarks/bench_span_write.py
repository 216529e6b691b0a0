#!/usr/bin/env python
"""Benchmark: replacing a run's stored analysis (``modtrace analyze`` of an analysed run),
this tree's code against another tree's (e.g. a worktree of main), side by side.

Each tree runs in a child process of its own that keeps its store open: a recording of
``--events`` events (the analysis benchmarks' shape, ``_common.write_recording``: 1M events, 499,660 spans) written
by the recorder's writer into a SQLite file and, with ``--pg``, a scratch schema of that
PostgreSQL server, created by that tree's code at its own schema revision, and analysed
once.  Then, in rounds, each child in turn times on each backend:

- ``write``: ``write_analysis`` of the run's spans and issues, computed once beforehand,
  over the stored ones (delete + insert + commit; per span written);
- ``analyze``: ``materialize``, the whole re-analysis as ``modtrace analyze`` does it
  (read, analyse, write in rounds, store the tree).

Before each timed operation on PostgreSQL the span table is vacuumed and a CHECKPOINT
is taken (``--no-checkpoint``: not), as when a run is re-analysed a while after its
first analysis (each page's first change after a checkpoint is logged whole).  Medians
over rounds, ratios this/other, the load average around the rounds; one JSON summary.

    python benchmarks/bench_span_write.py --other-tree ../main [--pg URL] [--events 1000000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this tree's benchmarks (a child takes it off again before modtrace)

from benchmarks._common import (  # noqa: E402
    drop_schema,
    fresh_schema,
    load_average,
    median,
    timed,
    write_recording,
)

SCHEMA = "modtrace_bench_span_write"


def _child(label: str, sqlite_path: str, pg_url: str | None, events: int, checkpoint: bool) -> None:
    """Serve timings on stdin's commands ('write' | 'analyze' | 'quit'), one JSON line each."""
    # modtrace from the tree this child times (its PYTHONPATH), not from this script's tree
    sys.path.remove(str(HERE.parent))
    from modtrace.results.materialize import compute, materialize
    from modtrace.store.analysis_store import count_span_rows, write_analysis
    from modtrace.store.engine import open_store, read_revision

    targets = {"sqlite": sqlite_path}
    if pg_url:
        targets["postgresql"] = fresh_schema(pg_url, f"{SCHEMA}_{label}")
    stores, runs, analyses = {}, {}, {}
    for dialect, url in targets.items():
        runs[dialect] = write_recording(url, events)
        stores[dialect] = store = open_store(url)
        materialize(store, runs[dialect])
        analyses[dialect] = compute(store, runs[dialect])
    info = {d: {"revision": read_revision(s.engine)[0], "spans": count_span_rows(s, runs[d])} for d, s in stores.items()}
    print(json.dumps(info), flush=True)

    def prepare(dialect: str) -> None:
        if dialect != "postgresql":
            return
        with stores[dialect].engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM span_rows")  # the dead rows of the last replacement, if any
            if checkpoint:
                conn.exec_driver_sql("CHECKPOINT")

    for line in sys.stdin:
        command = line.strip()
        if command == "quit":
            break
        out = {}
        for dialect, store in stores.items():
            prepare(dialect)
            run_id, result = runs[dialect], analyses[dialect]
            if command == "write":
                out[dialect] = timed(partial(write_analysis, store, run_id, result.spans, result.issues))[0]
            else:
                out[dialect] = timed(partial(materialize, store, run_id))[0]
            assert count_span_rows(store, runs[dialect]) == analyses[dialect].spans.height
        print(json.dumps(out), flush=True)
    for store in stores.values():
        store.dispose()
    if pg_url:
        drop_schema(pg_url, f"{SCHEMA}_{label}")


def _start(label: str, tree: Path, tmp: str, args: argparse.Namespace) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", label, "--sqlite", os.path.join(tmp, f"{label}.db"),
           "--events", str(args.events)]
    if args.pg:
        cmd += ["--pg", args.pg]
    if not args.checkpoint:
        cmd.append("--no-checkpoint")
    return subprocess.Popen(cmd, cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def _ask(child: subprocess.Popen[str], command: str) -> dict[str, Any]:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(command + "\n")
    child.stdin.flush()
    line = child.stdout.readline()
    if not line:
        raise SystemExit(f"a child failed on {command!r} (exit {child.wait()})")
    return json.loads(line)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--other-tree", type=Path, help="the tree to compare with (a checkout of another commit)")
    parser.add_argument("--pg", default=None, help="also on this PostgreSQL URL (scratch schemas, dropped after)")
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--operations", default="write,analyze")
    parser.add_argument("--no-checkpoint", dest="checkpoint", action="store_false")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--sqlite", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        _child(args.child, args.sqlite, args.pg, args.events, args.checkpoint)
        return
    if args.other_tree is None:
        parser.error("--other-tree is required")
    trees = {"this": HERE.parent, "other": args.other_tree.resolve()}
    operations = [o for o in args.operations.split(",") if o]
    with tempfile.TemporaryDirectory() as tmp:
        children = {label: _start(label, tree, tmp, args) for label, tree in trees.items()}
        setup = {}
        for label, child in children.items():
            assert child.stdout is not None
            setup[label] = json.loads(child.stdout.readline())
        times: dict[str, dict[str, dict[str, list[float]]]] = {label: {} for label in trees}
        loads = [load_average()[0]]
        for _ in range(args.repeats):
            for op in operations:
                for label, child in children.items():
                    for dialect, seconds in _ask(child, op).items():
                        times[label].setdefault(op, {}).setdefault(dialect, []).append(seconds)
            loads.append(load_average()[0])
        for child in children.values():
            assert child.stdin is not None
            child.stdin.write("quit\n")
            child.stdin.close()
            child.wait()
    summary: dict[str, Any] = {"benchmark": "span_write", "events": args.events, "checkpoint": args.checkpoint,
                               "setup": setup, "load_average_1min": loads, "cpus": os.cpu_count()}
    for op in operations:
        for dialect in times["this"][op]:
            spans = setup["this"][dialect]["spans"]
            med = {label: median(times[label][op][dialect]) for label in trees}
            summary[f"{op}_{dialect}"] = {
                **{f"{label}_median_s": round(med[label], 3) for label in trees},
                **{f"{label}_us_per_span": round(med[label] / spans * 1e6, 2) for label in trees},
                "this_vs_other": round(med["this"] / med["other"], 3),
                "runs_s": {label: [round(t, 3) for t in times[label][op][dialect]] for label in trees},
            }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
