"""Power and false alarms of ``modtrace diff`` as a CI regression gate, on real recordings.

    .venv/bin/python benchmarks/gate_power.py [--pairs 30] [--steps 20] [--history 5] [--loads 0,1,2] [--speed-probe]

A small model (``--blocks`` blocks, each a Linear applied ``REPS`` times, so a
block's cost is set in steps of 10%) is recorded in this process by
``modtrace.Recorder``, with ``--loads`` background processes that do nothing
but spin (0, one, two busy processes) started for each load in turn.  Per
load, ``--pairs`` times:

- a baseline run (tagged ``branch=main``: the newest ``--history`` of them
  are the history gate's window, as a CI's main branch would keep them;
  ``--history`` - 1 older ones are recorded first);
- an A/A candidate (the same code) and the A/B candidates: block 1 1.5x,
  2x and 3x slower, and every block 1.3x slower.

Each candidate is judged twice: the single-base diff against that pair's
baseline run, and the history gate against the newest ``--history``
baseline runs.  A/A: any failure of ``--fail-on
regression`` is a false alarm.  Block 1 slower: detected when block 1 is
blamed (a regression).  Everything slower: detected when the gate fails
(a step regression, or any module's).  The "work counters" row says whether
``--fail-on counters`` fails: every slower candidate here does more work (its
Linear applied more often), which the exact counters see whatever the
machine's noise; a slowdown of the same work they cannot see, so the time
rows are the gate's power.  Prints a table (rates, counts) and
one JSON line; progress goes to stderr.  With ``--speed-probe`` every run is
recorded with the speed probe, and the history gate judges step times at the
history's machine speed (``modtrace.analysis.diff.speed``).  Sizes are arguments: on a shared
machine run a reduced version and say which.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this tree's benchmarks and modtrace

from benchmarks._common import busy_processes, gate_model, load_average  # noqa: E402

REPS = 10  # Linear applications per block per forward (--reps): a 1.3x block applies it 13 times
VARIANTS: dict[str, tuple[float, str]] = {  # name -> (slowdown, "block" (block 1 only) | "all")
    "A/A": (1.0, "all"),
    "block 1.5x": (1.5, "block"),
    "block 2x": (2.0, "block"),
    "block 3x": (3.0, "block"),
    "all 1.3x": (1.3, "all"),
}
SLOW_BLOCK = 1
# The gate row of the work counters (``--fail-on counters``): what the candidate did, not how long
# it took; every run counts its first step (``Recorder(counters="first")``, the default).
WORK_GATE = "work counters"


def build(slowdown: float, where: str, blocks: int, width: int, base_reps: int = REPS) -> Any:
    """The gate's model with block ``SLOW_BLOCK`` (``where`` "block") or every block (``where``
    "all") applying its Linear ``slowdown`` times as often as ``base_reps``."""
    def reps(i: int) -> int:
        slower = where == "all" or i == SLOW_BLOCK
        return round(base_reps * slowdown) if slower else base_reps

    return gate_model(blocks, width, reps)


def record(db: str, name: str, variant: str, args: argparse.Namespace, tags: dict[str, str]) -> None:
    import torch

    import modtrace

    slowdown, where = VARIANTS[variant]
    net = build(slowdown, where, args.blocks, args.width, args.reps)
    opt = torch.optim.SGD(net.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(1))
    with modtrace.Recorder(db=db, run=name, tags=tags, handle_sigterm=False, speed_probe=args.speed_probe) as rec:
        for _ in range(args.steps + 1):  # the first step is skipped by diff as warm-up
            net(x).sum().backward()
            opt.step()
            opt.zero_grad()
    rec.wait_analyzed()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--pairs", type=int, default=30, help="baseline runs and candidates of each variant, per load")
    p.add_argument("--steps", type=int, default=20, help="compared steps per run")
    p.add_argument("--history", type=int, default=5, help="baseline runs in the history gate's window")
    p.add_argument("--loads", default="0,1,2", help="background busy processes, comma-separated")
    p.add_argument("--variants", default=",".join(VARIANTS), help="which candidates (comma-separated)")
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--reps", type=int, default=REPS,
                   help="Linear applications per block (fewer: shorter steps; the slowdowns round to whole ones)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--speed-probe", action="store_true",
                   help="record every run with the speed probe (Recorder(speed_probe=True)): the history gate "
                        "judges step times adjusted for the machine's speed")
    p.add_argument("--db", default=None, help="database (default: a temporary file)")
    p.add_argument("--without", default="", metavar="CHECK,...",
                   help="judge with these checks of the rule left out (docs/diff.md): what each one earns, "
                        "with --rejudge on the same recordings")
    p.add_argument("--rejudge", action="store_true",
                   help="record nothing: judge the runs an earlier run of this script left in --db (a new rule on "
                        "the same recordings)")
    args = p.parse_args()
    import torch

    import modtrace
    import modtrace.api

    torch.set_num_threads(args.threads)
    variants = [v for v in args.variants.split(",") if v]
    loads = [int(x) for x in args.loads.split(",")]
    tmp = tempfile.TemporaryDirectory()
    db_path = args.db or str(Path(tmp.name) / "gate.db")
    counts: dict[tuple[int, str, str], list[int]] = {}  # (load, variant, gate) -> [caught, judged]
    measures: dict[int, list[dict[str, Any]]] = {}  # load -> the history gate's diff summaries
    t0, load_before = time.time(), load_average()
    options = modtrace.api.DiffOptions(skip_checks=frozenset(c for c in args.without.split(",") if c))
    for load in loads:
        spinners = [] if args.rejudge else busy_processes(load)
        try:
            main_tag = {"branch": f"main-{load}"}
            for i in range(args.history - 1):  # the history's older runs; each pair adds the newest
                if not args.rejudge:
                    record(db_path, f"L{load}-history{i}", "A/A", args, main_tag)
            for pair in range(args.pairs):
                base = f"L{load}-base{pair}"
                if not args.rejudge:
                    record(db_path, base, "A/A", args, main_tag)
                for variant in variants:
                    cand = f"L{load}-{variant.replace(' ', '').replace('/', '')}-{pair}"
                    if not args.rejudge:
                        record(db_path, cand, variant, args, {"branch": "pr"})
                    with modtrace.open(db_path) as db:
                        gates: list[tuple[str, Any]] = [("single base", base)]
                        if args.history > 1:
                            # re-judging, the selector would take the newest runs of the database: name
                            # the runs it took when this pair was recorded
                            ref = history_at(load, pair, args.history) if args.rejudge else f"tag:branch=main-{load}"
                            gates.append((f"history of {args.history}", ref))
                        for gate, ref in gates:
                            caught, result = judge_ref(db, ref, cand, variant, args.history, options)
                            c = counts.setdefault((load, variant, gate), [0, 0])
                            c[0] += int(caught)
                            c[1] += 1
                            if gate != "single base":
                                measures.setdefault(load, []).append(result.step)
                        # the work counters are exact and compared with the newest base run by
                        # either gate: one row, --fail-on counters
                        w = counts.setdefault((load, variant, WORK_GATE), [0, 0])
                        w[0] += int(result.failed("counters"))
                        w[1] += 1
                print(f"load {load} pair {pair + 1}/{args.pairs} done ({time.time() - t0:.0f} s, "
                      f"load average {load_average()})", file=sys.stderr)
        finally:
            for s in spinners:
                s.kill()
                s.wait()
    print(f"steps {args.steps}, history {args.history}, pairs per load {args.pairs}, blocks {args.blocks}, "
          f"width {args.width}, batch {args.batch}, reps {args.reps}, threads {args.threads}, speed probe {args.speed_probe}, "
          f"without {args.without or 'none'}; "
          f"load average before {load_before}, "
          f"after {load_average()}; {time.time() - t0:.0f} s")
    print(f"{'busy procs':>10}  {'candidate':<11} {'gate':<22} {'rate':>6}  caught/judged  (A/A: false alarms)")
    for (load, variant, gate), (hit, n) in sorted(counts.items(), key=lambda kv: (kv[0][0], variants.index(kv[0][1]), kv[0][2])):
        print(f"{load:>10}  {variant:<11} {gate:<22} {hit / n:>6.0%}  {hit}/{n}")
    print(json.dumps({f"{load}|{variant}|{gate}": c for (load, variant, gate), c in counts.items()}))
    for load, summaries in sorted(measures.items()):
        print(f"load {load}: {step_measures(summaries)}")
    tmp.cleanup()


def history_at(load: int, pair: int, window: int) -> list[str]:
    """The baseline runs ``tag:branch=main-LOAD`` took when pair ``pair`` was recorded, newest first."""
    names = [f"L{load}-base{p}" for p in range(pair, -1, -1)]
    names += [f"L{load}-history{i}" for i in range(window - 2, -1, -1)]
    return names[:window]


def step_measures(steps: list[Any]) -> str:
    """What the history gate's step verdicts judged (``StepVerdict.measure``), how far apart the
    history's runs lay on each measure weighed (``spreads``, medians), and how many step verdicts
    the ``confirmed`` check alone kept from a step-wide change."""
    judged: dict[str, int] = {}
    spreads: dict[str, list[float]] = {}
    for s in steps:
        judged[s.measure] = judged.get(s.measure, 0) + 1
        for m, v in s.spreads.items():
            spreads.setdefault(m, []).append(v)
    spread = ", ".join(f"{m} {statistics.median(v):.1%}" for m, v in sorted(spreads.items()))
    vetoed = sum(1 for s in steps if [c.name for c in s.checks if not c.passed] == ["confirmed"])
    return (f"step judged on {', '.join(f'{m} {n}x' for m, n in sorted(judged.items()))}; the history's median "
            f"spread {spread or 'none'}; {vetoed} step verdicts not confirmed by the other measure")


def judge_ref(db: Any, ref: str, cand: str, variant: str, window: int, options: Any) -> tuple[bool, Any]:
    """Whether the gate (base ``ref``: a run, or a tag selector) catches ``cand`` on time (for A/A,
    whether it fails ``--fail-on regression``: a false alarm), and the diff's result."""
    result = db.diff(ref, cand, options, window=window)
    if variant == "A/A" and result.failed("regression"):  # say what raised the false alarm
        blamed = result.timing.filter(result.timing["verdict"] == "regression")
        print(f"false alarm: {cand} against {ref}: step {result.step.verdict} "
              f"(ratio {result.step.ratio}), modules "
              f"{list(zip(blamed['fqn'], blamed['phase'], blamed['self_ratio'], strict=True))}", file=sys.stderr)
    if VARIANTS[variant][1] == "block" and variant != "A/A":
        blamed = result.timing.filter(result.timing["verdict"] == "regression")["fqn"].to_list()
        return any(f.endswith(f".{SLOW_BLOCK}") for f in blamed), result
    return bool(result.failed("regression")), result


if __name__ == "__main__":
    main()
