"""What any step rule could catch on a ``gate_power.py`` recording: the bound the machine sets.

    .venv/bin/python benchmarks/gate_bound.py --db GATE.db [--loads 0,1,2] [--sd 3]

``gate_power.py --speed-probe --db GATE.db`` leaves, per load, ``--history`` - 1
older baseline runs, one baseline run per pair, and each pair's candidates.
The history gate sees five baseline runs; this script looks at all of them
(34 at 30 pairs), on the two measures the step verdict weighs for a CPU
program on one intra-op thread (``modtrace.analysis.diff.history``): the
thread's CPU time per step as measured ("cpu_raw") and over the step's speed
probe ("cpu").  Each run's level is its median step on the measure.

Per load and measure it prints how far the baseline runs' levels lie apart
(sd of their logarithms) and what two rules that know more than any gate
can would catch of the uniform 1.3x candidates:

- ``oracle``: the baselines' true median and sd known (from every baseline
  run of the load), alarm above median * exp(``--sd`` * sd); under a normal
  law 3 sd is 0.13% false alarms per pair;
- ``in-sample``: the lowest bound that raises no A/A alarm on this very
  recording (the highest A/A candidate's ratio): optimistic, since it is
  tuned on the A/A candidates it is judged on.

A rule that sees five baseline runs cannot do better than the first, so
when the oracle misses, the machine's run-to-run noise, not the rule, is
what misses.  Reads only; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this tree's benchmarks and modtrace

MEASURES = ("cpu_raw", "cpu")


def run_levels(db: object, name: str) -> dict[str, float]:
    """One run -> its median step on each measure, from the step verdict's own frames (``speed``):
    "cpu_raw" in ns, "cpu" as CPU time over the step's capped probe (only ratios are read)."""
    from modtrace.analysis.diff.samples import (
        compared_calls,
        module_keys,
        module_lookup,
        step_units,
        with_mkey,
    )
    from modtrace.analysis.diff.speed import cpu_at_speed, cpu_per_step, probed_units
    from modtrace.api._diff import like_with_like_all

    side = db._side(name, None, None, "host")  # type: ignore[attr-defined]
    calls = like_with_like_all([side], None)[0]
    lookup = module_lookup(calls)
    compared = with_mkey(compared_calls(calls.calls, 1), lookup, module_keys(lookup))
    units = probed_units(compared, step_units(compared), calls.speeds)
    if units.height == 0 or units["window_cpu_ns"].null_count() == units.height:
        raise SystemExit(f"run {name!r} has no probed step with its CPU time: record with --speed-probe")
    # at a reference probe of 1000 ns: the level over the probe, scaled (only ratios are read)
    return {"cpu_raw": float(cpu_per_step(units)["step_ns"].median()),  # type: ignore[arg-type]
            "cpu": float(cpu_at_speed(units, 1000.0)["step_ns"].median())}  # type: ignore[arg-type]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--db", required=True, help="a database gate_power.py --speed-probe recorded")
    p.add_argument("--loads", default="0,1,2", help="the loads it recorded, comma-separated")
    p.add_argument("--sd", type=float, default=3.0, help="the oracle's bound, in sd of log above the median")
    args = p.parse_args()
    import modtrace

    with modtrace.open(args.db) as db:
        names = set(db.runs()["name"].to_list())
        print(f"{'busy':>4}  {'measure':<8} {'sd log':>6}  {'1.3x/base':>9}  {'oracle caught':>13}  "
              f"{'A/A':>4}  {'in-sample bound':>15}  caught")
        for load in (int(x) for x in args.loads.split(",") if x):
            base = sorted(n for n in names if n.startswith((f"L{load}-base", f"L{load}-history")))
            slow = sorted(n for n in names if n.startswith(f"L{load}-all1.3x-"))
            same = sorted(n for n in names if n.startswith(f"L{load}-AA-"))
            if not base or not slow or not same:
                raise SystemExit(f"load {load}: no baseline, 1.3x or A/A runs in {args.db}")
            levels = {n: run_levels(db, n) for n in (*base, *slow, *same)}
            print(f"load {load}: {len(base)} baseline runs, {len(slow)} 1.3x, {len(same)} A/A", file=sys.stderr)
            for m in MEASURES:
                logs = [math.log(levels[n][m]) for n in base]
                mid, sd = statistics.median(logs), statistics.stdev(logs)
                ratio = {n: math.exp(math.log(levels[n][m]) - mid) for n in (*slow, *same)}
                bound = math.exp(args.sd * sd)
                caught = sum(ratio[n] > bound for n in slow)
                alarms = sum(ratio[n] > bound for n in same)
                tuned = max(ratio[n] for n in same)
                tuned_caught = sum(ratio[n] > tuned for n in slow)
                typical = math.exp(statistics.median(math.log(ratio[n]) for n in slow))
                print(f"{load:>4}  {m:<8} {sd:>6.3f}  {typical:>9.3f}  {caught:>6}/{len(slow):<6}  "
                      f"{alarms:>4}  {tuned:>15.3f}  {tuned_caught}/{len(slow)}")


if __name__ == "__main__":
    main()
