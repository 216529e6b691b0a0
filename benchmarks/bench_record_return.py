"""Benchmark: how long ``modtrace record`` keeps its user waiting after the program's end.

A training script (``blocks`` x (Linear(4,4) + ReLU), forward + backward + SGD step, one CPU
thread) writes ``time.time()`` to a file as its last line; the command's return is taken when
its process exits.  The difference is what the user waits for: the last batches written and
the rank's analysis stored.  Checkouts side by side (``--base DIR``: another work tree, e.g.
``git worktree add /tmp/wt_base <commit>``), interleaved, medians.  Each recording is also
checked: its run analysed (``runs.analysis = 'stored'``) and its event count.  Under
``MODTRACE_FOLLOW_TIMES=1`` each line also shows what the end of the follow took
(``results.incremental``: the tail, the step basis, steps, counters and memory, the tree).

    python benchmarks/bench_record_return.py [--events 1000000,10000000] [--repeats 3]
        [--base /tmp/wt_base] [--db URL] [--blocks 200] [--ranks 2]

With ``--db`` and ``--base`` both checkouts write one database: it must be at a schema
revision both accept (else time each in a database of its own).

``--cost``: what the follow costs the program instead: seconds per recorded step of the
200-block stack (``bench_recorder.py``'s) and of a small GPT-2, with the writer process
following the run (at its default niceness, and at the writer's priority) and without it
(``MODTRACE_FOLLOW=0``), interleaved repeats in one process, medians.

    python benchmarks/bench_record_return.py --cost [--repeats 7] [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import load_average, median  # noqa: E402

SCRIPT = """\
import sys, time, torch
from torch import nn
torch.set_num_threads(1)
torch.manual_seed(0)
blocks, steps, stamp = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
model = nn.Sequential(*[m for _ in range(blocks) for m in (nn.Linear(4, 4), nn.ReLU())])
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(2, 4)
for _ in range(steps):
    model(x).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
open(stamp, "w").write(repr(time.time()))
"""


def events_per_step(blocks: int) -> int:
    """Forward and backward of the Sequential and each of its 2 * blocks modules, two events each."""
    return 4 * (1 + 2 * blocks)


def record_once(tree: Path, db: str, run: str, blocks: int, steps: int, tmp: Path, ranks: int = 1) -> dict[str, Any]:
    """``ranks`` processes recording one run (RANK, WORLD_SIZE): the wait from the last rank's
    last line to the last command's return."""
    script = tmp / "train.py"
    script.write_text(SCRIPT)
    t0 = time.time()
    procs = []
    for rank in range(ranks):
        env = dict(os.environ, PYTHONPATH=str(tree), RANK=str(rank), WORLD_SIZE=str(ranks))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "modtrace", "record", "--db", db, "--run", run, "--quiet",
             str(script), str(blocks), str(steps), str(tmp / f"{run}.{rank}.stamp")],
            cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    returned, follow = [], []
    for proc in procs:
        _, err = proc.communicate()
        returned.append(time.time())  # in turn: a rank found done later is counted late, never early
        if proc.returncode != 0:
            raise SystemExit(f"record failed ({proc.returncode}): {err[-2000:]}")
        follow += [line for line in err.splitlines() if line.startswith("modtrace: follow:")]
    last_line = max(float((tmp / f"{run}.{rank}.stamp").read_text()) for rank in range(ranks))
    return {"wait_s": max(returned) - last_line, "total_s": max(returned) - t0, "follow": " | ".join(follow)}


def check_run(db: str, run: str) -> tuple[int, str]:
    import sqlalchemy as sa

    url = db if "://" in db else f"sqlite:///{db}"
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        row = conn.exec_driver_sql(
            "SELECT r.analysis, (SELECT sum(event_count) FROM run_ranks k WHERE k.run_id = r.id) "
            f"FROM runs r WHERE r.name = '{run}'").first()
    engine.dispose()
    assert row is not None
    return int(row[1] or 0), str(row[0])


# -------------------------------------------------------------- cost to the program

# name -> environment of the writer process.  Rounds of 5,000 events (a quarter of the
# default), so that GPT-2's timed steps see several: more rounds, more of their fixed cost.
COST_CANDIDATES = {
    "no_follow": {"MODTRACE_FOLLOW": "0"},
    "follow": {"MODTRACE_FOLLOW": "1", "MODTRACE_FOLLOW_ROWS": "5000"},  # at its default niceness
    "follow_nice0": {"MODTRACE_FOLLOW": "1", "MODTRACE_ANALYSIS_NICE": "0", "MODTRACE_FOLLOW_ROWS": "5000"},
}
_COST_ENV = ("MODTRACE_FOLLOW", "MODTRACE_ANALYSIS_NICE", "MODTRACE_FOLLOW_ROWS")


def cost_models() -> dict[str, Any]:
    """(model, one training step) of the 200-block stack (bench_recorder.py's) and a small GPT-2."""
    import torch
    import transformers

    from benchmarks._common import linear_relu_stack

    torch.manual_seed(0)
    stack = linear_relu_stack(200)
    x = torch.randn(4, 16)

    def stack_step() -> None:
        stack(x).sum().backward()
        stack.zero_grad(set_to_none=True)

    cfg = transformers.GPT2Config(vocab_size=256, n_positions=32, n_embd=64, n_layer=4, n_head=4)
    gpt2 = transformers.GPT2LMHeadModel(cfg)
    opt = torch.optim.SGD(gpt2.parameters(), lr=1e-3)
    ids = torch.randint(0, 256, (4, 32))

    def gpt2_step() -> None:
        gpt2(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return {"linear_relu_200": stack_step, "gpt2": gpt2_step}


def cost(repeats: int, steps: int, tmp: Path) -> dict[str, Any]:
    """Seconds per recorded step with the writer process following the run (niced, and at the
    writer's priority) and without: interleaved repeats, each the median of its steps."""
    import random

    import torch

    import modtrace

    torch.set_num_threads(1)
    models = cost_models()
    out: dict[str, Any] = {}
    for model, step in models.items():
        per: dict[str, list[float]] = {c: [] for c in COST_CANDIDATES}
        for rep in range(repeats):
            order = list(COST_CANDIDATES)
            random.Random(rep).shuffle(order)
            for name in order:
                saved = {k: os.environ.get(k) for k in _COST_ENV}
                os.environ.update(COST_CANDIDATES[name])
                try:
                    rec = modtrace.Recorder(db=str(tmp / "cost.db"), run=f"{model}-{name}-{rep}", writer="process")
                    rec.__enter__()
                finally:
                    for k, v in saved.items():
                        if v is None:
                            os.environ.pop(k, None)
                        else:
                            os.environ[k] = v
                for _ in range(3):
                    step()
                rec.flush()
                times = []
                for _ in range(steps):
                    t0 = time.perf_counter()
                    step()
                    times.append(time.perf_counter() - t0)
                events = rec.events_recorded
                rec.__exit__(None, None, None)
                rec.wait_analyzed()
                per[name].append(median(times))
        meds = {k: median(v) for k, v in per.items()}
        out[model] = {
            "step_ms_median": {k: round(v * 1e3, 3) for k, v in meds.items()},
            "vs_no_follow": {k: round(v / meds["no_follow"], 3) for k, v in meds.items() if k != "no_follow"},
            "paired_diff_ms_median": {k: round(median([a - b for a, b in zip(per[k], per["no_follow"], strict=True)]) * 1e3, 3)
                                      for k in per if k != "no_follow"},
            "events_per_repeat": events,
        }
        print(f"{model}: {json.dumps(out[model])}", file=sys.stderr, flush=True)
    out["load_average"] = load_average()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", default="1000000", help="comma-separated sizes")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=200)
    ap.add_argument("--ranks", type=int, default=1, help="processes recording one run, each --events")
    ap.add_argument("--base", help="another work tree to time beside this one")
    ap.add_argument("--db", help="a database URL (default: a temp SQLite file per size)")
    ap.add_argument("--cost", action="store_true", help="instead: recorded steps with and without the follow")
    ap.add_argument("--steps", type=int, default=60, help="--cost: timed steps per repeat")
    args = ap.parse_args()
    if args.cost:
        with tempfile.TemporaryDirectory() as d:
            print(json.dumps(cost(args.repeats, args.steps, Path(d)), indent=2))
        return
    here = Path(__file__).resolve().parent.parent
    trees = {"now": here} if not args.base else {"base": Path(args.base).resolve(), "now": here}
    out: dict[str, Any] = {"load_average_before": load_average(), "sizes": {}}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for n in (int(s) for s in args.events.split(",")):
            steps = max(1, n // events_per_step(args.blocks))
            waits: dict[str, list[float]] = {k: [] for k in trees}
            totals: dict[str, list[float]] = {k: [] for k in trees}
            checks: dict[str, Any] = {}
            for rep in range(args.repeats):
                order = list(trees) if rep % 2 == 0 else list(reversed(trees))
                for name in order:
                    db = args.db or str(tmp / f"{name}-{n}.db")
                    run = f"{name}-{n}-{rep}"
                    got = record_once(trees[name], db, run, args.blocks, steps, tmp, args.ranks)
                    waits[name].append(got["wait_s"])
                    totals[name].append(got["total_s"])
                    checks[name] = check_run(db, run)
                    print(f"{n:,} events {name} rep {rep}: waited {got['wait_s']:.3f} s after the last line "
                          f"(recording {got['total_s']:.1f} s; {checks[name][0]:,} events, analysis "
                          f"{checks[name][1]}) {got['follow'] or ''}", file=sys.stderr, flush=True)
            out["sizes"][n] = {
                "steps": steps,
                "events": {k: v[0] for k, v in checks.items()},
                "analysis": {k: v[1] for k, v in checks.items()},
                "wait_s_median": {k: round(median(v), 3) for k, v in waits.items()},
                "wait_s": {k: [round(x, 3) for x in v] for k, v in waits.items()},
                "record_total_s_median": {k: round(median(v), 1) for k, v in totals.items()},
            }
    out["load_average_after"] = load_average()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
