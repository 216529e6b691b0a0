"""Accuracy of ``modtrace diff`` on real recordings of scripts/train_tiny.py.

    .venv/bin/python benchmarks/accuracy_diff.py [--trials 5] [--steps 40] [--db PATH]

For each trial it records, one after the other in separate processes (as a
user would), a baseline, a second run with the identical configuration (A/A)
and a run with ``--slow-block K`` (K cycles through the blocks), then runs
``modtrace diff --format json`` on (base, A') and (base, slow):

- A/A: any regression is a false positive (improvements are counted too);
- slow block: a hit when ``TinyLM.blocks.K.mlp`` (the module whose own code
  does the extra work) is reported as a regression; a sibling hit when any
  other module is reported as a regression (another block, or another child
  of block K).  ``mlp_self_slowdown`` is that module's self time ratio
  (forward + backward, medians per step) and ``block_slowdown`` block K's
  inclusive one, to show the regression is at least 25%.

The recordings run one after the other while the machine does whatever else
it does, so A/A pairs also test that a change of machine load between two
recordings blames nobody.  ``load_average`` (1, 5, 15 min) is sampled before
and after.

Prints one JSON summary on stdout; progress goes to stderr.  Takes a few
minutes (each recording starts a Python process that imports torch).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this tree's benchmarks

from benchmarks._common import load_average, run_modtrace  # noqa: E402

TRAIN = REPO / "scripts" / "train_tiny.py"


def record(db: Path, name: str, steps: int, blocks: int, extra: list[str]) -> None:
    run_modtrace(["record", "--db", str(db), "--run", name, str(TRAIN), "--steps", str(steps), "--blocks", str(blocks),
                  "--threads", "1", "--quiet", *extra], cwd=REPO)


def diff(db: Path, base: str, cand: str) -> dict[str, Any]:
    _, proc = run_modtrace(["diff", base, cand, "--db", str(db), "--format", "json", "--fail-on", "never"], cwd=REPO)
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def regressions(doc: dict[str, Any]) -> list[str]:
    return [f"{r['fqn']}:{r['phase']}" for r in doc["timing"] if r["verdict"] == "regression"]


def slowdown(doc: dict[str, Any], fqn: str, metric: str) -> float | None:
    """cand / base of ``metric`` ("self" or "inclusive") median time per step, forward + backward."""
    rows = [r for r in doc["timing"] if r["fqn"] == fqn and r["phase"] in ("forward", "backward")]
    base = sum(r[metric]["base_us"] for r in rows)
    cand = sum(r[metric]["cand_us"] for r in rows)
    return round(cand / base, 3) if base else None


def flagged(doc: dict[str, Any], verdict: str) -> list[dict[str, Any]]:
    """The rows of one verdict, with the figures that decided them."""
    return [
        {"key": f"{r['fqn']}:{r['phase']}", "self_ratio": r["self"]["ratio"],
         "vs_rest_ratio": r["self_share"]["vs_rest_ratio"], "p_adjusted": r["self"]["p_adjusted"],
         "share_p_adjusted": r["self_share"]["p_adjusted"]}
        for r in doc["timing"] if r["verdict"] == verdict
    ]


def absolute_only(doc: dict[str, Any], threshold: float = 0.10, alpha: float = 0.01, min_us: float = 20.0) -> int:
    """How many rows the absolute criteria alone would blame (what the share criterion saved)."""
    return sum(
        1 for r in doc["timing"]
        if r["self"]["p_adjusted"] is not None and r["self"]["p_adjusted"] < alpha
        and r["self"]["delta_us"] > min_us and (r["self"]["ratio"] is None or r["self"]["ratio"] - 1 > threshold)
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--db", type=Path, default=None, help="keep the recordings in this database")
    args = p.parse_args()
    tmp = tempfile.TemporaryDirectory()
    db = args.db or Path(tmp.name) / "accuracy.db"
    t0 = time.perf_counter()
    load_before = load_average()
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
            "step_changed": d_aa["summary"]["step_changed"],
            "absolute_only_regressions": absolute_only(d_aa),
            "flagged": flagged(d_aa, "regression") + flagged(d_aa, "improvement"),
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
            "mlp_self_slowdown": slowdown(d_slow, target, "self"),
            "block_slowdown": slowdown(d_slow, f"TinyLM.blocks.{k}", "inclusive"),
            "step_ratio": d_slow["summary"]["step_ratio"],
            "flagged": flagged(d_slow, "regression"),
        })
    summary = {
        "trials": args.trials,
        "steps": args.steps,
        "aa_false_positives": sum(len(t["regressions"]) for t in aa),
        "aa_runs_with_false_positives": sum(1 for t in aa if t["regressions"]),
        "aa_improvements_reported": sum(len(t["improvements"]) for t in aa),
        "slow_hits": sum(1 for t in slow if t["hit"]),
        "slow_sibling_reports": sum(len(t["others"]) for t in slow),
        "slow_min_mlp_self_slowdown": min((t["mlp_self_slowdown"] or 0.0) for t in slow) if slow else None,
        "slow_min_block_slowdown": min((t["block_slowdown"] or 0.0) for t in slow) if slow else None,
        "aa_max_step_ratio_change": max((abs((t["step_ratio"] or 1.0) - 1) for t in aa), default=None),
        "aa_absolute_only_regressions": sum(t["absolute_only_regressions"] for t in aa),
        "ok": all(not t["regressions"] for t in aa)
        and all(t["hit"] and not t["others"] and (t["mlp_self_slowdown"] or 0.0) >= 1.25 for t in slow),
        "seconds": round(time.perf_counter() - t0, 1),
        "load_average": {"before": load_before, "after": load_average()},
        "aa": aa,
        "slow": slow,
    }
    print(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
