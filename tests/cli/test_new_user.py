"""What a new user hit (issue 39, point 8), each through the real CLI: a diff of two batch sizes
that silently compared no counter, and a tree and check of a failed run that read as healthy.
(The runs table on a narrow terminal is in tests/renderers/test_terminal_output.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa
import torch
from torch import nn

import modtrace
from modtrace.store.engine import open_store
from modtrace.store.runs import add_rank, create_run
from modtrace.store.schema import run_ranks


class ConvNet(nn.Module):
    """Three 3x3 convolutions: every module's work is proportional to the batch."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.convs(pixel_values)


def _record_batch(db: str, run: str, batch: int) -> None:
    torch.manual_seed(0)
    model = ConvNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with modtrace.Recorder(db=db, run=run, writer="inline"):
        for _ in range(4):
            model(pixel_values=torch.randn(batch, 3, 8, 8)).sum().backward()
            opt.step()
            opt.zero_grad()


def _conv_flops(batch: int, c_in: int, c_out: int) -> int:
    return 2 * batch * c_out * c_in * 3 * 3 * 8 * 8  # a multiply and an add per weight per output pixel


def test_a_diff_of_two_batch_sizes_names_the_kinds_and_compares_their_counters(db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = str(db_path)
    _record_batch(db, "b2", 2)
    _record_batch(db, "b4", 4)
    kinds = ("pixel_values=2x3x8x8", "pixel_values=4x3x8x8")

    table = run_cli("diff", "b2", "b4", "--db", db, "--fail-on", "counters")
    assert any("share no kind" in n and kinds[0] in n and kinds[1] in n for n in table.err.splitlines()), table.err
    assert table.code == 1, table  # twice the batch is twice the work: not "no changes found"
    line = next(x for x in table.out.splitlines() if "share no step kind" in x)
    assert f"base {kinds[0]}: 4; cand {kinds[1]}: 4" in line, line
    assert "no changes found" not in table.out

    doc = json.loads(run_cli("diff", "b2", "b4", "--db", db, "--fail-on", "counters", "--format", "json").out)
    assert [k["kind"] for k in doc["base"]["step_kinds"]] == [kinds[0]]
    assert [k["kind"] for k in doc["cand"]["step_kinds"]] == [kinds[1]]
    assert doc["summary"]["counter_changes"] == len(doc["counters"]) > 0
    assert {c["kind"] for c in doc["counters"]} == {f"{kinds[0]} -> {kinds[1]}"}
    flops = {c["fqn"]: (c["base"], c["cand"]) for c in doc["counters"]
             if c["counter"] == "flops" and c["phase"] == "forward"}
    assert flops == {"ConvNet.convs.0": (_conv_flops(2, 3, 8), _conv_flops(4, 3, 8)),
                     "ConvNet.convs.2": (_conv_flops(2, 8, 8), _conv_flops(4, 8, 8))}
    assert doc["summary"]["structure_changes"] == 0  # the same modules, called as often: compared all the same

    # against a history of base runs the candidate's counters are compared kind against kind too
    _record_batch(db, "b2 again", 2)
    history = run_cli("diff", "b2", "b2 again", "b4", "--db", db, "--fail-on", "counters", "--format", "json")
    assert history.code == 1, history
    assert json.loads(history.out)["summary"]["counter_changes"] == doc["summary"]["counter_changes"]

    # runs of one kind keep comparing like with like: nothing changed, and nothing is said of kinds
    same = run_cli("diff", "b2", "b2 again", "--db", db, "--fail-on", "counters")
    assert same.code == 0, same
    assert "share no step kind" not in same.out and "0 work counter changes" in same.out


def test_tree_and_check_of_a_run_that_failed_before_any_module_call_say_it_failed(  # type: ignore[no-untyped-def]
        tmp_path: Path, db_path: Path, run_cli, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text('raise RuntimeError("no such data directory: ./data")\n')
    assert run_cli("record", "--run", "broke", "-q", "train.py").code == 1

    tree = run_cli("tree", "broke")
    assert tree.code == 0, tree
    assert tree.out == ("run broke: no module calls to show "
                        "(the run failed: RuntimeError: no such data directory: ./data)\n")
    check = run_cli("check", "broke")
    assert check.code == 0, check
    assert check.out == "run broke: no nesting issues (the run failed: RuntimeError: no such data directory: ./data)\n"


def test_tree_and_check_of_a_killed_or_still_running_run_say_so(db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    store = open_store(str(db_path), create=True)
    try:
        # a run whose process was killed before it wrote an event, and one recording in this process
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        killed, _ = create_run(store, "killed", {})
        add_rank(store, killed, 0, wall_anchor_ns=0)
        running, _ = create_run(store, "running", {})
        add_rank(store, running, 0, wall_anchor_ns=0)  # pid: this live process
        with store.engine.begin() as conn:
            conn.execute(sa.update(run_ranks).where(run_ranks.c.run_id == killed).values(pid=gone.pid))
    finally:
        store.dispose()

    killed_text = "(the run is incomplete: its process is gone without finishing it (killed?))"
    assert run_cli("tree", "killed").out == f"run killed: no module calls to show {killed_text}\n"
    assert run_cli("check", "killed").out == f"run killed: no nesting issues {killed_text}\n"
    assert run_cli("tree", "running").out == "run running: no module calls to show (the run is still recording)\n"
    assert run_cli("check", "running").out == "run running: no nesting issues (the run is still recording)\n"
