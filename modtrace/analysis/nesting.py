"""Check: the nesting issues of a run, as a frame with one row per issue.

The issues frame (``ISSUE_FRAME_COLUMNS``) has::

    run_id Int32, rank Int32, seq Int64 (the row the issue is about),
    kind String, severity String (error | warning | info),
    fqn String, phase Enum(forward|backward|recompute|backward_call), call_id Int64,
    step Int32, thread_id Int32, message String

Kinds (``modtrace.core.contracts.ISSUE_KINDS``, with their severity):

- ``no_enter`` error: an exit with no open enter of its call (warning when
  the recorder itself marked the exit ``no_enter``);
- ``unclosed`` error: an enter never exited (warning when the run did not
  finish: a crash or kill leaves calls open);
- ``crossed`` error: an exit of an open call that is not the innermost one;
- ``reentered`` error: an enter of a call that is still open;
- ``duplicate_enter`` / ``duplicate_exit`` error: a call entered or exited
  again after it closed;
- ``error_exit`` info: the forward raised;
- ``early_stop`` info: a checkpoint recompute stopped once it had what it
  needed;
- ``closed_at_end_of_backward`` info: no hook signalled the backward exit
  (the module's inputs need no grad); closed when the graph task ended;
- ``unlinked_recompute`` warning: a checkpoint recompute the recorder could
  not link to its forward call (status ``unlinked`` on its enter row: the
  forward ran before the recording started, or no hook saw it); its spans
  have a call id of their own;
- ``compiled`` info: a forward of a module that ran compiled (torch.compile,
  ``modules.compiled``) and has submodules: the calls inside it are not
  recorded (``modtrace record --eager`` records them).  Not reported for a
  forward with child spans of status ``attributed``: the recorder gave its
  inner calls their time from the compiled kernels.

Rows analysis cannot use (``invalid_row``, ``time_reversed``, ``seq_gap``)
are found before this step, by ``modtrace.analysis.validate``.

A healthy record has no error or warning issue.
"""

from __future__ import annotations

import polars as pl

from modtrace.analysis.events import ENTER, EXIT, MODULE_SCHEMA, PHASE_ENUM, conform, decode
from modtrace.analysis.spans import Pairing
from modtrace.core.codes import Status
from modtrace.core.contracts import (
    CLOSED_AT_END_OF_BACKWARD,
    COMPILED,
    EARLY_STOP,
    ERROR_EXIT,
    ISSUE_FRAME,
    ISSUE_KINDS,
    ISSUE_SUMMARY_FRAME,
    UNLINKED_RECOMPUTE,
)

ISSUE_FRAME_COLUMNS: tuple[str, ...] = ISSUE_FRAME.names
ISSUE_SCHEMA: dict[str, pl.DataType] = ISSUE_FRAME.polars()

_STATUS_KINDS: dict[int, str] = {
    int(Status.ERROR): ERROR_EXIT,
    int(Status.EARLY_STOP): EARLY_STOP,
    int(Status.CLOSED_AT_END_OF_BACKWARD): CLOSED_AT_END_OF_BACKWARD,
}


def empty_issues() -> pl.DataFrame:
    return pl.DataFrame(schema=ISSUE_SCHEMA)


def _phase_name(code: int | None) -> str:
    return PHASE_ENUM.categories[code] if code is not None else "?"


def _message(row: dict[str, object], fqn_of: dict[tuple[int, int], str], complete: bool) -> tuple[str, str]:
    """(severity, message) for one structural issue."""
    kind = str(row["kind"])
    rank = int(row["rank"])  # type: ignore[call-overload]
    fqn = row["fqn"] or f"module {row['module_id']}"
    phase = _phase_name(row["phase"])  # type: ignore[arg-type]
    seq, step = row["seq"], row["step"]
    other, other_exit = row["other"], row["other_exit"]
    severity = ISSUE_KINDS[kind]
    if kind == "unclosed":
        msg = f"{fqn} {phase} call entered at seq {seq} (step {step}) was never exited"
        if not complete:
            severity = "warning"
            msg += "; the run did not finish"
    elif kind == "no_enter":
        msg = f"{fqn} {phase} exit at seq {seq} (step {step}) has no matching enter"
        if row["status"] == Status.NO_ENTER:
            severity = "warning"
            msg += " (the recorder marked it so)"
    elif kind == "crossed":
        other_fqn = fqn_of.get((rank, int(row["other_module"])), "?") if row["other_module"] is not None else "?"  # type: ignore[call-overload]
        msg = (
            f"{fqn} {phase} exit at seq {seq} (step {step}) does not match the innermost open call "
            f"{other_fqn} (entered at seq {other})"
        )
    elif kind == "reentered":
        msg = f"{fqn} {phase} entered again at seq {seq} (step {step}) while the same call, entered at seq {other}, is still open"
    elif kind == "duplicate_enter":
        msg = f"{fqn} {phase} entered again at seq {seq} (step {step}) for a call that already ran (seq {other} to {other_exit})"
    elif kind == "duplicate_exit":
        msg = f"{fqn} {phase} exited again at seq {seq} (step {step}) for a call already closed at seq {other_exit}"
    else:  # pragma: no cover - the walk reports only the kinds above
        msg = f"{fqn} {phase}: {kind} at seq {seq}"
    return severity, msg


def collect_issues(
    events: pl.DataFrame, pairing: Pairing, modules: pl.DataFrame, *, complete: bool = True
) -> pl.DataFrame:
    """Normalised event frame and its pairing -> issues frame (``ISSUE_FRAME_COLUMNS``), by (rank, seq, kind).

    ``complete`` says the run finished normally; when it did not, calls
    left open are warnings (the trace of the crash), not errors.
    """
    names = conform(modules, MODULE_SCHEMA).select("rank", "module_id", "fqn")
    run_id = events["run_id"][0] if events.height else None
    row_info = events.select("rank", "seq", "step", "thread_id")

    parts: list[pl.DataFrame] = []
    raw = pairing.issues
    if raw.height:
        fqn_of = {(r, m): f for r, m, f in names.iter_rows()}
        joined = raw.join(row_info, on=["rank", "seq"], how="left").join(
            names, on=["rank", "module_id"], how="left"
        )
        rows = []
        for row in joined.iter_rows(named=True):
            severity, msg = _message(row, fqn_of, complete)
            rows.append((row["rank"], row["seq"], row["kind"], severity, row["fqn"], row["phase"],
                         row["call_id"], row["step"], row["thread_id"], msg))
        parts.append(
            pl.DataFrame(
                rows,
                schema={"rank": pl.Int32(), "seq": pl.Int64(), "kind": pl.String(), "severity": pl.String(),
                        "fqn": pl.String(), "phase": pl.Int8(), "call_id": pl.Int64(), "step": pl.Int32(),
                        "thread_id": pl.Int32(), "message": pl.String()},
                orient="row",
            )
        )

    parts += _row_issues(events, modules, names, pairing.pairs)
    if not parts:
        return empty_issues()
    issues = pl.concat(parts, how="vertical_relaxed").with_columns(
        pl.lit(run_id, dtype=pl.Int32).alias("run_id"),
        decode(pl.col("phase"), PHASE_ENUM).alias("phase"),
    )
    return issues.select(ISSUE_FRAME_COLUMNS).cast(ISSUE_SCHEMA).sort("rank", "seq", "kind")  # type: ignore[arg-type]


def _row_issues(
    events: pl.DataFrame, modules: pl.DataFrame, names: pl.DataFrame, pairs: pl.DataFrame
) -> list[pl.DataFrame]:
    """Issues one event row tells by itself: an exit's unusual status, an
    unlinked recompute's enter, a forward enter of a compiled module that
    hides its inner calls (one whose inner calls were attributed from its
    kernels, spans of status attributed in ``pairs``, hides nothing)."""
    mods = conform(modules, MODULE_SCHEMA)
    owners = mods.select("rank", pl.col("parent_module_id").alias("module_id")).drop_nulls().unique()
    hiding = mods.filter(pl.col("compiled") == 1).join(owners, on=["rank", "module_id"], how="semi")
    is_enter = pl.col("kind") == ENTER
    flagged = events.filter(
        ((pl.col("kind") == EXIT) & pl.col("status").is_in(list(_STATUS_KINDS)))
        | (is_enter & (pl.col("status") == Status.UNLINKED))
    )
    if hiding.height:
        detailed = pairs.filter(pl.col("status") == Status.ATTRIBUTED).select(
            "rank", pl.col("parent_span_id").alias("seq")).drop_nulls().unique()
        compiled = events.join(hiding.select("rank", "module_id"), on=["rank", "module_id"], how="semi").filter(
            is_enter & (pl.col("phase") == 0)).join(detailed, on=["rank", "seq"], how="anti")
        flagged = pl.concat([flagged, compiled.with_columns(pl.lit(-1, dtype=flagged.schema["status"]).alias("status"))])
    if not flagged.height:
        return []
    kinds = {**_STATUS_KINDS, int(Status.UNLINKED): UNLINKED_RECOMPUTE, -1: COMPILED}
    kind = pl.col("status").replace_strict(kinds, return_dtype=pl.String)
    where = pl.format("at seq {} (step {})", pl.col("seq"), pl.col("step"))
    message = (
        pl.when(pl.col("status") == -1)
        .then(pl.format("{} forward {} ran compiled (torch.compile): the module calls inside it are not recorded;"
                        " `modtrace record --eager` records them", pl.col("fqn"), where))
        .when(pl.col("status") == Status.UNLINKED)
        .then(pl.format("{} recompute {} could not be linked to its forward call (none was recorded: it ran before"
                        " the recording started, or no hook saw it); its spans have a call id of their own",
                        pl.col("fqn"), where))
        .when(pl.col("status") == Status.ERROR)
        .then(pl.format("{} forward raised an exception; exit {}", pl.col("fqn"), where))
        .when(pl.col("status") == Status.EARLY_STOP)
        .then(pl.format("{} recompute stopped early {}: checkpoint had recomputed what backward needed", pl.col("fqn"), where))
        .otherwise(pl.format("{} backward closed at the end of the backward pass {}: no gradient hook signalled its exit", pl.col("fqn"), where))
    )
    return [
        flagged.join(names, on=["rank", "module_id"], how="left")
        .with_columns(pl.col("fqn").fill_null(pl.format("module {}", pl.col("module_id"))), kind.alias("kind"))
        .select(
            "rank", "seq", "kind", pl.col("kind").replace_strict(ISSUE_KINDS, return_dtype=pl.String).alias("severity"),
            "fqn", "phase", "call_id", "step", "thread_id", message.alias("message"),
        )
    ]


SUMMARY_COLUMNS: tuple[str, ...] = ISSUE_SUMMARY_FRAME.names


def summarize_issues(issues: pl.DataFrame) -> pl.DataFrame:
    """Issues frame -> one row per error or warning, and one row per (kind, fqn,
    phase) of the info issues, in order of first occurrence (rank, seq).

    Columns ``SUMMARY_COLUMNS``: an info row's ``rank``, ``seq``, ``step`` and
    message are its first occurrence's, ``count`` (UInt32) how many rows it
    stands for; the message says so when there are more than one.  Errors and
    warnings keep ``count`` 1 and their own message.
    """
    info = pl.col("severity") == "info"
    full = issues.filter(~info).select(
        "severity", "kind", "rank", "seq", "step", "phase", "fqn", pl.lit(1, dtype=pl.UInt32).alias("count"), "message"
    )
    grouped = (
        issues.filter(info)
        .sort("rank", "seq")
        .group_by("kind", "fqn", "phase", maintain_order=True)
        .agg(
            pl.col("severity").first(), pl.col("rank").first(), pl.col("seq").first(), pl.col("step").first(),
            pl.len().cast(pl.UInt32).alias("count"), pl.col("message").first(), pl.col("step").max().alias("_last"),
        )
        .with_columns(
            pl.when(pl.col("count") > 1)
            .then(pl.format("{} ({} times, steps {} to {})", pl.col("message"), pl.col("count"), pl.col("step"), pl.col("_last")))
            .otherwise(pl.col("message"))
            .alias("message")
        )
        .select(full.columns)
    )
    return pl.concat([full, grouped], how="vertical_relaxed").sort("rank", "seq", "kind").select(SUMMARY_COLUMNS)
