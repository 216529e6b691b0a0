"""What any step rule could catch on a ``gate_power.py`` recording: the bound the machine sets.

    .venv/bin/python benchmarks/gate_bound.py --db GATE.db [--loads 0,1,2] [--sd 3]

``gate_power.py --speed-probe --db GATE.db`` leaves, per load, ``--history`` - 1
older baseline runs, one baseline run per pair, and each pair's candidates.
The history gate sees five baseline runs; this script looks at all of them
(34 at 30 pairs), on the two measures the step verdict weighs, computed here from the stored probes for a CPU
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
import sqlite3
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this tree's modtrace

MEASURES = ("cpu_raw", "cpu")


def run_levels(conn: sqlite3.Connection, name: str, skip: int = 1) -> dict[str, float]:
    """One run -> its median step on each measure, from its stored probes (``step_speeds``, the
    schema's "Machine speed"): from the probe before a step to the next probe, the recording
    thread's CPU time less the probe (a probe counts for at most ``PROBE_CAP`` times the run's
    median), as measured ("cpu_raw", ns) and over that probe ("cpu"); the first ``skip`` steps
    left out, as ``modtrace diff`` leaves them."""
    from modtrace.analysis.diff.speed import PROBE_CAP

    rows = conn.execute("SELECT s.step, s.probe_ns, s.cpu_ns FROM step_speeds s JOIN runs r ON r.id = s.run_id "
                        "WHERE r.name = ? AND s.rank = 0 ORDER BY s.step", (name,)).fetchall()
    windows = [(c1 - c0, p) for (step, p, c0), (_, _, c1) in zip(rows, rows[1:], strict=False)
               if step >= skip and c0 is not None and c1 is not None]
    if not windows:
        raise SystemExit(f"run {name!r} has no probed step with its CPU time: record with --speed-probe")
    cap = PROBE_CAP * statistics.median(p for _, p in windows)
    work = [(max(cpu - min(p, cap), 0), min(p, cap)) for cpu, p in windows]
    return {"cpu_raw": statistics.median(w for w, _ in work), "cpu": statistics.median(w / p for w, p in work)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--db", required=True, help="a database gate_power.py --speed-probe recorded")
    p.add_argument("--loads", default="0,1,2", help="the loads it recorded, comma-separated")
    p.add_argument("--sd", type=float, default=3.0, help="the oracle's bound, in sd of log above the median")
    args = p.parse_args()
    if not Path(args.db).is_file():
        raise SystemExit(f"no such database: {args.db}")
    with sqlite3.connect(f"file:{args.db}?mode=ro", uri=True) as db:
        names = {n for (n,) in db.execute("SELECT name FROM runs")}
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
