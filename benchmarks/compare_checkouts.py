"""Any ``modtrace`` command run by this checkout's code and by another checkout's, side by side,
on the same database: whether a change paid end to end.

    .venv/bin/python benchmarks/compare_checkouts.py --other-tree DIR [--repeats 7] -- diff base cand --db X

Each repeat runs the command once with each checkout first on ``PYTHONPATH`` (a fresh interpreter
each time, imports included, as a user runs it), taking turns (``_common.interleave``), and
prints the medians, the ratio this/other and the load average.  For a change that only moves
time around (a thread removed, say): a ratio within noise of 1 means it did not pay.  The
command must read, not write, or leave the database as it found it (``analyze`` replaces what
it writes, so it qualifies).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import interleave, load_average, medians  # noqa: E402

HERE = Path(__file__).resolve().parents[1]


def command(tree: Path, args: list[str]) -> float:
    """Wall seconds of ``python -m modtrace ARGS`` importing modtrace from ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "modtrace", *args], env=env, capture_output=True, text=True,
                          check=False, cwd=tree)
    wall = time.perf_counter() - t0
    if done.returncode not in (0, 1):
        raise SystemExit(f"{tree}: modtrace {' '.join(args)} failed ({done.returncode}): {done.stderr[-1500:]}")
    return wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--other-tree", required=True, type=Path, help="another checkout of modtrace")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("args", nargs=argparse.REMAINDER, help="the modtrace command, after --")
    a = p.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    if not args:
        p.error("give the command after --")
    other = a.other_tree.resolve()
    before = load_average()
    samples = interleave({"this": lambda: command(HERE, args), "other": lambda: command(other, args)}, a.repeats,
                         own_time=("this", "other"))
    meds = medians(samples.wall)
    print(json.dumps({"command": args, "repeats": a.repeats, "median_s": meds,
                      "this_over_other": meds["this"] / meds["other"], "runs_s": samples.wall,
                      "load_average": {"before": before, "after": load_average()}}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
