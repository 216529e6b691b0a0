"""Any ``modtrace`` command run by this checkout's code and by another checkout's, side by side,
on the same database: whether a change paid end to end.

    .venv/bin/python benchmarks/compare_checkouts.py --other-tree DIR [--repeats 7] -- diff base cand --db X

Each repeat runs the command once with each checkout first on ``PYTHONPATH`` (a fresh interpreter
each time, imports included, as a user runs it), taking turns (``_common.interleave``), and
prints the medians, the ratio this/other and the load average.  For a change that only moves
time around (a thread removed, say): a ratio within noise of 1 means it did not pay.  The
command must read, not write, or leave the database as it found it (``analyze`` replaces what
it writes, so it qualifies).

A checkout of another schema revision cannot open this one's database: ``--other-db`` gives the
other checkout its own (the value of the command's ``--db`` is replaced for it; record the same
synthetic run in each, ``benchmarks/_common.py DB`` here).  Both run from bytecode, as an
installed package does: ``PYTHONDONTWRITEBYTECODE`` is dropped for them, else every run would
compile the checkout from source (more so for the checkout with more code).  Beside the wall
times it prints each command's CPU time (user + system of the child), which the machine's
other work moves less.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import interleave, load_average, medians  # noqa: E402

HERE = Path(__file__).resolve().parents[1]


# CPU seconds (user + system) of each checkout's commands, in the order they ran.
CPU: dict[str, list[float]] = {}


def with_db(args: list[str], db: str | None) -> list[str]:
    """``args`` with the value of ``--db`` replaced by ``db`` (added when missing); as they are for None."""
    if db is None:
        return args
    if "--db" in args:
        i = args.index("--db")
        return [*args[:i + 1], db, *args[i + 2:]]
    return [*args, "--db", db]


def command(tree: Path, args: list[str], label: str = "") -> float:
    """Wall seconds of ``python -m modtrace ARGS`` importing modtrace from ``tree``; its CPU
    seconds go to ``CPU[label]``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(tree)
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "modtrace", *args], env=env, capture_output=True, text=True,
                          check=False, cwd=tree)
    wall = time.perf_counter() - t0
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU.setdefault(label, []).append(c1.ru_utime - c0.ru_utime + c1.ru_stime - c0.ru_stime)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{tree}: modtrace {' '.join(args)} failed ({done.returncode}): {done.stderr[-1500:]}")
    return wall


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--other-tree", required=True, type=Path, help="another checkout of modtrace")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--other-db", help="the other checkout's database (another schema revision), in place of --db's")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the modtrace command, after --")
    a = p.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    if not args:
        p.error("give the command after --")
    other = a.other_tree.resolve()
    before = load_average()
    other_args = with_db(args, a.other_db)
    samples = interleave({"this": lambda: command(HERE, args, "this"), "other": lambda: command(other, other_args, "other")},
                         a.repeats, own_time=("this", "other"))
    meds, cpu = medians(samples.wall), medians(CPU)
    print(json.dumps({"command": args, "repeats": a.repeats, "median_s": meds,
                      "this_over_other": meds["this"] / meds["other"], "cpu_median_s": cpu,
                      "cpu_this_over_other": cpu["this"] / cpu["other"], "runs_s": samples.wall, "cpu_s": CPU,
                      "load_average": {"before": before, "after": load_average()}}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
