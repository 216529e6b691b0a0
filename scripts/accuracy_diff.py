"""Accuracy of ``modtrace diff`` on real recordings of scripts/train_tiny.py.

    .venv/bin/python scripts/accuracy_diff.py [--trials 5] [--steps 30] [--db PATH]

For each trial it records, one after the other in separate processes (as a
user would), a baseline, a second run with the identical configuration (A/A)
and a run with ``--slow-block K`` (K cycles through the blocks), then runs
``modtrace diff --format json`` on (base, A') and (base, slow):

- A/A: any regression is a false positive (improvements are counted too);
- slow block: a hit when ``TinyLM.blocks.K.mlp`` (the module whose own code
  does the extra work) is reported as a regression; a sibling hit when any
  other module is reported as a regression (another block, or another child
  of block K).  ``block_slowdown`` is block K's inclusive forward+backward
  time ratio, to show the regression is at least 25%.

Prints one JSON summary on stdout; progress goes to stderr.  Takes a few
minutes (each recording starts a Python process that imports torch).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TRAIN = REPO / "scripts" / "train_tiny.py"


def record(db: Path, name: str, steps: int, blocks: int, extra: list[str]) -> None:
    cmd = [sys.executable, "-m", "modtrace", "record", "--db", str(db), "--run", name, str(TRAIN),
           "--steps", str(steps), "--blocks", str(blocks), "--threads", "1", "--quiet", *extra]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"recording {name} failed:\n{proc.stdout}\n{proc.stderr}")


def diff(db: Path, base: str, cand: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "modtrace", "diff", base, cand, "--db", str(db), "--format", "json", "--fail-on", "never"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"diff {base} {cand} failed:\n{proc.stderr}")
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def regressions(doc: dict[str, Any]) -> list[str]:
    return [f"{r['fqn']}:{r['phase']}" for r in doc["timing"] if r["verdict"] == "regression"]


def block_slowdown(doc: dict[str, Any], fqn: str) -> float | None:
    rows = [r for r in doc["timing"] if r["fqn"] == fqn and r["phase"] in ("forward", "backward")]
    base = sum(r["inclusive"]["base_us"] for r in rows)
    cand = sum(r["inclusive"]["cand_us"] for r in rows)
    return round(cand / base, 3) if base else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--db", type=Path, default=None, help="keep the recordings in this database")
    args = p.parse_args()
    tmp = tempfile.TemporaryDirectory()
    db = args.db or Path(tmp.name) / "accuracy.db"
    t0 = time.perf_counter()
    aa: list[dict[str, Any]] = []
    slow: list[dict[str, Any]] = []
    for i in range(args.trials):
        k = i % args.blocks
        print(f"trial {i + 1}/{args.trials}: recording base, A', slow block {k}", file=sys.stderr, flush=True)
        record(db, f"base{i}", args.steps, args.blocks, [])
        record(db, f"same{i}", args.steps, args.blocks, [])
        record(db, f"slow{i}", args.steps, args.blocks, ["--slow-block", str(k)])
        d_aa = diff(db, f"base{i}", f"same{i}")
        aa.append({
            "trial": i,
            "regressions": regressions(d_aa),
            "improvements": [f"{r['fqn']}:{r['phase']}" for r in d_aa["timing"] if r["verdict"] == "improvement"],
            "structure_changes": d_aa["summary"]["structure_changes"],
            "step_ratio": d_aa["summary"]["step_ratio"],
        })
        d_slow = diff(db, f"base{i}", f"slow{i}")
        target = f"TinyLM.blocks.{k}.mlp"
        found = regressions(d_slow)
        slow.append({
            "trial": i,
            "block": k,
            "hit": any(r.startswith(target + ":") for r in found),
            "others": [r for r in found if not r.startswith(target + ":")],
            "regressions": found,
            "block_slowdown": block_slowdown(d_slow, f"TinyLM.blocks.{k}"),
            "step_ratio": d_slow["summary"]["step_ratio"],
        })
    summary = {
        "trials": args.trials,
        "steps": args.steps,
        "aa_false_positives": sum(len(t["regressions"]) for t in aa),
        "aa_runs_with_false_positives": sum(1 for t in aa if t["regressions"]),
        "aa_improvements_reported": sum(len(t["improvements"]) for t in aa),
        "slow_hits": sum(1 for t in slow if t["hit"]),
        "slow_sibling_reports": sum(len(t["others"]) for t in slow),
        "slow_min_block_slowdown": min((t["block_slowdown"] or 0.0) for t in slow) if slow else None,
        "ok": all(not t["regressions"] for t in aa) and all(t["hit"] and not t["others"] for t in slow),
        "seconds": round(time.perf_counter() - t0, 1),
        "aa": aa,
        "slow": slow,
    }
    print(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
