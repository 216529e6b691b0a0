"""Benchmark: ``modtrace diff`` of two runs of about 1 million events each, end to end.

    .venv/bin/python benchmarks/bench_diff.py [--events 1000000] [--repeats 3] [--db PATH]

Builds two runs in a SQLite database from synthetic rows (a model of
``--blocks`` blocks of 8 modules each, forward and backward, exact
timestamps; the candidate has one module 50% slower), written with the
recorder's ``RankWriter`` and analysed with ``modtrace.results.materialize``
as a recording would be.  Then times ``modtrace diff BASE CAND --format
json`` as a subprocess (interpreter start and imports included; wall and CPU
time, the CPU time from the child's rusage), the interpreter start with the
diff's imports alone, and, in this process, ``modtrace.open(db).diff`` (both
runs read, then compared).  Prints a JSON summary with medians
of ``--repeats`` interleaved runs and the load average before and after
(this machine is shared: compare CPU times when the load is high).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this tree's modtrace and benchmarks

from benchmarks._common import children_cpu_seconds, load_average, median, timed, timed_cpu  # noqa: E402

CHILDREN = ("ln1", "attn", "attn.qkv", "attn.proj", "ln2", "mlp", "mlp.fc", "mlp.out")


def modules(blocks: int) -> list[tuple[int, str, str, int | None]]:
    """(module_id, fqn, type, parent) of a root, ``blocks`` blocks of 8 modules, and a head."""
    out: list[tuple[int, str, str, int | None]] = [(0, "Model", "Model", None)]
    for b in range(blocks):
        block_id = len(out)
        out.append((block_id, f"Model.blocks.{b}", "Block", 0))
        ids: dict[str, int] = {}
        for child in CHILDREN:
            parent = ids.get(child.rsplit(".", 1)[0], block_id) if "." in child else block_id
            ids[child] = len(out)
            out.append((len(out), f"Model.blocks.{b}.{child}", child.split(".")[-1], parent))
    out.append((len(out), "Model.head", "Linear", 0))
    return out


def events(mods: list[tuple[int, str, str, int | None]], steps: int, seed: int, slow: int | None) -> list[tuple[Any, ...]]:
    """Enter/exit rows (``RankWriter`` order) for ``steps`` steps of forward then backward."""
    rng = random.Random(seed)
    children: dict[int | None, list[int]] = {}
    for mid, _, _, parent in mods:
        children.setdefault(parent, []).append(mid)
    cost = {mid: 50_000 + 10_000 * (mid % 7) for mid, *_ in mods}
    rows: list[tuple[Any, ...]] = []
    seq = 0
    ts = 0
    call = 0

    def walk(mid: int, phase: int, step: int, calls: dict[int, int]) -> None:
        nonlocal seq, ts, call
        if phase == 0:
            call += 1
            calls[mid] = call
        cid = calls[mid]
        task = None if phase == 0 else step
        rows.append((seq, ts, 0, mid, phase, cid, step, 0, 0, None, 0, task, 0))
        seq += 1
        own = cost[mid] * (1.5 if mid == slow else 1.0) * (1 + rng.uniform(-0.05, 0.05))
        ts += int(own)
        kids = children.get(mid, [])
        for kid in kids if phase == 0 else reversed(kids):
            walk(kid, phase, step, calls)
        rows.append((seq, ts, 1, mid, phase, cid, step, 0, 0, None, 0, task, 0))
        seq += 1

    for step in range(steps):
        calls: dict[int, int] = {}
        walk(0, 0, step, calls)
        walk(0, 1, step, calls)
    return rows


def build(db: str, n_events: int, blocks: int) -> dict[str, Any]:
    from modtrace.core.contracts import Batch
    from modtrace.results.materialize import materialize
    from modtrace.store.engine import open_store
    from modtrace.store.runs import add_rank, create_run, finish_rank
    from modtrace.store.writer import RankWriter

    mods = modules(blocks)
    steps = max(2, n_events // (4 * len(mods)))
    slow = next(mid for mid, fqn, *_ in mods if fqn == "Model.blocks.3.mlp.fc")
    store = open_store(db, create=True)
    info: dict[str, Any] = {"modules": len(mods), "steps": steps}
    try:
        for name, seed, slow_id in (("base", 1, None), ("cand", 2, slow)):
            t0 = time.perf_counter()
            run_id, _ = create_run(store, name, {"command": "bench_diff", "world_size": 1})
            add_rank(store, run_id, 0, time.time_ns())
            rows = events(mods, steps, seed, slow_id)
            writer = RankWriter(store, run_id, 0)
            writer.write(Batch([], [(m, f, t, p) for m, f, t, p in mods], [(0, 1, "MainThread")], [(0, "cpu")]))
            for start in range(0, len(rows), 100_000):
                writer.write(Batch(rows[start:start + 100_000], progress=(start, steps)))
            finish_rank(store, run_id, 0, "completed")
            materialize(store, run_id)
            info[f"{name}_events"] = len(rows)
            info[f"{name}_build_s"] = round(time.perf_counter() - t0, 2)
    finally:
        store.dispose()
    return info


def stages(db: str) -> dict[str, float]:
    """In-process time of one ``Database.diff`` (both runs read, then compared)."""
    import modtrace

    def compare() -> Any:
        with modtrace.open(db) as database:
            return database.diff("base", "cand")

    diff_s, diff_cpu_s, result = timed_cpu(compare)
    assert result.timing.height > 0
    return {"diff_s": diff_s, "diff_cpu_s": diff_cpu_s}


IMPORTS = (
    "import polars, sqlalchemy, modtrace.cli, modtrace.cli.diff, modtrace.analysis.diff, "
    "modtrace.store.samples, modtrace.store.engine, modtrace.store.runs, modtrace.renderers.diff, "
    "modtrace.renderers.diff_document"
)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--events", type=int, default=1_000_000, help="events per run (about)")
    p.add_argument("--blocks", type=int, default=24)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--db", default=None, help="reuse (or build) the runs in this database")
    args = p.parse_args()
    tmp = tempfile.TemporaryDirectory()
    db = args.db or str(Path(tmp.name) / "bench.db")
    built: dict[str, Any] = {}
    if not Path(db).exists():
        built = build(db, args.events, args.blocks)
    cmd = [sys.executable, "-m", "modtrace", "diff", "base", "cand", "--db", db, "--format", "json", "--fail-on", "never"]
    e2e: list[float] = []
    e2e_cpu: list[float] = []
    startup: list[float] = []
    stage_runs: list[dict[str, float]] = []
    doc: dict[str, Any] = {}
    load_before = load_average()
    for _ in range(args.repeats):
        c0 = children_cpu_seconds()
        seconds, proc = timed(lambda: subprocess.run(cmd, cwd=REPO, capture_output=True, text=True))
        e2e.append(seconds)
        e2e_cpu.append(children_cpu_seconds() - c0)
        if proc.returncode != 0:
            raise SystemExit(f"modtrace diff failed: {proc.stderr}")
        doc = json.loads(proc.stdout)
        startup.append(timed(lambda: subprocess.run([sys.executable, "-c", IMPORTS], cwd=REPO, check=True))[0])
        stage_runs.append(stages(db))
    summary = {
        "events_per_run": built.get("base_events"),
        "build": built,
        "repeats": args.repeats,
        "end_to_end_s_median": round(median(e2e), 3),
        "end_to_end_s": [round(t, 3) for t in e2e],
        "end_to_end_cpu_s_median": round(median(e2e_cpu), 3),
        "startup_and_imports_s_median": round(median(startup), 3),
        "api_diff_s_median": round(median(s["diff_s"] for s in stage_runs), 3),
        "api_diff_cpu_s_median": round(median(s["diff_cpu_s"] for s in stage_runs), 3),
        "regressions": [f"{r['fqn']}:{r['phase']}" for r in doc["timing"] if r["verdict"] == "regression"],
        "target_s": 3.0,
        "cpus": os.cpu_count(),
        "load_average": {"before": load_before, "after": load_average()},
    }
    summary["ok"] = summary["end_to_end_s_median"] <= 3.0
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
