"""The issue's reproductions under the real CLI: a module borrowed from a
plain list, a loss module created in every forward, and an A/A diff of two
recordings with different step counts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers.clients import check_rows
from tests.helpers.database import db_rows

pytestmark = pytest.mark.slow  # real clients: transformers, Lightning, inductor

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch
    from torch import nn

    class Borrows(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(4, 4)
            self._borrowed = [nn.Linear(4, 3)]

        def forward(self, x, labels):
            logits = self._borrowed[0](self.inner(x))
            return nn.CrossEntropyLoss()(logits, labels)  # a loss module built on every call

    torch.manual_seed(0)
    model = Borrows()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(int(sys.argv[1])):
        opt.zero_grad()
        model(torch.randn(2, 4, requires_grad=True), torch.tensor([0, 2])).backward()
        opt.step()
    """
)


def record(tmp_path: Path, db: str, run: str, steps: int) -> None:
    script = tmp_path / "borrow.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, "-m", "modtrace", "record", "--db", db, "--run", run, "-q", str(script), str(steps)],
                         cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]


def test_borrowed_and_per_call_modules_and_an_aa_diff(tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = str(tmp_path / "trace.db")
    record(tmp_path, db, "five", 5)
    record(tmp_path, db, "nine", 9)
    check_rows(run_cli, db, "five")
    check_rows(run_cli, db, "nine")
    # one modules row per name, whatever the step count
    for run_id in (1, 2):
        assert sorted(f for (f,) in db_rows(db, "SELECT fqn FROM modules WHERE run_id = :r", r=run_id)) == [
            "Borrows", "Borrows.inner", "CrossEntropyLoss", "Linear"]
    # the borrowed and the per-call module nest in the backward of the call that used them
    tree = db_rows(db, "SELECT c.fqn, p.fqn FROM spans c JOIN spans p ON p.run_id = c.run_id AND p.span_id = c.parent_span_id "
                       "WHERE c.run_id = 1 AND c.phase = 'backward' AND c.step = 0 ORDER BY c.span_id")
    assert sorted(tree) == [("Borrows.inner", "Borrows"), ("CrossEntropyLoss", "Borrows"), ("Linear", "Borrows")]
    diff = run_cli("diff", "--db", db, "five", "nine", "--format", "json", "--fail-on", "structure")
    assert diff.code == 0, diff.err
    assert json.loads(diff.out)["summary"]["structure_changes"] == 0
