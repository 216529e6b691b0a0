"""Every key of the diff's JSON document is documented in docs/diff.md ("The JSON document"), and
every verdict in it is what its checks say."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.diff_runs import record

REPO = Path(__file__).resolve().parents[2]
# keys that name a measure, not a fixed field
_MAPS = {"step.spreads": "MEASURE"}


def _paths(value: Any, prefix: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else key
            if prefix in _MAPS:
                path = f"{prefix}.{_MAPS[prefix]}"
            out |= {path} | _paths(item, path)
    elif isinstance(value, list):
        for item in value:
            out |= _paths(item, prefix + "[]")
    return out


def _documented() -> set[str]:
    text = (REPO / "docs" / "diff.md").read_text()
    section = text[text.index("## The JSON document"):]
    return set(re.findall(r"`([a-z_]+(?:\[\])?(?:\.[A-Za-z_]+(?:\[\])?)*)`", section))


@pytest.fixture(scope="module")
def documents(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    import subprocess
    import sys

    db = str(tmp_path_factory.mktemp("doc") / "runs.db")
    for i in range(3):
        record(db, f"h{i}", steps=8, jitter=0.05, seed=i, tags={"branch": "main"}, speed_probe=True)
    record(db, "cand", {1: 300_000}, steps=8, jitter=0.05, seed=9, speed_probe=True)
    record(db, "short", steps=8, blocks=2)
    docs = []
    for args in (["tag:branch=main", "cand"], ["h0", "cand"], ["h0", "short"]):
        res = subprocess.run([sys.executable, "-m", "modtrace", "diff", "--db", db, *args, "--format", "json"],
                             capture_output=True, text=True, timeout=300)
        assert res.returncode in (0, 1), res.stderr
        docs.append(json.loads(res.stdout))
    return docs


def test_every_key_of_the_document_is_documented(documents: list[dict[str, Any]]) -> None:
    seen = set().union(*(_paths(d) for d in documents))
    # the documents hold every kind of row: a history, a blamed module, structure and order
    assert {"base.history[].run", "timing[].checks[].name", "step.checks[].passed", "structure[].kind",
            "order.excerpt[].op"} <= seen
    documented = _documented()
    missing = sorted(p for p in seen if p not in documented and f"{p}[]" not in documented)
    assert missing == [], f"keys of the JSON document not documented in docs/diff.md: {missing}"


def test_a_verdict_is_a_regression_exactly_when_all_its_checks_pass(documents: list[dict[str, Any]]) -> None:
    blamed = 0
    for doc in documents:
        for row in doc["timing"]:
            up = next(c for c in row["checks"] if c["name"] == "level_delta_us")["value"] > 0
            all_passed = all(c["passed"] for c in row["checks"])
            expected = ("regression" if up else "improvement") if all_passed else None
            assert (row["verdict"] if row["verdict"] in ("regression", "improvement") else None) == expected, row
            blamed += all_passed
        step = doc["step"]
        if step["checks"] and all(c["passed"] for c in step["checks"]):
            assert step["verdict"] in ("regression", "improvement")
        elif step["checks"]:
            assert step["verdict"] in ("unchanged", "unknown")
    assert blamed >= 2  # the slowed block, against the history and against one base run
