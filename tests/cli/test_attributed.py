"""Spans attributed from compiled kernels (status attributed), as every reader shows them.

The rows are written as the recorder writes a compiled model's run (tests/helpers/compiled_rows.py):
real event rows through the store's writer into a real SQLite file or PostgreSQL schema, then
the real ``modtrace`` commands.  The expected times are the ones the rows were written with.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.helpers.clients import check_rows
from tests.helpers.compiled_rows import EXPECTED, STEPS, write_compiled_run
from tests.helpers.database import db_rows
from tests.helpers.report import embedded


def test_spans_and_event_log_name_status_attributed(any_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    write_compiled_run(any_db, "compiled")
    assert run_cli("analyze", "compiled", "--db", any_db).code == 0
    spans = db_rows(any_db, "SELECT fqn, phase, step, duration_ns, self_ns, status FROM spans ORDER BY span_id")
    assert sorted(spans, key=lambda r: (r[2], r[0], r[1])) == sorted(
        ((fqn, phase, step, *EXPECTED[fqn, phase]) for (fqn, phase) in EXPECTED for step in range(STEPS)),
        key=lambda r: (r[2], r[0], r[1]))
    events = db_rows(any_db, "SELECT fqn, kind, status, count(*) FROM event_log GROUP BY fqn, kind, status ORDER BY fqn, kind")
    assert events == [
        ("Net", "enter", "ok", 2 * STEPS), ("Net", "exit", "ok", 2 * STEPS),
        *((fqn, kind, "attributed", 2 * STEPS) for fqn in ("Net.block", "Net.block.attn", "Net.block.mlp")
          for kind in ("enter", "exit")),
    ]
    # the stored tree keeps where each node's time came from
    assert set(db_rows(any_db, "SELECT fqn, source FROM tree_nodes WHERE clock = 'host'")) == {
        ("Net", "hooks"), ("Net.block", "kernels"), ("Net.block.attn", "kernels"), ("Net.block.mlp", "kernels")}


def test_check_and_show_say_whether_the_detail_was_attributed(db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = str(db_path)
    write_compiled_run(db, "attributed")
    write_compiled_run(db, "whole", attributed=False)
    compiled = [r for r in check_rows(run_cli, db, "whole") if r["kind"] == "compiled"]
    assert [(r["fqn"], r["phase"]) for r in compiled] == [("Net", "forward")] * STEPS
    assert not [r for r in check_rows(run_cli, db, "attributed") if r["kind"] == "compiled"]

    notes = {run: [ln for ln in run_cli("show", run, "--db", db).out.splitlines() if ln.startswith("note:")]
             for run in ("attributed", "whole")}
    assert notes == {
        "attributed": ["note: Net ran compiled (torch.compile): the time of the module calls inside is attributed"
                       " from the kernels compiled for them (status attributed); `modtrace record --eager` measures"
                       " them with hooks"],
        "whole": ["note: Net ran compiled (torch.compile): the module calls inside are not recorded;"
                  " `modtrace record --eager` records them"],
    }
    shown = json.loads(run_cli("show", "attributed", "--db", db, "--format", "json").out)
    assert (shown["compiled_modules"], shown["compiled_attributed"]) == (["Net"], True)


def _sources(nodes: list[dict[str, Any]]) -> dict[tuple[str, str], str]:
    out: dict[tuple[str, str], str] = {}
    for node in nodes:
        out[node["fqn"], node["phase"]] = node["source"]
        out.update(_sources(node["children"]))
    return out


def test_tree_marks_attributed_nodes_and_explains_the_mark(db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = str(db_path)
    write_compiled_run(db, "mixed", hooked_attn_step=1)  # step 1's forward attn measured by hooks
    expected = {key: "hooks" if key[0] == "Net" else "kernels" for key in EXPECTED}
    expected["Net.block.attn", "forward"] = "mixed"
    computed = run_cli("tree", "mixed", "--db", db, "--format", "json")  # before analyze: from the spans
    assert computed.code == 0, computed
    assert _sources(json.loads(computed.out)) == expected
    assert run_cli("analyze", "mixed", "--db", db).code == 0
    stored = run_cli("tree", "mixed", "--db", db, "--format", "json")  # the stored tree
    assert _sources(json.loads(stored.out)) == expected
    one_step = run_cli("tree", "mixed", "--db", db, "--format", "json", "--step", "0")  # the spans of step 0
    assert _sources(json.loads(one_step.out)) == {
        k: "kernels" if v == "mixed" else v for k, v in expected.items()}

    text = run_cli("tree", "mixed", "--db", db).out.splitlines()
    names = [re.split(r"\s{2,}", line.strip())[0] for line in text[1:-2]]
    assert names == ["Net", "≈ block", "+≈ attn", "≈ mlp", "Net", "≈ block", "≈ attn", "≈ mlp"], text
    assert text[-2:] == [
        "≈ attributed from compiled kernels (status attributed): the sum of the kernels inductor generated from"
        " the module's code, not measured by hooks",
        "+≈ some calls measured by hooks, some attributed from compiled kernels",
    ]
    # a run with no attributed span shows neither marks nor legend
    write_compiled_run(db, "whole", attributed=False)
    plain = run_cli("tree", "whole", "--db", db).out
    assert "≈" not in plain and "attributed" not in plain


def test_perfetto_slices_of_attributed_spans_say_so(db_path: Path, tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = str(db_path)
    write_compiled_run(db, "compiled")
    out = tmp_path / "trace.json"
    assert run_cli("export", "compiled", "--db", db, "-o", str(out), "-q").code == 0
    slices = [e for e in json.loads(out.read_text())["traceEvents"] if e.get("ph") == "X" and e.get("cat") != "step"]
    seen = {(e["name"], e["args"]["phase"], e["cat"], e.get("cname"), e["args"].get("source"), e["args"]["status"])
            for e in slices}
    assert seen == {
        (fqn, phase, f"{phase},attributed" if status == "attributed" else phase,
         "olive" if status == "attributed" else None, "kernels" if status == "attributed" else None, status)
        for (fqn, phase), (_, _, status) in EXPECTED.items()
    }
    assert len(slices) == len(EXPECTED) * STEPS


def test_report_marks_attributed_modules(db_path: Path, tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = str(db_path)
    write_compiled_run(db, "compiled")
    report = tmp_path / "report.html"
    assert run_cli("report", "compiled", "--db", db, "-o", str(report), "-q").code == 0
    data = embedded(report.read_text())
    assert {(r["fqn"], r["phase"]): r["source"] for r in data["top_modules"]} == {
        key: "hooks" if key[0] == "Net" else "kernels" for key in EXPECTED}
    assert data["source_marks"]["kernels"][0] == "≈"
    statuses = [data["statuses"][sp[7]] for step in data["flame"]["steps"] for sp in step["spans"]]
    assert sorted(set(statuses)) == ["attributed", "ok"]
    assert statuses.count("attributed") == 6 * len(data["flame"]["steps"])
    assert data["run"]["compiled_note"].startswith("Net ran compiled (torch.compile): the time of the module calls")
