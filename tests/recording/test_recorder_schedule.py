"""A recording schedule: off steps install no module hook, warm-up steps
write nothing, recorded steps are written whole and keep their numbers; the
run says which steps it recorded (runs, show), and the CLI takes
``--schedule``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest
import torch
import torch.nn.modules.module as module_hooks
import torch.optim.optimizer as optimizer_hooks
from torch import nn

import modtrace
from modtrace.analysis.step_time import step_table
from modtrace.core.errors import UsageError
from modtrace.recording.schedule import StepAction
from tests.helpers.database import db_rows
from tests.helpers.models import tiny_model_and_opt, train_step


def module_hook_count() -> int:
    return len(module_hooks._global_forward_pre_hooks) + len(module_hooks._global_forward_hooks)


def test_only_active_steps_are_written_whole_with_their_numbers_and_no_seq_gap(db_path: Path) -> None:
    model, opt = tiny_model_and_opt()
    sched = modtrace.schedule(skip_first=1, wait=1, warmup=1, active=2, repeat=2)
    base = module_hook_count()
    hooks_by_step = []
    with modtrace.Recorder(db=str(db_path), run="sched", schedule=sched, handle_sigterm=False) as rec:
        for _ in range(12):
            hooks_by_step.append(module_hook_count() - base)
            train_step(model, opt)
    rec.wait_analyzed()  # the writer process analyses the run after the with
    # off steps: no module hook at all; warm-up and active: the tracker's two
    actions = [sched.action(s) for s in range(12)]
    assert hooks_by_step == [0 if a is StepAction.OFF else 2 for a in actions]
    per_step = db_rows(db_path, "SELECT step, count(*) FROM events GROUP BY step ORDER BY step")
    assert [s for s, _ in per_step] == sched.recorded_steps(12) == [3, 4, 7, 8]
    assert len({n for _, n in per_step}) == 1  # every recorded step whole: same calls each
    seqs = [r[0] for r in db_rows(db_path, "SELECT seq FROM events ORDER BY seq")]
    assert seqs == list(range(len(seqs)))  # warm-up events were numbered again, not skipped
    assert db_rows(db_path, "SELECT schedule FROM runs") == [(sched.text(),)]
    assert db_rows(db_path, "SELECT recorded_steps, step_count, event_count FROM run_ranks") == [
        ("3-4,7-8", 12, len(seqs))]
    # the analysis sees only recorded steps and finds nothing wrong with the stream
    kinds = {r[0] for r in db_rows(db_path, "SELECT kind FROM nesting_issues")}
    assert not kinds & {"seq_gap", "no_enter", "unclosed", "crossed", "invalid_row"}
    assert rec.status == "completed"


def test_off_steps_keep_counting_steps_and_warmup_writes_nothing(db_path: Path) -> None:
    model, opt = tiny_model_and_opt()
    sched = modtrace.schedule(wait=2, warmup=2, active=1, repeat=1)
    with modtrace.Recorder(db=str(db_path), run="w", schedule=sched, handle_sigterm=False, analyze=False) as rec:
        for _ in range(8):
            train_step(model, opt)
        assert len(optimizer_hooks._global_optimizer_post_hooks) >= 1
    assert rec.step_count == 8
    assert db_rows(db_path, "SELECT DISTINCT step FROM events") == [(4,)]
    # modules first seen in a warm-up step are named all the same
    assert {r[0] for r in db_rows(db_path, "SELECT fqn FROM modules")} >= {"Sequential", "Sequential.0", "Sequential.2"}
    assert db_rows(db_path, "SELECT count(*) FROM root_calls") == [(1,)]


def test_a_schedule_that_never_reaches_an_active_step_records_no_event(db_path: Path) -> None:
    model, opt = tiny_model_and_opt()
    with modtrace.Recorder(db=str(db_path), run="none", schedule="skip_first=50,active=1", handle_sigterm=False) as _rec:
        for _ in range(3):
            train_step(model, opt)
    _rec.wait_analyzed()  # the writer process analyses the run after the with
    assert db_rows(db_path, "SELECT count(*) FROM events") == [(0,)]
    assert db_rows(db_path, "SELECT recorded_steps, step_count FROM run_ranks") == [("", 3)]


def test_manual_steps_follow_the_schedule(db_path: Path) -> None:
    model = nn.Linear(3, 3)
    with modtrace.Recorder(db=str(db_path), run="m", schedule=modtrace.schedule(active=1, wait=1),
                           step_on="manual", handle_sigterm=False, analyze=False) as rec:
        for _ in range(6):
            model(torch.ones(1, 3))
            rec.step()
    assert [r[0] for r in db_rows(db_path, "SELECT DISTINCT step FROM events ORDER BY step")] == [1, 3, 5]


def test_a_schedule_needs_counted_steps_not_root_calls(db_path: Path) -> None:
    with pytest.raises(UsageError, match="not root"):
        modtrace.Recorder(db=str(db_path), schedule="active=1", step_on="root")
    with pytest.raises(UsageError, match="bad schedule"):
        modtrace.Recorder(db=str(db_path), schedule="active=x")
    assert not db_path.exists()


def test_runs_and_show_say_which_steps_were_recorded(db_path: Path, run_cli: Any) -> None:
    model, opt = tiny_model_and_opt()
    with modtrace.Recorder(db=str(db_path), run="part", schedule="wait=1,active=2,repeat=2", handle_sigterm=False,
                           analyze=False):
        for _ in range(7):
            train_step(model, opt)
    with modtrace.Recorder(db=str(db_path), run="whole", handle_sigterm=False, analyze=False):
        train_step(model, opt)
    listing = run_cli("runs").out
    assert "7 (recorded 1-2,4-5)" in listing
    assert "recorded" not in next(line for line in listing.splitlines() if " whole " in line)
    shown = run_cli("show", "part").out
    assert "recorded_steps" in shown and "1-2,4-5" in shown
    assert "wait=1,warmup=0,active=2,repeat=2" in shown


def test_record_cli_takes_a_schedule(tmp_path: Path, db_path: Path, run_cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\nfrom torch import nn\n"
        "m = nn.Linear(2, 1)\nopt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(10):\n    m(torch.ones(1, 2)).sum().backward(); opt.step(); opt.zero_grad()\n"
    )
    monkeypatch.chdir(tmp_path)
    res = run_cli("record", "-q", "--run", "s", "--schedule", "skip_first=2,wait=1,warmup=1,active=2,repeat=2",
                  str(script))
    assert res.code == 0, res
    assert [r[0] for r in db_rows(db_path, "SELECT DISTINCT step FROM events ORDER BY step")] == [4, 5, 8, 9]
    assert db_rows(db_path, "SELECT recorded_steps FROM run_ranks") == [("4-5,8-9",)]


@pytest.mark.parametrize("text", ["active=0", "wait=2", "active=1,bogus=3", "active=-1", "active=1,active=2", "x"])
def test_bad_schedule_text_is_one_line_exit_2_and_creates_nothing(tmp_path: Path, db_path: Path, run_cli: Any,
                                                                  text: str) -> None:
    script = tmp_path / "t.py"
    script.write_text("print('ran')\n")
    res = run_cli("record", "--schedule", text, str(script))
    assert res.code == 2
    assert res.err.count("\n") == 1 and "schedule" in res.err and "Traceback" not in res.err
    assert "ran" not in res.out
    assert not db_path.exists()


def test_schedule_with_step_on_root_is_a_usage_error(tmp_path: Path, db_path: Path, run_cli: Any) -> None:
    script = tmp_path / "t.py"
    script.write_text("print('ran')\n")
    res = run_cli("record", "--schedule", "active=1", "--step-on", "root", str(script))
    assert res.code == 2 and "not root" in res.err and not db_path.exists()


def test_diff_of_two_schedules_without_a_common_step_says_so(db_path: Path, run_cli: Any) -> None:
    model, opt = tiny_model_and_opt()
    for name, sched in (("early", "active=3,repeat=1"), ("late", "skip_first=3,active=3,repeat=1"),
                        ("overlap", "skip_first=2,active=3,repeat=1")):
        with modtrace.Recorder(db=str(db_path), run=name, schedule=sched, handle_sigterm=False) as _rec:
            for _ in range(6):
                train_step(model, opt)
        _rec.wait_analyzed()  # the writer process analyses the run after the with
    res = run_cli("diff", "early", "late", "--skip-steps", "0")
    notes = [line for line in res.err.splitlines() if "no recorded step in common" in line]
    assert len(notes) == 1 and "0-2" in notes[0] and "3-5" in notes[0]
    res = run_cli("diff", "early", "overlap", "--skip-steps", "0")
    assert "no recorded step in common" not in res.err


def test_wall_time_of_a_step_before_an_unrecorded_one_ends_at_its_own_last_span() -> None:
    spans = pl.DataFrame({
        "rank": [0, 0, 0], "step": [3, 4, 9], "depth": [0, 0, 0], "phase": [0, 0, 0],
        "start_ns": [0, 100, 1000], "end_ns": [50, 150, 1040], "duration_ns": [50, 50, 40], "self_ns": [50, 50, 40],
    }).with_columns(pl.col("phase").cast(pl.Int8))
    table = step_table(spans)
    assert table["wall_ns"].to_list() == [100, 50, 40]  # step 3 runs to step 4; step 4 is not followed by 5

