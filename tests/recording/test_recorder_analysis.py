"""The end-of-recording analysis runs after the program's context exits, in
the writer process: ``Recorder.wait_analyzed`` waits for it, ``modtrace
record`` returns after it, and ``show`` tells whether it is stored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import modtrace
from tests.helpers.database import db_rows
from tests.helpers.models import tiny_model_and_opt, train_step


def test_the_analysis_is_done_after_the_context_by_the_writer_process_and_show_tells(db_path: Path,
                                                                                   run_cli: Any) -> None:
    model, opt = tiny_model_and_opt()
    with modtrace.Recorder(db=str(db_path), run="later", writer="process", handle_sigterm=False) as rec:
        train_step(model, opt)
        rec.flush()
        writer = rec.writer_pid
    assert rec.status == "completed" and writer is not None
    assert rec.wait_analyzed(timeout=60)
    assert rec.analysis_stored is True
    assert db_rows(db_path, "SELECT count(*) FROM span_rows")[0][0] > 0
    assert any(line.split()[:2] == ["analysis", "stored"] for line in run_cli("show", "later").out.splitlines())
    with modtrace.Recorder(db=str(db_path), run="bare", analyze=False, handle_sigterm=False) as rec2:
        train_step(model, opt)
    assert rec2.wait_analyzed() and rec2.analysis_stored is None
    assert any(line.split()[:5] == ["analysis", "none", "(not", "analysed", "yet;"]
               for line in run_cli("show", "bare").out.splitlines())


def test_the_analysis_is_done_in_process_when_the_program_writes(db_path: Path) -> None:
    model, opt = tiny_model_and_opt()
    with modtrace.Recorder(db=str(db_path), run="inline", writer="thread", handle_sigterm=False) as rec:
        train_step(model, opt)
    assert rec.analysis_stored is True  # nothing to wait for
    assert db_rows(db_path, "SELECT count(*) FROM span_rows")[0][0] > 0


def test_record_returns_once_the_run_is_analysed(tmp_path: Path, db_path: Path, run_cli: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom torch import nn\n"
        "m = nn.Sequential(nn.Linear(2, 2), nn.ReLU())\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(3):\n    m(torch.ones(1, 2)).sum().backward(); opt.step(); opt.zero_grad()\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MODTRACE_WRITER", "process")
    assert run_cli("record", "-q", "--run", "r", str(script)).code == 0
    assert db_rows(db_path, "SELECT count(*) FROM span_rows") == [(3 * 2 * 3,)]  # 3 modules, fwd+bwd, 3 steps
