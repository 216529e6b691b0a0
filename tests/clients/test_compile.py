"""torch.compile: a compiled region inside an eager model, and a model
compiled as a whole, recorded with and without ``modtrace record --eager``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import modtrace
from tests.helpers.clients import check_rows
from tests.helpers.database import db_rows
from tests.helpers.report import embedded
from tests.helpers.training import train

pytestmark = pytest.mark.slow  # real clients: transformers, Lightning, inductor


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.blocks = nn.ModuleList([Block() for _ in range(2)])
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_regional_compilation_keeps_names_and_nesting(db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = Net()
    eager_names = {f"Net{n and '.' + n}" for n, _ in model.named_modules()}
    model.blocks[1] = torch.compile(model.blocks[1], backend="eager")  # type: ignore[assignment]
    with modtrace.Recorder(db=str(db_path), run="regional") as _rec:
        train(model, 3, inputs=(2, 4), lr=0.1)
    _rec.wait_analyzed()  # the writer process analyses the run after the with
    names = {f for (f,) in db_rows(str(db_path), "SELECT DISTINCT fqn FROM spans")}
    # the compiled block is recorded under its own name (no OptimizedModule, no _orig_mod); its insides run compiled
    assert names == eager_names - {"Net.blocks", "Net.blocks.1.fc1", "Net.blocks.1.fc2"}  # a ModuleList is never called
    assert db_rows(str(db_path), "SELECT phase, count(*) FROM spans WHERE fqn = 'Net.blocks.1' GROUP BY phase ORDER BY phase") == [
        ("backward", 3), ("forward", 3)]
    assert {f for (f,) in db_rows(str(db_path), "SELECT fqn FROM modules")} == eager_names
    # the compiled block hides its two Linear calls: show and check say so
    assert db_rows(str(db_path), "SELECT fqn FROM modules WHERE compiled = 1") == [("Net.blocks.1",)]
    assert json.loads(run_cli("show", "@", "--db", str(db_path), "--format", "json").out)["compiled_modules"] == [
        "Net.blocks.1"]
    compiled = [r for r in check_rows(run_cli, str(db_path)) if r["kind"] == "compiled"]
    assert [(r["severity"], r["fqn"], r["phase"]) for r in compiled] == [("info", "Net.blocks.1", "forward")] * 3


WHOLE = textwrap.dedent(
    """
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = torch.compile(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)), backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    """
)


def test_whole_model_compilation_and_eager(tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "whole.py"
    script.write_text(WHOLE)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TORCH_COMPILE_DISABLE", None)
    dbs = {}
    for flags in ([], ["--eager"]):
        db = str(tmp_path / f"trace{len(flags)}.db")
        out = subprocess.run([sys.executable, "-m", "modtrace", "record", "--db", db, "-q", *flags, str(script)],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        dbs[bool(flags)] = db
        check_rows(run_cli, db)
    spans = "SELECT fqn, phase, count(*) FROM spans GROUP BY fqn, phase ORDER BY fqn, phase"
    # compiled as a whole: only the compiled module's own call is seen
    assert db_rows(dbs[False], spans) == [("Sequential", "backward", 3), ("Sequential", "forward", 3)]
    # --eager: every module
    assert db_rows(dbs[True], spans) == [
        (f"Sequential{s}", p, 3) for s in ("", ".0", ".1", ".2") for p in ("backward", "forward")]

    # where the user looks, the compiled run says its inner calls are missing and how to get them
    show = run_cli("show", "@", "--db", dbs[False])
    assert show.code == 0 and show.out.endswith(
        "note: Sequential ran compiled (torch.compile): the module calls inside are not recorded;"
        " `modtrace record --eager` records them\n"), show.out
    check = run_cli("check", "@", "--db", dbs[False])
    assert check.code == 0, check
    [line] = [ln for ln in check.out.splitlines() if " compiled " in ln]
    assert line.split()[:2] == ["info", "compiled"] and "Sequential forward" in line and "--eager" in line, line
    report = tmp_path / "report.html"
    assert run_cli("report", "@", "--db", dbs[False], "-o", str(report)).code == 0
    data = embedded(report.read_text())
    assert data["run"]["compiled_modules"] == ["Sequential"]
    assert ("compiled", "Sequential") in {(r["kind"], r["fqn"]) for r in data["issues"]["rows"]}
    # --eager: nothing is hidden, nothing is said
    assert json.loads(run_cli("show", "@", "--db", dbs[True], "--format", "json").out)["compiled_modules"] == []
    assert not [r for r in check_rows(run_cli, dbs[True]) if r["kind"] == "compiled"]
