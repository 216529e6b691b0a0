"""``Database.stragglers`` on PostgreSQL at 64 and 512 ranks: time and peak memory.

A synthetic analysed run per rank count is written straight into the storage tables by SQL
(``generate_series`` on the server: ``span_rows``, ``modules``, ``step_rows``, ``step_starts``,
``run_ranks``), shaped as the analysis stores one: per rank and step a root span and
``--modules`` child spans, each about 1 ms with up to 100 us of noise, and one rank 10 ms slower
in one module (the others' later modules shifted after it).  Then ``Database.stragglers`` runs
in a fresh interpreter per repeat; its wall time and peak RSS (``resource.getrusage``, the
interpreter and imports included) are reported beside the same interpreter's floor (opening the
database and listing one run), and the straggler it names is checked.  The last line is a JSON
summary.

    python benchmarks/bench_stragglers.py --pg URL [--ranks 64,512] [--steps 200] [--modules 100] [--repeats 3]

A scratch schema of that server is used and dropped afterwards.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this tree's modtrace and benchmarks

from benchmarks._common import drop_schema, fresh_schema, load_average, median  # noqa: E402

SCHEMA = "modtrace_bench_stragglers"
SLOW_RANK, SLOW_MODULE, SLOW_NS, CHILD_NS = 3, 7, 10_000_000, 1_000_000


def write_run(url: str, name: str, ranks: int, steps: int, modules: int) -> int:
    """The run ``name``: ``ranks`` x ``steps`` x (``modules`` + 1) spans, analysed; its id."""
    import sqlalchemy as sa

    from modtrace.store.engine import open_store
    from modtrace.store.runs import create_run

    store = open_store(url, create=True)
    try:
        run_id, _ = create_run(store, name, {"world_size": ranks})
        per_step = modules + 1
        step_ns = modules * 1_200_000 + SLOW_NS + 5_000_000  # the children, the slow one's delay, the rest
        p = {"run": run_id, "ranks": ranks, "steps": steps, "mods": modules, "per": per_step, "slow_rank": SLOW_RANK,
             "slow_mod": SLOW_MODULE, "slow_ns": SLOW_NS, "step_ns": step_ns, "child": CHILD_NS}
        # a child's self time and start on its rank: noise from its coordinates, the slow one's delay
        self_ns = ("(:child + ((r * 7919 + s * 104729 + m * 31) % 1000) * 100"
                   " + CASE WHEN r = :slow_rank AND m = :slow_mod THEN :slow_ns ELSE 0 END)")
        start = ("(s * CAST(:step_ns AS BIGINT) + (m - 1) * 1200000"
                 " + CASE WHEN r = :slow_rank AND m > :slow_mod THEN :slow_ns ELSE 0 END)")
        statements = [
            """INSERT INTO run_ranks (run_id, rank, hostname, pid, status, started_at, ended_at, wall_anchor_ns,
                   event_count, step_count, reconnects, dropped_events, fork_calls, analysis)
               SELECT :run, r, 'bench', 1, 'completed', '2026-01-01T00:00:00.000000Z', '2026-01-01T00:01:00.000000Z',
                   1700000000000000000, 2 * :steps * :per, :steps, 0, 0, 0, 'stored'
               FROM generate_series(0, :ranks - 1) r""",
            """INSERT INTO modules (run_id, rank, module_id, fqn, module_type, parent_module_id, compiled)
               SELECT :run, r, m, CASE WHEN m = 0 THEN 'Net' ELSE 'Net.layers.' || (m - 1) END,
                   CASE WHEN m = 0 THEN 'Net' ELSE 'Layer' END, CASE WHEN m = 0 THEN NULL ELSE 0 END, 0
               FROM generate_series(0, :ranks - 1) r, generate_series(0, :mods) m""",
            f"""INSERT INTO span_rows (run_id, rank, span_id, depth, module_id, phase, call_id, step, thread_id,
                   graph_task, start_ns, duration_ns, self_ns, device_id, stream, status, parent_gap, exit_gap)
               SELECT :run, r, CAST(s AS BIGINT) * :per * 2 + CASE WHEN m = 0 THEN 0 ELSE 2 * m - 1 END,
                   CASE WHEN m = 0 THEN 0 ELSE 1 END, m, 0, CAST(s AS BIGINT) * :per + m, s, 0, NULL,
                   CASE WHEN m = 0 THEN s * CAST(:step_ns AS BIGINT) ELSE {start} END,
                   CASE WHEN m = 0 THEN :mods * 1200000 + :slow_ns ELSE {self_ns} END,
                   CASE WHEN m = 0 THEN 1000 ELSE {self_ns} END,
                   NULL, NULL, 0,
                   CASE WHEN m = 0 THEN NULL ELSE 2 * m - 1 END,
                   CASE WHEN m = 0 THEN 2 * :per - 1 ELSE 1 END
               FROM generate_series(0, :ranks - 1) r, generate_series(0, :steps - 1) s, generate_series(0, :mods) m""",
            """INSERT INTO step_rows (run_id, rank, step, step_rule, start_ns, wall_ns, step_ns, forward_ns, backward_ns,
                   recompute_ns, spans, unclosed)
               SELECT :run, r, s, 'optimizer', s * CAST(:step_ns AS BIGINT), :step_ns, :mods * 1200000 + :slow_ns,
                   :mods * 1200000 + :slow_ns, 0, 0, :per, 0
               FROM generate_series(0, :ranks - 1) r, generate_series(0, :steps - 1) s""",
            """INSERT INTO step_starts (run_id, rank, thread_id, span_id, step, nth)
               SELECT :run, r, 0, CAST(s AS BIGINT) * :per * 2, s, s + 1
               FROM generate_series(0, :ranks - 1) r, generate_series(0, :steps - 1) s""",
            "UPDATE runs SET status = 'completed', analysis = 'stored', world_size = :ranks WHERE id = :run",
        ]
        with store.engine.begin() as conn:
            for sql in statements:
                conn.execute(sa.text(sql), {k: v for k, v in p.items() if f":{k}" in sql})
        with store.engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")
    finally:
        store.dispose()
    return run_id


_PROBE = """
import json, resource, sys, time
sys.path.insert(0, {repo!r})
t0 = time.perf_counter()
import modtrace
with modtrace.open({url!r}) as db:
    if {floor!r}:
        db.runs(limit=1)
        out = None
    else:
        found = db.stragglers({name!r}).to_dict()
        out = found["persistent"][:1]
print(json.dumps({{"s": time.perf_counter() - t0, "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "persistent": out}}))
"""


def probe(url: str, name: str, floor: bool) -> dict[str, Any]:
    code = _PROBE.format(repo=str(Path(__file__).resolve().parent.parent), url=url, name=name, floor=floor)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pg", required=True, help="a PostgreSQL URL (a scratch schema is made and dropped)")
    ap.add_argument("--ranks", default="64,512")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--modules", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    url = fresh_schema(args.pg, SCHEMA)
    results = []
    try:
        for ranks in (int(r) for r in args.ranks.split(",")):
            name = f"bench{ranks}"
            t0 = time.perf_counter()
            write_run(url, name, ranks, args.steps, args.modules)
            written = time.perf_counter() - t0
            runs = [probe(url, name, False) for _ in range(args.repeats)]
            floors = [probe(url, name, True) for _ in range(args.repeats)]
            named = runs[0]["persistent"]
            ok = bool(named) and named[0]["rank"] == SLOW_RANK and named[0]["fqn"] == f"Net.layers.{SLOW_MODULE - 1}"
            row = {"ranks": ranks, "steps": args.steps, "modules": args.modules,
                   "spans": ranks * args.steps * (args.modules + 1), "write_s": round(written, 1),
                   "stragglers_s": round(median(r["s"] for r in runs), 2),
                   "floor_s": round(median(r["s"] for r in floors), 2),
                   "peak_rss_mib": round(max(r["maxrss_kib"] for r in runs) / 1024),
                   "floor_rss_mib": round(max(r["maxrss_kib"] for r in floors) / 1024),
                   "straggler_found": ok}
            print(row, flush=True)
            results.append(row)
    finally:
        drop_schema(args.pg, SCHEMA)
    print(json.dumps({"load_average": load_average(), "results": results}))


if __name__ == "__main__":
    main()
