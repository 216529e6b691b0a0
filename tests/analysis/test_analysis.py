"""Rebuild and nesting check on synthetic event streams (hand-written and random)."""

from __future__ import annotations

from typing import Any

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modtrace.analysis import analyze_events, check_nesting, rebuild_spans
from modtrace.analysis.events import normalize_events
from modtrace.analysis.spans import SPAN_COLUMNS, pair_events
from modtrace.analysis.stack import walk_stack
from modtrace.core.codes import Phase, Status
from tests.helpers.analysis_streams import (
    ENTER,
    EXIT,
    _random_run,
    devices,
    ev,
    frame,
    model,
    oracle_spans,
    spans_as_tuples,
    to_rows,
)

F, B, R = int(Phase.FORWARD), int(Phase.BACKWARD), int(Phase.RECOMPUTE)


def _mods() -> Any:
    return model(blocks=2, per_block=2)  # 0 Net, 1 blocks.0, 2 .fc0, 3 .fc1, 4 blocks.1, 5 .fc0, 6 .fc1, 7 head


def _analyze(rows: list[tuple[Any, ...]], *, complete: bool = True) -> Any:
    mods = _mods()
    return analyze_events(frame(rows), mods.frame(), devices(), complete=complete)


def test_forward_spans_have_parents_depths_and_self_time() -> None:
    events = [
        ev(ENTER, 0, F, 1, ts=0), ev(ENTER, 1, F, 2, ts=10), ev(ENTER, 2, F, 3, ts=12), ev(EXIT, 2, F, 3, ts=20),
        ev(ENTER, 3, F, 4, ts=21), ev(EXIT, 3, F, 4, ts=30), ev(EXIT, 1, F, 2, ts=40), ev(ENTER, 7, F, 5, ts=41),
        ev(EXIT, 7, F, 5, ts=50), ev(EXIT, 0, F, 1, ts=100),
    ]
    result = _analyze(to_rows(events))
    spans = result.spans
    assert spans.columns == list(SPAN_COLUMNS)
    got = spans.select("span_id", "parent_span_id", "depth", "fqn", "duration_ns", "self_ns", "status").rows()
    assert got == [
        (0, None, 0, "Net", 100, 100 - 30 - 9, "ok"),
        (1, 0, 1, "Net.blocks.0", 30, 30 - 8 - 9, "ok"),
        (2, 1, 2, "Net.blocks.0.fc0", 8, 8, "ok"),
        (4, 1, 2, "Net.blocks.0.fc1", 9, 9, "ok"),
        (7, 0, 1, "Net.head", 9, 9, "ok"),
    ]
    assert spans["phase"].cast(pl.String).unique().to_list() == ["forward"]
    assert spans["device"].cast(pl.String).unique().to_list() == ["cpu"]
    assert result.issues.height == 0


def test_backward_ties_are_normalised_exits_innermost_then_enters_outermost() -> None:
    # Hook order of one dispatch: ENTER(last child) before ENTER(parent); later
    # EXIT(parent) before EXIT(first child) (they share an input).
    fwd = [ev(ENTER, 1, F, 2), ev(ENTER, 2, F, 3), ev(EXIT, 2, F, 3), ev(ENTER, 3, F, 4), ev(EXIT, 3, F, 4),
           ev(EXIT, 1, F, 2)]
    bwd = [
        {**ev(ENTER, 3, B, 4, graph_task=9, ts=100), "tie": 0},
        {**ev(ENTER, 1, B, 2, graph_task=9, ts=100), "tie": 1},
        {**ev(EXIT, 3, B, 4, graph_task=9, ts=110), "tie": 0},
        {**ev(ENTER, 2, B, 3, graph_task=9, ts=110), "tie": 1},
        {**ev(EXIT, 1, B, 2, graph_task=9, ts=130), "tie": 0},
        {**ev(EXIT, 2, B, 3, graph_task=9, ts=130), "tie": 1},
    ]
    result = _analyze(to_rows(fwd + bwd))
    back = result.spans.filter(pl.col("phase") == "backward")
    assert back.select("fqn", "parent_span_id", "depth", "start_ns", "end_ns").rows() == [
        ("Net.blocks.0", None, 0, 100, 130),
        ("Net.blocks.0.fc1", 7, 1, 100, 110),
        ("Net.blocks.0.fc0", 7, 1, 110, 130),
    ]
    assert result.issues.height == 0


def test_recompute_nests_under_the_backward_span_open_on_its_thread() -> None:
    fwd = [ev(ENTER, 1, F, 2), ev(ENTER, 2, F, 3), ev(EXIT, 2, F, 3), ev(EXIT, 1, F, 2)]
    bwd = [
        ev(ENTER, 1, B, 2, graph_task=5), ev(ENTER, 1, R, 2, graph_task=5), ev(ENTER, 2, R, 3, graph_task=5),
        ev(EXIT, 2, R, 3, graph_task=5), ev(EXIT, 1, R, 2, graph_task=5, status=Status.EARLY_STOP),
        ev(ENTER, 2, B, 3, graph_task=5), ev(EXIT, 2, B, 3, graph_task=5), ev(EXIT, 1, B, 2, graph_task=5),
    ]
    result = _analyze(to_rows(fwd + bwd))
    spans = result.spans.select("span_id", "parent_span_id", "depth", "phase", "call_id", "status")
    assert spans.rows() == [
        (0, None, 0, "forward", 2, "ok"),
        (1, 0, 1, "forward", 3, "ok"),
        (4, None, 0, "backward", 2, "ok"),
        (5, 4, 1, "recompute", 2, "early_stop"),
        (6, 5, 2, "recompute", 3, "ok"),
        (9, 4, 1, "backward", 3, "ok"),
    ]
    issues = result.issues
    assert issues.select("kind", "severity", "seq", "fqn").rows() == [("early_stop", "info", 8, "Net.blocks.0")]
    assert "Net.blocks.0 recompute stopped early at seq 8 (step 0)" in issues["message"][0]


def test_threads_and_graph_tasks_have_their_own_stacks() -> None:
    # Two threads interleave forward calls; two graph tasks on one thread interleave backward.
    rows = to_rows([
        ev(ENTER, 1, F, 2, thread=0), ev(ENTER, 4, F, 5, thread=1), ev(ENTER, 2, F, 3, thread=0),
        ev(EXIT, 4, F, 5, thread=1), ev(EXIT, 2, F, 3, thread=0), ev(EXIT, 1, F, 2, thread=0),
        ev(ENTER, 1, B, 2, graph_task=1), ev(ENTER, 4, B, 5, graph_task=2), ev(EXIT, 1, B, 2, graph_task=1),
        ev(EXIT, 4, B, 5, graph_task=2),
    ])
    result = _analyze(rows)
    assert result.spans.select("span_id", "parent_span_id", "depth", "thread_id").rows() == [
        (0, None, 0, 0), (1, None, 0, 1), (2, 0, 1, 0), (6, None, 0, 0), (7, None, 0, 0),
    ]
    assert result.issues.height == 0


def test_status_issues_are_info_and_name_the_module() -> None:
    rows = to_rows([
        ev(ENTER, 0, F, 1), ev(ENTER, 7, F, 2), ev(EXIT, 7, F, 2, status=Status.ERROR), ev(EXIT, 0, F, 1, status=Status.ERROR),
        ev(ENTER, 0, B, 1, graph_task=3), ev(EXIT, 0, B, 1, graph_task=3, status=Status.CLOSED_AT_END_OF_BACKWARD),
    ])
    issues = _analyze(rows).issues
    assert issues.select("seq", "kind", "severity", "fqn", "phase").rows() == [
        (2, "error_exit", "info", "Net.head", "forward"),
        (3, "error_exit", "info", "Net", "forward"),
        (5, "closed_at_end_of_backward", "info", "Net", "backward"),
    ]
    assert issues["message"].to_list() == [
        "Net.head forward raised an exception; exit at seq 2 (step 0)",
        "Net forward raised an exception; exit at seq 3 (step 0)",
        "Net backward closed at the end of the backward pass at seq 5 (step 0): no gradient hook signalled its exit",
    ]


def _simple_forward() -> list[tuple[Any, ...]]:
    # 0 E Net, 1 E blocks.0, 2 E fc0, 3 X fc0, 4 E fc1, 5 X fc1, 6 X blocks.0, 7 X Net
    return to_rows([ev(ENTER, 0, F, 1), ev(ENTER, 1, F, 2), ev(ENTER, 2, F, 3), ev(EXIT, 2, F, 3),
                    ev(ENTER, 3, F, 4), ev(EXIT, 3, F, 4), ev(EXIT, 1, F, 2), ev(EXIT, 0, F, 1)])


def _drop(rows: list[tuple[Any, ...]], seq: int) -> list[tuple[Any, ...]]:
    return [r for r in rows if r[0] != seq]


def _structural(issues: pl.DataFrame) -> pl.DataFrame:
    """The issues of the nesting walk, without validate's seq_gap / time_reversed about the same edit."""
    from modtrace.analysis.validate import VALIDATION_KINDS

    return issues.filter(~pl.col("kind").is_in(list(VALIDATION_KINDS)))


def _issues(rows: list[tuple[Any, ...]], **kw: Any) -> list[tuple[Any, ...]]:
    return _structural(_analyze(rows, **kw).issues).select("seq", "kind", "severity", "fqn").rows()


def test_dropped_exit_is_reported_where_it_shows() -> None:
    result = _analyze(_drop(_simple_forward(), 3))  # fc0's exit lost: fc1 nests in it, blocks.0 exits over it
    gap = result.issues.filter(pl.col("kind") == "seq_gap")
    assert gap.select("seq", "severity", "message").rows() == [(4, "warning", "seq 3 to 3 missing before the row at seq 4")]
    issues = _structural(result.issues)
    assert issues.select("seq", "kind", "severity", "fqn").rows() == [
        (2, "unclosed", "error", "Net.blocks.0.fc0"),
        (6, "crossed", "error", "Net.blocks.0"),
    ]
    assert issues["message"][1] == (
        "Net.blocks.0 forward exit at seq 6 (step 0) does not match the innermost open call "
        "Net.blocks.0.fc0 (entered at seq 2)"
    )
    spans = result.spans.select("span_id", "parent_span_id", "depth", "exit_seq").rows()
    assert spans == [(0, None, 0, 7), (1, 0, 1, 6), (2, 1, 2, None), (4, 2, 3, 5)]


def test_dropped_inner_exit_names_both_calls() -> None:
    rows = _drop(_simple_forward(), 5)  # fc1's exit lost: blocks.0 exits over it
    issues = _structural(_analyze(rows).issues)
    assert issues.select("seq", "kind").rows() == [(4, "unclosed"), (6, "crossed")]
    assert issues["message"].to_list() == [
        "Net.blocks.0.fc1 forward call entered at seq 4 (step 0) was never exited",
        "Net.blocks.0 forward exit at seq 6 (step 0) does not match the innermost open call "
        "Net.blocks.0.fc1 (entered at seq 4)",
    ]


def test_dropped_enter_is_no_enter() -> None:
    assert _issues(_drop(_simple_forward(), 2)) == [(3, "no_enter", "error", "Net.blocks.0.fc0")]


def test_duplicated_rows_are_reentered_or_duplicate() -> None:
    rows = _simple_forward()
    dup_enter = rows[:3] + [(*rows[2][:1], *rows[2][1:])] + rows[3:]
    renum = [(k, *r[1:]) for k, r in enumerate(dup_enter)]
    assert _issues(renum) == [(3, "reentered", "error", "Net.blocks.0.fc0")]
    dup_exit = rows[:4] + [rows[3]] + rows[4:]
    renum = [(k, *r[1:]) for k, r in enumerate(dup_exit)]
    assert _issues(renum) == [(4, "duplicate_exit", "error", "Net.blocks.0.fc0")]
    replay = rows[:4] + rows[2:4] + rows[4:]
    renum = [(k, *r[1:]) for k, r in enumerate(replay)]
    assert _issues(renum) == [(4, "duplicate_enter", "error", "Net.blocks.0.fc0"), (5, "duplicate_exit", "error", "Net.blocks.0.fc0")]


def test_swapped_exits_are_crossed() -> None:
    rows = _simple_forward()
    swapped = rows[:6] + [(6, *rows[7][1:]), (7, *rows[6][1:])]
    issues = _structural(_analyze(swapped).issues)
    assert issues.select("seq", "kind").rows() == [(6, "crossed")]
    assert issues["message"][0] == (
        "Net forward exit at seq 6 (step 0) does not match the innermost open call Net.blocks.0 (entered at seq 1)"
    )


def test_crash_mid_step_leaves_warnings_when_the_run_did_not_finish() -> None:
    rows = _simple_forward()[:5]
    assert _issues(rows, complete=False) == [
        (0, "unclosed", "warning", "Net"), (1, "unclosed", "warning", "Net.blocks.0"),
        (4, "unclosed", "warning", "Net.blocks.0.fc1"),
    ]
    assert [k for _, k, s, _ in _issues(rows)] == ["unclosed"] * 3
    spans = _analyze(rows).spans
    assert spans.filter(pl.col("end_ns").is_null())["span_id"].to_list() == [0, 1, 4]
    assert spans.filter(pl.col("span_id") == 2)["duration_ns"].to_list() == [10]


def test_exit_marked_no_enter_by_the_recorder_is_a_warning() -> None:
    rows = to_rows([ev(EXIT, 7, F, 9, status=Status.NO_ENTER), ev(ENTER, 0, F, 1), ev(EXIT, 0, F, 1)])
    assert _issues(rows) == [(0, "no_enter", "warning", "Net.head")]


def test_empty_stream() -> None:
    result = _analyze([])
    assert result.spans.height == 0 and result.issues.height == 0
    assert result.spans.columns == list(SPAN_COLUMNS)


# ---------------------------------------------------------------- properties




@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 3), threads=st.integers(1, 3), recompute=st.booleans())
def test_random_well_nested_streams_equal_the_stack_oracle(seed: int, steps: int, threads: int, recompute: bool) -> None:
    events, mods = _random_run(seed, steps, threads, recompute)
    result = analyze_events(events, mods.frame(), devices())
    assert spans_as_tuples(result.spans) == oracle_spans(events, mods.frame())
    bad = result.issues.filter(pl.col("severity") != "info")
    assert bad.height == 0, bad["message"].to_list()


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 2), threads=st.integers(1, 2))
def test_the_checked_walk_agrees_with_the_vectorised_rebuild_on_clean_stacks(seed: int, steps: int, threads: int) -> None:
    events, mods = _random_run(seed, steps, threads, True)
    norm = normalize_events(events, mods.frame())
    pairs = pair_events(norm).pairs
    expected = sorted(pairs.select("rank", "span_id", "exit_seq", "parent_span_id", "depth").rows())
    walked = []
    for (rank, _), part in norm.group_by("rank", "stack", maintain_order=True):
        res = walk_stack(part.select("seq", "kind", "module_id", "phase", "call_id", "status").iter_rows())
        assert res.issues == []
        walked += [(rank, s, e, p, d) for s, e, p, d in res.spans]
    assert sorted(walked) == expected


CORRUPTIONS = ("drop", "duplicate", "swap", "truncate")


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), how=st.sampled_from(CORRUPTIONS), where=st.floats(0, 1))
def test_corrupted_streams_are_flagged_and_never_crash(seed: int, how: str, where: float) -> None:
    events, mods = _random_run(seed, 2, 2, True)
    rows = events.sort("seq").rows(named=True)
    i = min(int(where * len(rows)), len(rows) - 1)
    victim = rows[i]
    if how == "drop":
        rows = rows[:i] + rows[i + 1:]
    elif how == "duplicate":
        rows = rows[: i + 1] + [dict(victim)] + rows[i + 1:]
    elif how == "swap":
        j = min(i + 1, len(rows) - 1)
        rows[i], rows[j] = rows[j], rows[i]
    else:
        # A crash stops between hook dispatches: cut before a row that starts one.
        while i < len(rows) and rows[i]["tie"] == 1:
            i += 1
        rows = rows[:i]
    for k, r in enumerate(rows):
        r["seq"] = k
    corrupted = pl.DataFrame(rows, schema=events.schema)
    result = analyze_events(corrupted, mods.frame(), devices(), complete=how != "truncate")
    issues = result.issues
    assert set(issues["severity"].unique().to_list()) <= {"error", "warning", "info"}
    assert issues.select("rank", "seq", "kind").is_duplicated().sum() == 0
    serious = issues.filter(pl.col("severity") != "info")
    if how == "truncate":
        # A crash leaves only calls open: warnings, no errors, one per open call.
        assert set(serious["severity"].to_list()) <= {"warning"}
        assert set(serious["kind"].to_list()) <= {"unclosed"}
        assert serious.height == result.spans.filter(pl.col("end_ns").is_null()).height
    elif how in ("drop", "duplicate"):
        # Every lost or repeated row of a call is reported, naming that call.
        assert serious.height >= 1
        calls = set(serious["call_id"].to_list())
        assert victim["call_id"] in calls, (how, victim, serious["message"].to_list())
        assert set(serious["severity"].to_list()) == {"error"} or victim["status"] == Status.NO_ENTER
    else:
        # A swap either leaves the stream well nested (e.g. two threads' rows,
        # or rows of one tie) or is flagged; the rebuild still covers every enter.
        pass
    n_enter = corrupted.filter(pl.col("kind") == ENTER).height
    assert result.spans.height <= n_enter
    assert result.spans["span_id"].is_duplicated().sum() == 0 or result.spans.select("rank", "span_id").is_duplicated().sum() == 0


def test_rebuild_and_check_entry_points_agree_with_analyze() -> None:
    events, mods = _random_run(7, 2, 2, True)
    both = analyze_events(events, mods.frame(), devices())
    assert rebuild_spans(events, mods.frame(), devices()).equals(both.spans)
    assert check_nesting(events, mods.frame()).equals(both.issues)


def test_swapped_rows_within_one_thread_are_flagged() -> None:
    # Two rows of one thread swapped across a nesting boundary (not a tie).
    rows = _simple_forward()
    swapped = rows[:2] + [(2, *rows[3][1:]), (3, *rows[2][1:])] + rows[4:]
    kinds = [k for _, k, _, _ in _issues(swapped)]
    assert "no_enter" in kinds and "unclosed" in kinds
