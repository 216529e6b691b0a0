"""Every row and frame contract of modtrace, and the lists of code names.

One definition each, imported by everything that builds, writes, reads or
analyses rows: the tracker's event tuples, the store's tables and readers,
the analysis frames, the renderers' phase and status lists.  A test ties the
tracker, the writer, the schema and the analysis to what is written here.

A ``Contract`` is an ordered list of (column, dtype name).  The dtype names
are polars' (``Int32``, ``String``...) plus ``Phase`` and ``Status`` (the
code names as a polars Enum); ``Contract.polars()`` turns them into a polars
schema.  This module imports nothing heavy, so the recording path can use it
without polars.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

from modtrace.core.codes import Kind, Phase, Status

if TYPE_CHECKING:
    import polars as pl

# Code names, in code order (index = the stored integer).
KINDS: tuple[str, ...] = tuple(k.name.lower() for k in Kind)
PHASES: tuple[str, ...] = tuple(p.name.lower() for p in Phase)
STATUSES: tuple[str, ...] = tuple(s.name.lower() for s in Status)

# runs.status and run_ranks.status.
RUN_STATUSES: tuple[str, ...] = ("running", "completed", "failed", "interrupted")

# runs.step_on: what starts a step, as asked of the recorder (modtrace.core.step_rules says what each means).
STEP_RULES: tuple[str, ...] = ("auto", "optimizer", "root", "manual")

# Nesting issue kinds, with their default severity (see analysis/nesting.py for
# when each is reported, and when an error becomes a warning).
NO_ENTER = "no_enter"
UNCLOSED = "unclosed"
CROSSED = "crossed"
REENTERED = "reentered"
DUPLICATE_ENTER = "duplicate_enter"
DUPLICATE_EXIT = "duplicate_exit"
ERROR_EXIT = "error_exit"
EARLY_STOP = "early_stop"
CLOSED_AT_END_OF_BACKWARD = "closed_at_end_of_backward"
# A recompute the tracker could not link to its forward call (status unlinked on its enter row).
UNLINKED_RECOMPUTE = "unlinked_recompute"
# A forward of a module that ran compiled (torch.compile), whose inner module calls are not recorded.
COMPILED = "compiled"
# Rows the analysis cannot use, found before pairing (analysis/validate.py).
INVALID_ROW = "invalid_row"
TIME_REVERSED = "time_reversed"
SEQ_GAP = "seq_gap"
ISSUE_KINDS: dict[str, str] = {
    NO_ENTER: "error",
    UNCLOSED: "error",
    CROSSED: "error",
    REENTERED: "error",
    DUPLICATE_ENTER: "error",
    DUPLICATE_EXIT: "error",
    ERROR_EXIT: "info",
    EARLY_STOP: "info",
    CLOSED_AT_END_OF_BACKWARD: "info",
    UNLINKED_RECOMPUTE: "warning",
    COMPILED: "info",
    INVALID_ROW: "error",
    TIME_REVERSED: "warning",
    SEQ_GAP: "warning",
}
VALIDATION_ISSUE_KINDS: tuple[str, ...] = (INVALID_ROW, TIME_REVERSED, SEQ_GAP)
# Kinds found by walking a stack; the others (but the validation kinds) come from an exit's status.
STRUCTURAL_ISSUE_KINDS: tuple[str, ...] = (NO_ENTER, UNCLOSED, CROSSED, REENTERED, DUPLICATE_ENTER, DUPLICATE_EXIT)
SEVERITIES: tuple[str, ...] = ("error", "warning", "info")


@dataclass(frozen=True)
class Contract:
    """An ordered row or frame contract: column names and their dtype names."""

    name: str
    columns: tuple[tuple[str, str], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(c for c, _ in self.columns)

    def index(self, column: str) -> int:
        return self.names.index(column)

    def dtype(self, column: str) -> str:
        return dict(self.columns)[column]

    def polars(self) -> dict[str, pl.DataType]:
        """The contract as a polars schema (a new dict each call)."""
        return dict(_polars_schema(self))

    def select(self, *names: str, name: str | None = None) -> Contract:
        """The sub-contract of ``names``, in this contract's order."""
        return Contract(name or self.name, tuple(c for c in self.columns if c[0] in names))

    def prefixed(self, name: str, *columns: tuple[str, str]) -> Contract:
        """This contract with ``columns`` before its own."""
        return Contract(name, (*columns, *self.columns))


def _dtype(name: str) -> pl.DataType:
    import polars as pl

    if name == "Phase":
        return pl.Enum(list(PHASES))
    if name == "Status":
        return pl.Enum(list(STATUSES))
    dtype: pl.DataType = getattr(pl, name)()
    return dtype


@cache
def _polars_schema(contract: Contract) -> tuple[tuple[str, pl.DataType], ...]:
    return tuple((c, _dtype(d)) for c, d in contract.columns)


_RUN_RANK = (("run_id", "Int32"), ("rank", "Int32"))

# One event as the tracker appends it and the writer inserts it (the events
# table adds run_id and rank).  Codes: kind (codes.Kind), phase (codes.Phase),
# status (codes.Status).
EVENT_ROW = Contract("event row", (
    ("seq", "Int64"), ("ts_ns", "Int64"), ("kind", "Int8"), ("module_id", "Int32"), ("phase", "Int8"),
    ("call_id", "Int64"), ("step", "Int32"), ("thread_id", "Int32"), ("device_id", "Int32"),
    ("stream", "Int64"), ("status", "Int8"), ("graph_task", "Int64"), ("tie", "Int8"),
))
# The analysis input: a run's events, one row per stored event.
EVENT_FRAME = EVENT_ROW.prefixed("event frame", *_RUN_RANK)

# Lookup rows as the tracker collects them (the tables add run_id and rank),
# and the per-rank lookup frames the analysis takes.  A module row comes again,
# with compiled = 1, once the module is seen running compiled (the store keeps the last).
MODULE_ROW = Contract("module row", (
    ("module_id", "Int32"), ("fqn", "String"), ("module_type", "String"), ("parent_module_id", "Int32"),
    ("compiled", "Int8"),
))
THREAD_ROW = Contract("thread row", (("thread_id", "Int32"), ("ident", "Int64"), ("name", "String")))
DEVICE_ROW = Contract("device row", (("device_id", "Int32"), ("name", "String")))
MODULE_FRAME = MODULE_ROW.prefixed("module frame", ("rank", "Int32"))
THREAD_FRAME = THREAD_ROW.prefixed("thread frame", ("rank", "Int32"))
DEVICE_FRAME = DEVICE_ROW.prefixed("device frame", ("rank", "Int32"))

# The stored form of a span (table span_rows): codes, no names.
SPAN_ROW = Contract("span row", (
    *_RUN_RANK, ("span_id", "Int64"), ("parent_span_id", "Int64"), ("depth", "Int32"), ("module_id", "Int32"),
    ("phase", "Int8"), ("call_id", "Int64"), ("step", "Int32"), ("thread_id", "Int32"), ("graph_task", "Int64"),
    ("start_ns", "Int64"), ("end_ns", "Int64"), ("duration_ns", "Int64"), ("self_ns", "Int64"),
    ("device_id", "Int32"), ("stream", "Int64"), ("status", "Int8"), ("exit_seq", "Int64"),
))


@dataclass(frozen=True)
class StoredAs:
    """How table span_rows keeps a span row column compact, as another column:
    ``column = base + stored`` (``sign`` 1) or ``column = base - stored``
    (``sign`` -1), so ``stored`` is a small gap where ``column`` lies near
    ``base``.  Where ``stored`` is a span row column of its own
    (``duration_ns``), it is written as it is and ``column`` left out.  The
    writer's encoding (``encode``), the readers' decodings in SQL (``sql``,
    the spans view's among them) and in polars (``decode``) all come from here."""

    column: str
    stored: str
    base: str
    sign: int

    def sql(self, table: str = "") -> str:
        """The SQL reading ``column`` from span_rows (``table``: the alias of span_rows, if any)."""
        prefix = f"{table}." if table else ""
        return f"{prefix}{self.base} {'+' if self.sign > 0 else '-'} {prefix}{self.stored}"

    def encode(self) -> pl.Expr:
        """``stored`` from a frame of span rows."""
        import polars as pl

        column, base = pl.col(self.column), pl.col(self.base)
        return (column - base if self.sign > 0 else base - column).alias(self.stored)

    def decode(self) -> pl.Expr:
        """``column`` from a frame of stored span rows."""
        import polars as pl

        base, stored = pl.col(self.base), pl.col(self.stored)
        return (base + stored if self.sign > 0 else base - stored).alias(self.column)

    def wrapped(self) -> pl.Expr:
        """Whether ``decode`` went past 64 bits (where SQL would fail, polars wraps around)."""
        import polars as pl

        base, stored = pl.col(self.base), pl.col(self.stored)
        value = self.decode()
        if self.sign < 0:
            return ((stored > 0) & (value > base)) | ((stored < 0) & (value < base))
        return ((stored > 0) & (value < base)) | ((stored < 0) & (value > base))


# What table span_rows keeps of a span row, compact: no end_ns (start_ns + duration_ns), the
# parent and the exit as small gaps from span_id (parent_gap = span_id - parent_span_id,
# exit_gap = exit_seq - span_id).
SPAN_STORED_AS: tuple[StoredAs, ...] = (
    StoredAs("parent_span_id", "parent_gap", "span_id", -1),
    StoredAs("end_ns", "duration_ns", "start_ns", 1),
    StoredAs("exit_seq", "exit_gap", "span_id", 1),
)
SPAN_STORED_ROW = Contract("stored span row", (
    *(c for c in SPAN_ROW.columns if c[0] not in {d.column for d in SPAN_STORED_AS}),
    *((d.stored, SPAN_ROW.dtype(d.column)) for d in SPAN_STORED_AS if d.stored not in SPAN_ROW.names),
))
# The spans frame: span rows with names, phase and status as Enums.
SPAN_FRAME = Contract("spans frame", (
    *_RUN_RANK, ("span_id", "Int64"), ("parent_span_id", "Int64"), ("depth", "Int32"), ("module_id", "Int32"),
    ("fqn", "Categorical"), ("module_type", "Categorical"), ("phase", "Phase"), ("call_id", "Int64"),
    ("step", "Int32"), ("thread_id", "Int32"), ("graph_task", "Int64"), ("start_ns", "Int64"), ("end_ns", "Int64"),
    ("duration_ns", "Int64"), ("self_ns", "Int64"), ("device_id", "Int32"), ("device", "Categorical"),
    ("stream", "Int64"), ("status", "Status"), ("exit_seq", "Int64"),
))

# A span's work counters (modtrace.analysis.counters), inclusive and self, after its columns in
# ``Database.spans`` and the spans view; null where its step was not counted.
SPAN_COUNTS = Contract("span work counters", tuple(
    (c, "Int64") for c in ("flops", "flops_self", "bytes", "bytes_self", "ops", "ops_self", "unknown_ops",
                           "unknown_ops_self")
))

# A span's memory on counted steps (modtrace.analysis.memory, docs/memory.md), inclusive and
# self, after the work counters in ``Database.spans`` and the spans view; null likewise.
SPAN_MEMORY = Contract("span memory", tuple(
    (c, "Int64") for c in ("kept_mem_bytes", "kept_mem_bytes_self", "peak_mem_bytes", "peak_mem_bytes_self")
))

# The issues frame (one row per nesting issue); stored in nesting_issues with
# phase as its name (String).
ISSUE_FRAME = Contract("issues frame", (
    *_RUN_RANK, ("seq", "Int64"), ("kind", "String"), ("severity", "String"), ("fqn", "String"),
    ("phase", "Phase"), ("call_id", "Int64"), ("step", "Int32"), ("thread_id", "Int32"), ("message", "String"),
))
ISSUE_ROW = Contract("issue row", tuple((c, "String" if c == "phase" else d) for c, d in ISSUE_FRAME.columns))
# The issues as ``check`` lists them: errors and warnings one by one, info issues one row per
# (kind, fqn, phase) with how many rows it stands for (analysis.nesting.summarize_issues).
ISSUE_SUMMARY_FRAME = Contract("issue summary frame", (
    ("severity", "String"), ("kind", "String"), ("rank", "Int32"), ("seq", "Int64"), ("step", "Int32"),
    ("phase", "Phase"), ("fqn", "String"), ("count", "UInt32"), ("message", "String"),
))

# Where a tree node's time comes from (tree_nodes.source): measured by module hooks, attributed
# from compiled kernels (its spans have status attributed), or some spans of each (a module that
# ran inside compiled code on some calls and eagerly on others).
HOOKS, KERNELS, MIXED = "hooks", "kernels", "mixed"
SOURCES: tuple[str, ...] = (HOOKS, KERNELS, MIXED)


def is_attributed() -> pl.Expr:
    """Whether a span of a spans frame was attributed from compiled kernels (status attributed)."""
    import polars as pl

    return (pl.col("status") == STATUSES[Status.ATTRIBUTED]).fill_null(False)


def source_of(attributed: pl.Expr, calls: pl.Expr) -> pl.Expr:
    """Where the time of a group of ``calls`` spans, ``attributed`` of them attributed from compiled
    kernels, comes from: kernels (all), mixed (some) or hooks (none)."""
    import polars as pl

    return (pl.when(attributed >= calls).then(pl.lit(KERNELS)).when(attributed > 0).then(pl.lit(MIXED))
            .otherwise(pl.lit(HOOKS)))

# One node of the module call tree (``modtrace tree``; analysis.aggregate.module_tree): a call
# path of (phase, fqn) from a root span down, node_id its hash, with the timings of its spans.
# Stored in table tree_nodes with node_id and parent_node_id as signed Int64, phase as its name.
TREE_NODE_FRAME = Contract("tree node frame", (
    ("node_id", "UInt64"), ("parent_node_id", "UInt64"), ("level", "Int32"), ("fqn", "String"),
    ("module_type", "String"), ("phase", "Phase"), ("calls", "UInt32"), ("steps", "UInt32"),
    ("inclusive_total_ns", "Int64"), ("self_total_ns", "Int64"), ("inclusive_median_ns", "Float64"),
    ("self_median_ns", "Float64"), ("percent", "Float64"), ("source", "String"),
))
# The tree as ``tree`` and ``Database.tree`` give it: each node with its work per counted step
# and what derives from it (``core.work``), then its memory (``core.memory_nodes``); null where
# the node ran in no counted step.
TREE_FRAME = Contract("tree frame", (
    *TREE_NODE_FRAME.columns, ("counted_steps", "UInt32"), ("flops_per_step", "Float64"),
    ("bytes_per_step", "Float64"), ("unknown_ops_per_step", "Float64"), ("gflop_per_s", "Float64"),
    ("flop_per_byte", "Float64"), ("peak_percent", "Float64"), ("kept_mem_per_step", "Float64"),
    ("peak_mem_bytes", "Int64"),
))

# One root call (the outermost module call on its thread) as the tracker notes it (table
# root_calls adds run_id and rank): the seq of its enter event, its call id, its input kind
# (modtrace.tracking.step_kind, null when it took no tensor); and the root calls frame the step analysis reads.
ROOT_ROW = Contract("root call row", (("seq", "Int64"), ("call_id", "Int64"), ("kind", "String")))
ROOT_FRAME = Contract("root calls frame", (("rank", "Int32"), ("seq", "Int64"), ("thread_id", "Int32"), ("kind", "String")))

# One closed call as diff compares it (codes), read from span_rows or a spans frame.
CALL_FRAME = Contract("call frame", (
    ("rank", "Int32"), ("span_id", "Int64"), ("step", "Int32"), ("thread_id", "Int32"), ("module_id", "Int32"),
    ("depth", "Int32"), ("phase", "Int8"), ("duration_ns", "Int64"), ("self_ns", "Int64"),
    ("device_id", "Int32"), ("stream", "Int64"),
))

# Device time (modtrace.tracking.device_timer): one enter or exit whose device event
# resolved, as the recorder writes it (table device_events adds run_id and
# rank; device_ts_ns null: the device could not time it, mem_bytes null: not
# read), the frame the analysis takes, and a span's device columns as stored
# (table span_device_rows; analysis.device says what each means).
DEVICE_EVENT_ROW = Contract("device event row", (("seq", "Int64"), ("device_ts_ns", "Int64"), ("mem_bytes", "Int64")))
DEVICE_EVENT_FRAME = DEVICE_EVENT_ROW.prefixed("device event frame", *_RUN_RANK)
DEVICE_SPAN_COLUMNS: tuple[str, ...] = (
    "device_start_ns", "device_end_ns", "device_duration_ns", "device_self_ns", "mem_delta_bytes", "mem_max_bytes",
)
SPAN_DEVICE_ROW = Contract("span device row", (
    *_RUN_RANK, ("span_id", "Int64"), *((c, "Int64") for c in DEVICE_SPAN_COLUMNS),
))
# The clocks a run's times can be read on: host (when Python ran the hooks) or device.
CLOCKS: tuple[str, ...] = ("host", "device")


@dataclass(slots=True)
class Batch:
    """One write of a rank's rows, each a tuple in its row contract (no run_id
    or rank): events (``EVENT_ROW``) and the names they use (``MODULE_ROW``,
    whose last value, ``compiled``, a row may leave out: 0; ``THREAD_ROW``,
    ``DEVICE_ROW``), ``progress``, the rank's (event_count, step_count) once
    the batch is written, the root calls (``ROOT_ROW``), and the device times
    resolved since the last batch (``DEVICE_EVENT_ROW``, of this or earlier
    batches' events).  The recorder takes it from its buffers, the writer
    process's pipe carries its fields in this order
    (``modtrace.recording.writer_messages``), ``modtrace.store.writer`` writes
    it in one transaction."""

    events: Sequence[tuple[Any, ...]] = ()
    modules: Sequence[tuple[Any, ...]] = ()
    threads: Sequence[tuple[Any, ...]] = ()
    devices: Sequence[tuple[Any, ...]] = ()
    progress: tuple[int, int] | None = None
    roots: Sequence[tuple[Any, ...]] = ()
    device_rows: Sequence[tuple[Any, ...]] = ()


CONTRACTS: tuple[Contract, ...] = (
    EVENT_ROW, EVENT_FRAME, MODULE_ROW, THREAD_ROW, DEVICE_ROW, MODULE_FRAME, THREAD_FRAME, DEVICE_FRAME,
    SPAN_ROW, SPAN_STORED_ROW, SPAN_FRAME, SPAN_COUNTS, SPAN_MEMORY, ISSUE_FRAME, ISSUE_ROW, ISSUE_SUMMARY_FRAME, TREE_NODE_FRAME, TREE_FRAME, ROOT_ROW, ROOT_FRAME, CALL_FRAME,
    DEVICE_EVENT_ROW, DEVICE_EVENT_FRAME, SPAN_DEVICE_ROW,
)
