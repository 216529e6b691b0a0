"""The HTML report's work table carries each module's kept and peak memory when the run has it,
the same figures ``Database.tree`` gives."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import modtrace
from tests.helpers.training import record_training


def test_report_and_tree_show_the_same_memory(db_path: Path, tmp_path: Path, run_cli: Any) -> None:
    db = str(db_path)
    record_training(db, "run", 3)
    out = tmp_path / "report.html"
    done = run_cli("report", "run", "--db", db, "-o", str(out))
    assert done.code == 0, done
    html = out.read_text()
    assert 'label: "kept/step"' in html  # the column the page draws
    found = {float(v) for v in re.findall(r'"kept_mem_per_step":([0-9.]+)', html)}
    with modtrace.open(db) as database:
        tree = database.tree("run")
        spans = database.spans("run")
    assert spans.filter(spans["kept_mem_bytes"].is_not_null()).height > 0
    assert found and found <= {float(v) for v in tree["kept_mem_per_step"].drop_nulls().to_list()}
