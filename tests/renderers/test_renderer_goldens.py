"""Golden files for the renderers that had none: check's table and JSON on a mis-nested run,
and the report's per-module and per-step numbers on a model timed by an injected clock (the
diff, tree and Perfetto renderers have theirs in tests/cli/test_diff_cli.py,
tests/cli/test_cli_analysis.py and tests/renderers/test_perfetto_golden.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.helpers.golden import check_golden
from tests.helpers.models import _crossed_run
from tests.helpers.report import embedded, record_toy


def test_check_table_and_json(db_path: Path, run_cli: Any) -> None:
    _crossed_run(str(db_path))
    table = run_cli("check", "broken", "--db", str(db_path))
    assert table.code == 1, table  # a crossed exit is an error
    check_golden("check_broken.txt", table.out)
    as_json = run_cli("check", "broken", "--db", str(db_path), "--format", "json")
    check_golden("check_broken.json", as_json.out)
    assert {issue["kind"] for issue in json.loads(as_json.out)} == {"crossed", "unclosed"}


def test_report_numbers(db_path: Path, run_cli: Any) -> None:
    record_toy(str(db_path), "toy")
    report = run_cli("report", "toy", "--db", str(db_path), "-o", "-", "-q")
    assert report.code == 0, report
    data = embedded(report.out)
    shown = {key: data[key] for key in ("top_modules", "steps") if key in data}
    assert shown, sorted(data)
    check_golden("report_toy_numbers.json", json.dumps(shown, indent=1, sort_keys=True) + "\n")
