"""Benchmark: analysing a large run read from PostgreSQL, streamed versus in one piece.

Loads a synthetic run of ``--events`` events (default 10 million) into its
own schema on a PostgreSQL server with COPY (rows of the analysis benchmarks'
shape, ``_common.analysis_events``: a ~600-module model, forward and tied
backward every step, roots closed at the end of backward), then analyses it
(``modtrace analyze``: read the events, rebuild spans and nesting issues,
store them) in a fresh child process per mode and repeat, measuring wall
time and the child's peak RSS (its ``ru_maxrss``):

- ``stream``: ``modtrace.results.materialize.materialize`` in rounds of ``chunk`` events (events
  read through a server-side cursor in chunks of ``--chunk-rows``, open
  calls carried from chunk to chunk, spans written chunk by chunk);
- ``whole``: ``modtrace.results.materialize.materialize`` forced onto the
  one-piece path (the whole run as one frame).

Modes are interleaved per repeat.  The loaded run is kept (``--keep``) and
reused by a later invocation with the same ``--events`` and ``--schema``.
Prints one JSON summary.

    python benchmarks/bench_stream_pg.py [--url postgresql+psycopg://postgres@127.0.0.1:5432/test]
        [--events 10000000] [--chunk-rows 200000] [--repeats 1] [--modes stream,whole] [--keep]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this tree's modtrace and benchmarks

from benchmarks._common import (  # noqa: E402
    analysis_modules,
    drop_schema,
    fresh_schema,
    median,
    schema_url,
    step_template,
)

DEFAULT_URL = os.environ.get("MODTRACE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
RUN_NAME = "bench-stream"


def existing_run(url: str, schema: str, n_events: int) -> int | None:
    """The id of a complete loaded run of this size in ``schema``, else None."""
    import sqlalchemy as sa

    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            if not conn.exec_driver_sql(
                "SELECT 1 FROM information_schema.tables WHERE table_schema = %s AND table_name = 'runs'", (schema,)
            ).first():
                return None
            row = conn.exec_driver_sql(
                f'SELECT r.id, rr.event_count FROM "{schema}".runs r JOIN "{schema}".run_ranks rr ON rr.run_id = r.id '
                "WHERE r.name = %s AND r.status = 'completed'", (RUN_NAME,)
            ).first()
    finally:
        engine.dispose()
    if row is None or int(row[1]) != loaded_size(n_events):
        return None
    return int(row[0])


def loaded_size(n_events: int) -> int:
    """Events ``load`` writes for ``n_events``: whole steps only."""
    _, tree = analysis_modules()
    per_step = len(step_template(dict(tree)))
    return max(1, n_events // per_step) * per_step


def load(url: str, schema: str, n_events: int, chunk_steps: int = 200) -> tuple[int, int, float]:
    """(run id, events loaded, seconds): a fresh schema holding one completed run."""
    from modtrace.store.engine import open_store
    from modtrace.store.runs import add_rank, create_run, finish_rank

    store = open_store(fresh_schema(url, schema), create=True)
    t0 = time.perf_counter()
    mods, tree = analysis_modules()
    template = np.array(step_template(dict(tree)), dtype=np.int64)
    per_step = len(template)
    steps = max(1, n_events // per_step)
    run_id, _ = create_run(store, RUN_NAME, {"world_size": 1, "command": "bench_stream_pg.py"})
    add_rank(store, run_id, 0, time.time_ns())
    n_modules = mods.height
    rng = np.random.default_rng(0)
    raw = store.engine.raw_connection()
    try:
        cur = raw.driver_connection.cursor()  # type: ignore[union-attr]
        with cur.copy("COPY modules (run_id, rank, module_id, fqn, module_type, parent_module_id) FROM STDIN") as cp:
            for _, mid, fqn, kind, parent in mods.iter_rows():
                cp.write_row((run_id, 0, mid, fqn, kind, parent))
        cur.execute("INSERT INTO devices (run_id, rank, device_id, name) VALUES (%s, 0, 0, 'cpu')", (run_id,))
        cur.execute("INSERT INTO threads (run_id, rank, thread_id, ident, name) VALUES (%s, 0, 0, 1, 'MainThread')",
                    (run_id,))
        raw.commit()
        ts0 = 0
        for first in range(0, steps, chunk_steps):
            k = min(chunk_steps, steps - first)
            tiled = np.tile(template, (k, 1))
            step = np.repeat(np.arange(first, first + k, dtype=np.int64), per_step)
            n = len(step)
            seq = np.arange(first * per_step, first * per_step + n, dtype=np.int64)
            ts = ts0 + np.cumsum(rng.integers(1, 2000, n, dtype=np.int64))
            ts0 = int(ts[-1])
            call = step * n_modules + tiled[:, 1]
            phase = tiled[:, 2]
            gt = np.where(phase == 1, step + 1, -1)
            buf = io.StringIO()
            cols = np.column_stack([seq, ts, tiled[:, 0], tiled[:, 1], phase, call, step, tiled[:, 4], gt, tiled[:, 3]])
            for s, t, kd, m, ph, c, st, stat, g, tie in cols.tolist():
                buf.write(f"{run_id}\t0\t{s}\t{t}\t{kd}\t{m}\t{ph}\t{c}\t{st}\t0\t0\t\\N\t{stat}\t"
                          f"{g if g >= 0 else chr(92) + 'N'}\t{tie}\n")
            with cur.copy("COPY events (run_id, rank, seq, ts_ns, kind, module_id, phase, call_id, step, thread_id, "
                          "device_id, stream, status, graph_task, tie) FROM STDIN") as cp:
                cp.write(buf.getvalue())
            cur.execute("UPDATE run_ranks SET event_count = %s, step_count = %s WHERE run_id = %s AND rank = 0",
                        (first * per_step + n, first + k, run_id))
            raw.commit()
            print(f"loaded {first * per_step + n:,} / {steps * per_step:,}", file=sys.stderr, flush=True)
        cur.execute("ANALYZE events")
        raw.commit()
    finally:
        raw.close()
    finish_rank(store, run_id, 0, "completed")
    store.dispose()
    return run_id, steps * per_step, time.perf_counter() - t0


CHILD = r"""
import json, sys, time
from modtrace.store.engine import open_store
import modtrace.results.materialize as stream
url, run_id, mode, chunk = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
store = open_store(url)
t0 = time.perf_counter()
if mode == "stream":
    found = stream.materialize(store, run_id, round_rows=chunk, chunk_rows=chunk).issues
    from modtrace.store.analysis_store import count_span_rows
    spans = count_span_rows(store, run_id)
    issues = found.height
else:
    from modtrace.results.materialize import materialize
    result = materialize(store, run_id, round_rows=1 << 62)  # the whole rank as one round
    spans, issues = result.spans.height, result.issues.height
elapsed = time.perf_counter() - t0
with store.engine.connect() as conn:
    stored = conn.exec_driver_sql(f"SELECT count(*) FROM span_rows WHERE run_id = {run_id}").scalar()
store.dispose()
import resource
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
print(json.dumps({"seconds": elapsed, "spans": spans, "issues": issues, "stored_spans": stored, "peak_kib": peak}))
"""


def measure(url: str, run_id: int, mode: str, chunk_rows: int) -> dict[str, Any]:
    """Run one analysis in a fresh child process; its wall time, result and peak RSS (its own ru_maxrss)."""
    proc = subprocess.run([sys.executable, "-c", CHILD, url, str(run_id), mode, str(chunk_rows)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} analysis failed:\n{proc.stderr}")
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    out["peak_rss_mib"] = round(out.pop("peak_kib") / 1024, 1)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=DEFAULT_URL)
    p.add_argument("--schema", default="modtrace_bench_stream")
    p.add_argument("--events", type=int, default=10_000_000)
    p.add_argument("--chunk-rows", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--modes", default="stream,whole")
    p.add_argument("--keep", action="store_true", help="keep the loaded schema for later invocations")
    p.add_argument("--load-only", action="store_true")
    args = p.parse_args()

    url = schema_url(args.url, args.schema)
    run_id = existing_run(args.url, args.schema, args.events)
    load_s = None
    if run_id is None:
        run_id, loaded, load_s = load(args.url, args.schema, args.events)
    if args.load_only:
        print(json.dumps({"run_id": run_id, "load_seconds": load_s}))
        return
    modes = [m for m in args.modes.split(",") if m]
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for _ in range(args.repeats):
        for mode in modes:
            results[mode].append(measure(url, run_id, mode, args.chunk_rows))
    summary: dict[str, Any] = {
        "events": args.events, "chunk_rows": args.chunk_rows, "load_seconds": load_s, "repeats": args.repeats,
        "modes": {},
    }
    for mode, rs in results.items():
        summary["modes"][mode] = {
            "median_seconds": round(median(r["seconds"] for r in rs), 2),
            "peak_rss_mib": max(r["peak_rss_mib"] for r in rs),
            "spans": rs[0]["spans"], "issues": rs[0]["issues"], "stored_spans": rs[0]["stored_spans"],
        }
    print(json.dumps(summary, indent=2))
    if not args.keep:
        drop_schema(args.url, args.schema)


if __name__ == "__main__":
    main()
