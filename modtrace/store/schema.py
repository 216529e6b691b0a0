"""The database schema: SQLAlchemy Core metadata for every table modtrace owns.

Storage is compact (small integer codes, per-run lookup tables, a clustered
events table) and the public relations engineers query are views over it:
``event_log`` (events with names instead of codes), ``spans`` and
``nesting_issues`` (analysis results).  ``runs`` and ``modules`` are tables
and public as they are.  Every table and column carries a comment; the
schema reference in ``docs/schema.md`` is checked against this by a test.

Alembic revisions in ``migrations/versions`` create exactly this metadata;
``REVISIONS`` lists them in order so that the version check needs no Alembic
import.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    Double,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from modtrace.core.contracts import RUN_STATUSES, SEVERITIES

# Alembic revision ids, oldest first.  The last one is head.  A test checks
# this against the migration scripts.
REVISIONS: tuple[str, ...] = ("0001", "0002", "0003", "0004", "0005", "0006", "0007", "0008", "0009", "0010", "0011", "0012", "0013", "0014", "0015", "0016", "0017", "0018", "0019", "0020")
HEAD = REVISIONS[-1]

# Tables a modtrace database has; used to tell ours from another application's.
VERSION_TABLE = "alembic_version"

metadata = MetaData()

RUN_COUNTERS_COMMENT = (
    "Which steps the recorder counted FLOPs, bytes and ops on (Recorder(counters=...), modtrace record --counters): "
    "first (the first recorded step of each step kind) | every-step | off; NULL for runs recorded before revision "
    "0015. The counted steps are those whose spans have counters (spans.ops not NULL)."
)

PROBE_WORK_COMMENT = (
    "Which fixed work the probe timed (modtrace.core.codes.ProbeWork): 2 the probe's layers forward with autograd "
    "and their backward; NULL for probes recorded before revision 0019 (the layers forward only). A history gate "
    "adjusts step times only where every run's probes did the same work."
)

_RUN_STATUSES = ", ".join(repr(s) for s in RUN_STATUSES)

# runs.analysis and run_ranks.analysis: whether the spans and nesting issues are stored,
# kept by the transaction that stores them (store.analysis_store) and by finish_rank.
RUN_ANALYSIS_COMMENT = (
    "Whether the run's analysis (spans, nesting_issues) is stored: none (not analysed yet: recorded with "
    "--no-analyze, the recording's own analysis still under way or its process killed) | partial (some ranks' "
    "only) | stale (a rank recorded events after its analysis was stored) | stored. Until it is stored, "
    "`modtrace analyze RUN` stores it."
)
RANK_ANALYSIS_COMMENT = (
    "Whether this rank's analysis is stored: none | stale (the rank recorded events after it was stored) | stored."
)

runs = Table(
    "runs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True, comment="Run id, unique in this database."),
    Column("name", String(200), nullable=False, comment="Run name, unique in this database; shared by the ranks of one distributed launch."),
    Column("status", String(16), nullable=False, comment="running | completed | failed | interrupted. A run left 'running' by a killed process is shown as incomplete."),
    Column("started_at", String(32), nullable=False, comment="UTC start time, ISO 8601 (YYYY-MM-DDTHH:MM:SS.ffffffZ)."),
    Column("ended_at", String(32), nullable=True, comment="UTC end time, ISO 8601; NULL while running or after a crash."),
    Column("command", Text, nullable=True, comment="Full command line that produced the run."),
    Column("cwd", Text, nullable=True, comment="Working directory of the recording process."),
    Column("hostname", String(255), nullable=True, comment="Host of the process that created the run (rank 0 or the first rank to start)."),
    Column("pid", Integer, nullable=True, comment="Process id of the process that created the run."),
    Column("git_commit", String(64), nullable=True, comment="Git commit of the working directory, when it is a repository."),
    Column("world_size", Integer, nullable=False, server_default="1", comment="Number of ranks in the launch (torch.distributed world size or WORLD_SIZE, else 1)."),
    Column("python_version", String(32), nullable=True, comment="Python version of the recording process."),
    Column("torch_version", String(64), nullable=True, comment="torch.__version__ of the recording process."),
    Column("modtrace_version", String(32), nullable=True, comment="modtrace version that recorded the run."),
    Column("tags", Text, nullable=False, server_default="{}", comment="User tags as a JSON object of strings."),
    Column("error", Text, nullable=True, comment="Summary of the exception or signal that ended a failed or interrupted run."),
    Column("step_on", String(16), nullable=False, server_default="optimizer", comment="What starts a step, as asked of the recorder: auto (optimizer steps when the run made any, else root calls) | optimizer (optimizer steps and Recorder.step()) | root (each root call, see root_calls) | manual (Recorder.step() only)."),
    Column("schedule", Text, nullable=True, comment="The recording schedule, as `modtrace record --schedule` takes it (e.g. 'skip_first=10,wait=5,warmup=1,active=20,repeat=3'); NULL when every step was recorded."),
    Column("analysis", String(16), nullable=False, server_default="none", comment=RUN_ANALYSIS_COMMENT),
    Column("counters", String(16), nullable=True, comment=RUN_COUNTERS_COMMENT),
    CheckConstraint(f"status IN ({_RUN_STATUSES})", name="ck_runs_status"),
    UniqueConstraint("name", name="uq_runs_name"),
    comment="One row per recorded run (one training or inference job, possibly many ranks).",
)

run_ranks = Table(
    "run_ranks",
    metadata,
    Column("run_id", Integer, nullable=False, comment="The run (runs.id)."),
    Column("rank", Integer, nullable=False, comment="Distributed rank of the recording process."),
    Column("hostname", String(255), nullable=True, comment="Host the rank ran on."),
    Column("pid", Integer, nullable=True, comment="Process id of the rank."),
    Column("status", String(16), nullable=False, comment="running | completed | failed | interrupted, for this rank."),
    Column("started_at", String(32), nullable=False, comment="UTC start time of this rank, ISO 8601."),
    Column("ended_at", String(32), nullable=True, comment="UTC end time of this rank, ISO 8601."),
    Column("wall_anchor_ns", BigInteger, nullable=False, comment="Wall-clock time (ns since the Unix epoch) at ts_ns = 0 of this rank; aligns ranks."),
    Column("event_count", BigInteger, nullable=False, server_default="0", comment="Events written so far by this rank."),
    Column("step_count", Integer, nullable=False, server_default="0", comment="Steps completed so far by this rank."),
    Column("reconnects", Integer, nullable=False, server_default="0", comment="Times this rank's writer lost its database connection (or found the database locked past the busy timeout) and resumed on a new one."),
    Column("dropped_events", BigInteger, nullable=False, server_default="0", comment="Events not stored because the database stayed unreachable while more than the recorder's memory bound waited (whole steps are dropped)."),
    Column("dropped_steps", Text, nullable=True, comment="The steps whose events were dropped, as ranges (e.g. '31-35,40'); NULL when none."),
    Column("fork_calls", BigInteger, nullable=False, server_default="0", comment="Module calls made in child processes forked during the recording (e.g. DataLoader workers); not recorded."),
    Column("recorded_steps", Text, nullable=True, comment="The steps this rank recorded under the run's schedule, as ranges (e.g. '10-29,35-54'); NULL when the run has no schedule (every step recorded)."),
    Column("analysis", String(16), nullable=False, server_default="none", comment=RANK_ANALYSIS_COMMENT),
    PrimaryKeyConstraint("run_id", "rank", name="pk_run_ranks"),
    ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_run_ranks_run"),
    CheckConstraint(f"status IN ({_RUN_STATUSES})", name="ck_run_ranks_status"),
    comment="One row per rank of a run: its process, clock anchor and progress.",
)

modules = Table(
    "modules",
    metadata,
    Column("run_id", Integer, nullable=False, comment="The run (runs.id)."),
    Column("rank", Integer, nullable=False, comment="Rank that named the module; ids are per rank."),
    Column("module_id", Integer, nullable=False, comment="Module id within (run_id, rank)."),
    Column("fqn", Text, nullable=False, comment="Fully qualified name: root class name then attribute path, e.g. GPT.blocks.0.attn."),
    Column("module_type", String(200), nullable=False, comment="Class name of the module, e.g. Linear."),
    Column("parent_module_id", Integer, nullable=True, comment="module_id of the owning module; NULL for a root."),
    Column("compiled", SmallInteger, nullable=False, server_default="0", comment="1 when the module was seen running compiled (torch.compile): the module calls inside it are not recorded; 0 otherwise."),
    PrimaryKeyConstraint("run_id", "rank", "module_id", name="pk_modules"),
    ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_modules_run"),
    comment="Every nn.Module a run saw, with its place in the module tree.",
)

threads = Table(
    "threads",
    metadata,
    Column("run_id", Integer, nullable=False, comment="The run (runs.id)."),
    Column("rank", Integer, nullable=False, comment="Rank of the process."),
    Column("thread_id", Integer, nullable=False, comment="Small thread number within (run_id, rank), in order of first event."),
    Column("ident", BigInteger, nullable=False, comment="threading.get_ident() of the thread."),
    Column("name", Text, nullable=True, comment="Thread name."),
    PrimaryKeyConstraint("run_id", "rank", "thread_id", name="pk_threads"),
    ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_threads_run"),
    comment="Threads that produced events.",
)

devices = Table(
    "devices",
    metadata,
    Column("run_id", Integer, nullable=False, comment="The run (runs.id)."),
    Column("rank", Integer, nullable=False, comment="Rank of the process."),
    Column("device_id", Integer, nullable=False, comment="Small device number within (run_id, rank)."),
    Column("name", String(64), nullable=False, comment="Device as torch prints it: cpu, cuda:0, meta, ..."),
    PrimaryKeyConstraint("run_id", "rank", "device_id", name="pk_devices"),
    ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_devices_run"),
    comment="Devices that module calls computed on.",
)

events = Table(
    "events",
    metadata,
    Column("run_id", Integer, nullable=False, comment="The run (runs.id)."),
    Column("rank", Integer, nullable=False, comment="Rank that recorded the event."),
    Column("seq", BigInteger, nullable=False, comment="Event number, strictly increasing per (run_id, rank)."),
    Column("ts_ns", BigInteger, nullable=False, comment="Monotonic nanoseconds since the rank started recording (run_ranks.wall_anchor_ns is ts_ns = 0)."),
    Column("kind", SmallInteger, nullable=False, comment="0 enter, 1 exit (modtrace.core.codes.Kind)."),
    Column("module_id", Integer, nullable=False, comment="modules.module_id of the module."),
    Column("phase", SmallInteger, nullable=False, comment="0 forward, 1 backward, 2 recompute, 3 backward_call (modtrace.core.codes.Phase)."),
    Column("call_id", BigInteger, nullable=False, comment="One per forward or backward_call module call; its backward and recompute events carry the same id."),
    Column("step", Integer, nullable=False, comment="Step number, from 0; advanced by Recorder.step() and after each optimizer step."),
    Column("thread_id", Integer, nullable=False, comment="threads.thread_id of the thread the hook ran on."),
    Column("device_id", Integer, nullable=True, comment="devices.device_id where the call computes; NULL when it has no tensor input, parameter or buffer."),
    Column("stream", BigInteger, nullable=True, comment="Current CUDA/accelerator stream handle on that device; NULL on CPU."),
    Column("status", SmallInteger, nullable=False, server_default="0", comment="0 ok, 1 error, 2 early_stop, 3 closed_at_end_of_backward, 4 no_enter, 5 unlinked, 6 attributed (a call inside compiled code, its time attributed from the kernels inductor generated for it; modtrace.core.codes.Status)."),
    Column("graph_task", BigInteger, nullable=True, comment="Autograd graph task id for backward, recompute and backward_call events; NULL in forward."),
    Column("tie", SmallInteger, nullable=False, server_default="0", comment="1 when produced by the same autograd hook dispatch as the previous event of this thread (a tie to normalise), else 0."),
    PrimaryKeyConstraint("run_id", "rank", "seq", name="pk_events"),
    ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_events_run"),
    sqlite_with_rowid=False,
    comment="Raw enter/exit events in compact form; query the event_log view for readable values.",
)

root_calls = Table(
    "root_calls",
    metadata,
    Column("run_id", Integer, nullable=False, comment="The run (runs.id)."),
    Column("rank", Integer, nullable=False, comment="Rank that recorded the call."),
    Column("seq", BigInteger, nullable=False, comment="events.seq of the call's enter event (spans.span_id of its forward span)."),
    Column("call_id", BigInteger, nullable=False, comment="events.call_id of the call."),
    Column("kind", Text, nullable=True, comment="The call's input shape, the kind of the step it starts: its first tensor argument as NAME=SHAPE (input_ids=1x7); NULL when it has none."),
    PrimaryKeyConstraint("run_id", "rank", "seq", name="pk_root_calls"),
    ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_root_calls_run"),
    sqlite_with_rowid=False,
    comment="Root calls: the outermost module calls of each thread (each model(...) of a generate() loop, each request a serving loop handles on any thread). Steps start at them when a run's steps follow root calls.",
)

device_events = Table(
    "device_events",
    metadata,
    Column("run_id", Integer, nullable=False, comment="The run (runs.id)."),
    Column("rank", Integer, nullable=False, comment="Rank that recorded the event."),
    Column("seq", BigInteger, nullable=False, comment="events.seq of the enter or exit event."),
    Column("device_ts_ns", BigInteger, nullable=True, comment="Nanoseconds on the rank's clock when the device reached the event: the host time at which the device's reference event was recorded plus the device's elapsed time since it. NULL when the device could not time it."),
    Column("mem_bytes", BigInteger, nullable=True, comment="Bytes allocated by tensors on the event's device at the event (torch.cuda.memory_allocated, read on the host). NULL when not read."),
    PrimaryKeyConstraint("run_id", "rank", "seq", name="pk_device_events"),
    ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_device_events_run"),
    sqlite_with_rowid=False,
    comment="Device time and allocated memory of the events of module calls on CUDA devices, written as their device events resolve; query them through event_log.",
)

span_device_rows = Table(
    "span_device_rows",
    metadata,
    Column("run_id", Integer, nullable=False, comment="The run (runs.id)."),
    Column("rank", Integer, nullable=False, comment="Rank that recorded the span."),
    Column("span_id", BigInteger, nullable=False, comment="span_rows.span_id of the span."),
    Column("device_start_ns", BigInteger, nullable=True, comment="device_ts_ns of the enter event, in nanoseconds on the rank's clock."),
    Column("device_end_ns", BigInteger, nullable=True, comment="device_ts_ns of the exit event, in nanoseconds on the rank's clock."),
    Column("device_duration_ns", BigInteger, nullable=True, comment="Device nanoseconds from the enter to the exit, idle gaps of the stream included."),
    Column("device_self_ns", BigInteger, nullable=True, comment="device_duration_ns minus the device durations of children on the same device and stream; NULL when such a child has no device time."),
    Column("mem_delta_bytes", BigInteger, nullable=True, comment="Allocated bytes on the span's device at the exit minus at the enter."),
    Column("mem_max_bytes", BigInteger, nullable=True, comment="The most allocated on the span's device at any event of the span or its descendants."),
    PrimaryKeyConstraint("run_id", "rank", "span_id", name="pk_span_device_rows"),
    ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_span_device_rows_run"),
    sqlite_with_rowid=False,
    comment="Device time and memory of spans, written by modtrace analyze for runs with device times; query them through spans.",
)

call_counters = Table(
    "call_counters",
    metadata,
    Column("run_id", Integer, nullable=False, comment="The run (runs.id)."),
    Column("rank", Integer, nullable=False, comment="Rank that recorded the call."),
    Column("call_id", BigInteger, nullable=False, comment="events.call_id of the module call the ops ran in (the innermost open)."),
    Column("phase", SmallInteger, nullable=False, comment="0 forward, 1 backward, 2 recompute, 3 backward_call (modtrace.core.codes.Phase)."),
    Column("graph_task", BigInteger, nullable=False, comment="Autograd graph task of a backward, recompute or backward_call; -1 in forward."),
    Column("flops", BigInteger, nullable=False, comment="FLOPs of the call's own ops (torch.utils.flop_counter's formulas)."),
    Column("bytes", BigInteger, nullable=False, comment="Bytes of the tensor inputs and outputs of the call's own ops (views: none)."),
    Column("ops", BigInteger, nullable=False, comment="Aten ops the call ran itself."),
    Column("unknown_ops", BigInteger, nullable=False, comment="Of those, ops with no FLOP formula that may do such work: flops is a lower bound when not 0."),
    PrimaryKeyConstraint("run_id", "rank", "call_id", "phase", "graph_task", name="pk_call_counters"),
    ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_call_counters_run"),
    sqlite_with_rowid=False,
    comment="Work counted per module call and phase on counted steps (the ops charged to the innermost open call), written by the recorder at the end of the recording; query the spans view's counter columns.",
)

counted_ranges = Table(
    "counted_ranges",
    metadata,
    Column("run_id", Integer, nullable=False, comment="The run (runs.id)."),
    Column("rank", Integer, nullable=False, comment="Rank that counted."),
    Column("first_seq", BigInteger, nullable=False, comment="seq of the first event of the counted range (a root call's enter)."),
    Column("last_seq", BigInteger, nullable=False, comment="seq of the last event of the counted range: every span entered from first_seq to last_seq has counters."),
    Column("flops", BigInteger, nullable=False, comment="FLOPs of the range's ops run outside any module call."),
    Column("bytes", BigInteger, nullable=False, comment="Bytes of the range's ops run outside any module call."),
    Column("ops", BigInteger, nullable=False, comment="Aten ops of the range run outside any module call (a loss function, the optimizer)."),
    Column("unknown_ops", BigInteger, nullable=False, comment="Of those, ops with no FLOP formula that may do such work."),
    PrimaryKeyConstraint("run_id", "rank", "first_seq", name="pk_counted_ranges"),
    ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_counted_ranges_run"),
    sqlite_with_rowid=False,
    comment="The event ranges (one per counted step or root call) during which the recorder counted work, written by the recorder at the end of the recording.",
)

step_speeds = Table(
    "step_speeds",
    metadata,
    Column("run_id", Integer, nullable=False, comment="The run (runs.id)."),
    Column("rank", Integer, nullable=False, comment="Rank that took the probe."),
    Column("ts_ns", BigInteger, nullable=False, comment="When the probe started, on the events' clock (as events.ts_ns)."),
    Column("step", Integer, nullable=False, comment="The recorder's step number the probe was taken before (events.step of the step that followed)."),
    Column("seq", BigInteger, nullable=False, comment="events.seq the rank's next event took: the probe ran between event seq - 1 and event seq."),
    Column("probe_ns", BigInteger, nullable=False, comment="How long the probe's fixed work took (modtrace.recording.speed_probe): the machine's speed just before the step; larger is slower."),
    Column("cpu_ns", BigInteger, nullable=True, comment="The recording thread's CPU time at the probe's start (time.thread_time_ns); NULL when the events' clock was injected."),
    Column("real_ns", BigInteger, nullable=True, comment="The host's clock at the same moment (time.perf_counter_ns): from one probe to the next, the CPU time over this is the share of the time the program ran."),
    Column("threads", SmallInteger, nullable=True, comment="torch's intra-op threads when the probe was taken (torch.get_num_threads()): with one, the recording thread's CPU time holds the step's work; NULL for probes recorded before revision 0018."),
    Column("work", SmallInteger, nullable=True, comment=PROBE_WORK_COMMENT),
    PrimaryKeyConstraint("run_id", "rank", "step", name="pk_step_speeds"),
    ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_step_speeds_run"),
    sqlite_with_rowid=False,
    comment="The speed probe timed before each recorded step (Recorder(speed_probe=True), modtrace record --speed-probe), written by the recorder at the end of the recording; a history gate divides step times by it.",
)

span_counter_rows = Table(
    "span_counter_rows",
    metadata,
    Column("run_id", Integer, nullable=False, comment="The run (runs.id)."),
    Column("rank", Integer, nullable=False, comment="Rank that recorded the span."),
    Column("span_id", BigInteger, nullable=False, comment="span_rows.span_id of the span."),
    Column("flops", BigInteger, nullable=False, comment="FLOPs of the span and its descendant spans."),
    Column("flops_self", BigInteger, nullable=False, comment="FLOPs of the span's own ops."),
    Column("bytes", BigInteger, nullable=False, comment="Bytes of the span and its descendant spans."),
    Column("bytes_self", BigInteger, nullable=False, comment="Bytes of the span's own ops."),
    Column("ops", BigInteger, nullable=False, comment="Aten ops of the span and its descendant spans."),
    Column("ops_self", BigInteger, nullable=False, comment="Aten ops of the span's own."),
    Column("unknown_ops", BigInteger, nullable=False, comment="Ops with no FLOP formula in the span and its descendants: flops is a lower bound when not 0."),
    Column("unknown_ops_self", BigInteger, nullable=False, comment="Ops with no FLOP formula of the span's own: flops_self is a lower bound when not 0."),
    PrimaryKeyConstraint("run_id", "rank", "span_id", name="pk_span_counter_rows"),
    ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_span_counter_rows_run"),
    sqlite_with_rowid=False,
    comment="Work counters of the spans of counted steps, inclusive and self, written by modtrace analyze from call_counters; query them through spans.",
)

# Memory per module call on counted steps (modtrace.tracking.memory, docs/schema.md "Memory").
mem_storages = Table(
    "mem_storages",
    metadata,
    Column("run_id", Integer, nullable=False, comment="The run (runs.id)."),
    Column("rank", Integer, nullable=False, comment="Rank that recorded the storage."),
    Column("first_seq", BigInteger, nullable=False, comment="counted_ranges.first_seq of the counted range the storage was seen in."),
    Column("sid", BigInteger, nullable=False, comment="Storage id, unique per (run_id, rank), from the rank's memory counter at its allocation (or first sight): orders the range's allocations and frees (with free_order) at equal seq positions."),
    Column("device", Integer, nullable=False, comment="devices.device_id of the storage's device."),
    Column("nbytes", BigInteger, nullable=False, comment="Bytes of the storage (on CUDA rounded up to 512, as the caching allocator allocates)."),
    Column("alloc_seq", BigInteger, nullable=True, comment="Position of the allocation: it happened after event alloc_seq - 1 and before event alloc_seq; NULL: alive before the range (a baseline storage: parameters, gradients, optimizer state, inputs)."),
    Column("free_seq", BigInteger, nullable=True, comment="Position of the free, as alloc_seq; NULL: still alive when the range ended."),
    Column("free_order", BigInteger, nullable=True, comment="The rank's memory counter at the free (sid's counter): orders it among the allocations and frees at the same position; NULL when not freed."),
    Column("call_id", BigInteger, nullable=False, comment="events.call_id of the innermost module call open at the allocation (as call_counters charge ops); 0: none, or a baseline storage."),
    Column("phase", SmallInteger, nullable=False, comment="0 forward, 1 backward, 2 recompute, 3 backward_call (modtrace.core.codes.Phase) of that call."),
    Column("graph_task", BigInteger, nullable=False, comment="Autograd graph task of that call; -1 in forward."),
    PrimaryKeyConstraint("run_id", "rank", "first_seq", "sid", name="pk_mem_storages"),
    ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_mem_storages_run"),
    sqlite_with_rowid=False,
    comment="Tensor storages seen on counted steps: each allocation (and free) with the module call it happened in, and the storages alive before; written by the recorder at the end of the recording.",
)

mem_returns = Table(
    "mem_returns",
    metadata,
    Column("run_id", Integer, nullable=False, comment="The run (runs.id)."),
    Column("rank", Integer, nullable=False, comment="Rank that recorded the call."),
    Column("call_id", BigInteger, nullable=False, comment="events.call_id of a forward module call of a counted range."),
    Column("sid", BigInteger, nullable=False, comment="mem_storages.sid of a storage of a tensor the call returned."),
    PrimaryKeyConstraint("run_id", "rank", "call_id", "sid", name="pk_mem_returns"),
    ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_mem_returns_run"),
    sqlite_with_rowid=False,
    comment="The storages each forward call of a counted step returned (what a module checkpointed without reentrancy still keeps); written by the recorder at the end of the recording.",
)

span_memory_rows = Table(
    "span_memory_rows",
    metadata,
    Column("run_id", Integer, nullable=False, comment="The run (runs.id)."),
    Column("rank", Integer, nullable=False, comment="Rank that recorded the span."),
    Column("span_id", BigInteger, nullable=False, comment="span_rows.span_id of the span."),
    Column("kept_mem_bytes", BigInteger, nullable=True, comment="Bytes allocated on the span's device by the span and its descendants and still alive at its exit; NULL when never exited."),
    Column("kept_mem_bytes_self", BigInteger, nullable=True, comment="Of those, bytes allocated while the span itself was the innermost call."),
    Column("peak_mem_bytes", BigInteger, nullable=True, comment="The most live tensor bytes on the span's device during the span above the level at its enter (>= 0)."),
    Column("peak_mem_bytes_self", BigInteger, nullable=True, comment="The most live bytes above the level at its enter reached at allocations of the span's own (>= 0)."),
    PrimaryKeyConstraint("run_id", "rank", "span_id", name="pk_span_memory_rows"),
    ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_span_memory_rows_run"),
    sqlite_with_rowid=False,
    comment="Kept and peak memory of the spans of counted steps, written by modtrace analyze from mem_storages; query them through spans.",
)

step_memory = Table(
    "step_memory",
    metadata,
    Column("run_id", Integer, nullable=False, comment="The run (runs.id)."),
    Column("rank", Integer, nullable=False, comment="Rank that recorded the step."),
    Column("first_seq", BigInteger, nullable=False, comment="counted_ranges.first_seq of the counted range."),
    Column("step", Integer, nullable=True, comment="The step the range began in, under the run's step rule (span_steps.step of the span at first_seq); NULL when unknown."),
    Column("device", String(64), nullable=False, comment="Device as torch prints it (devices.name)."),
    Column("base_bytes", BigInteger, nullable=False, comment="Live tensor bytes on the device at the range's start that the range saw (parameters, gradients, optimizer state, inputs)."),
    Column("peak_bytes", BigInteger, nullable=False, comment="The most live tensor bytes on the device during the range, base_bytes included."),
    PrimaryKeyConstraint("run_id", "rank", "first_seq", "device", name="pk_step_memory"),
    ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_step_memory_run"),
    sqlite_with_rowid=False,
    comment="Base and peak live tensor memory of each counted step per device, written by modtrace analyze from mem_storages.",
)

span_rows = Table(
    "span_rows",
    metadata,
    Column("run_id", Integer, nullable=False, comment="The run (runs.id)."),
    Column("rank", Integer, nullable=False, comment="Rank that recorded the span."),
    Column("span_id", BigInteger, nullable=False, comment="Span id: the seq of its enter event, unique per (run_id, rank)."),
    Column("depth", Integer, nullable=False, comment="Nesting depth on its stack, 0 at a root."),
    Column("module_id", Integer, nullable=False, comment="modules.module_id of the module called."),
    Column("phase", SmallInteger, nullable=False, comment="0 forward, 1 backward, 2 recompute, 3 backward_call (modtrace.core.codes.Phase)."),
    Column("call_id", BigInteger, nullable=False, comment="The forward call this span belongs to (events.call_id)."),
    Column("step", Integer, nullable=False, comment="Step at the span's enter."),
    Column("thread_id", Integer, nullable=False, comment="threads.thread_id of the thread the span ran on."),
    Column("graph_task", BigInteger, nullable=True, comment="Autograd graph task of a backward, recompute or backward_call span; NULL in forward."),
    Column("start_ns", BigInteger, nullable=False, comment="ts_ns of the enter event."),
    Column("duration_ns", BigInteger, nullable=True, comment="end_ns - start_ns (inclusive time); NULL when never exited."),
    Column("self_ns", BigInteger, nullable=True, comment="duration_ns minus the durations of its child spans (exclusive time); NULL when never exited."),
    Column("device_id", Integer, nullable=True, comment="devices.device_id at the enter; NULL when unknown."),
    Column("stream", BigInteger, nullable=True, comment="Accelerator stream at the enter; NULL on CPU."),
    Column("status", SmallInteger, nullable=True, comment="Status of the exit event (modtrace.core.codes.Status); NULL when the span was never exited (shown as unclosed in the spans view). 6 attributed: a call inside compiled code, timed by the kernels inductor generated for it, not by hooks."),
    Column("parent_gap", BigInteger, nullable=True, comment="span_id minus the span_id of the enclosing span on the same stack (the spans view's parent_span_id); NULL at a root. A recompute or backward_call span's parent is the backward span open on its thread when it ran."),
    Column("exit_gap", BigInteger, nullable=True, comment="seq of the exit event minus span_id (the spans view's exit_seq); NULL when never exited."),
    PrimaryKeyConstraint("run_id", "rank", "span_id", name="pk_span_rows"),
    # No foreign key to runs: PostgreSQL checks one with a trigger per inserted row, most of
    # the time of writing a run's spans (docs/performance.md, "Span write").  Only modtrace analyze
    # writes here, for
    # a run it checks once (store.analysis_store); deleting a run deletes its spans by the
    # trigger RUN_SPANS_TRIGGER (modtrace.store.create), as the cascade did.
    sqlite_with_rowid=False,
    comment="Spans rebuilt from events by modtrace analyze (one per module call and phase), in compact form; query the spans view for readable values.",
)

nesting_issues = Table(
    "nesting_issues",
    metadata,
    Column("run_id", Integer, nullable=False, comment="The run (runs.id)."),
    Column("rank", Integer, nullable=False, comment="Rank whose events show the issue."),
    Column("seq", BigInteger, nullable=False, comment="seq of the event the issue is about."),
    Column("kind", String(32), nullable=False, comment="no_enter | unclosed | crossed | reentered | duplicate_enter | duplicate_exit | error_exit | early_stop | closed_at_end_of_backward | unlinked_recompute | compiled | invalid_row | time_reversed | seq_gap."),
    Column("severity", String(8), nullable=False, comment="error | warning | info. A healthy record has no error or warning."),
    Column("fqn", Text, nullable=True, comment="Fully qualified name of the module of that event."),
    Column("phase", String(16), nullable=True, comment="forward | backward | recompute | backward_call; NULL for an invalid_row whose phase code is unknown."),
    Column("call_id", BigInteger, nullable=False, comment="events.call_id of that event."),
    Column("step", Integer, nullable=True, comment="Step of that event."),
    Column("thread_id", Integer, nullable=True, comment="threads.thread_id of that event."),
    Column("message", Text, nullable=False, comment="What happened, naming the module, phase, step and the events involved."),
    PrimaryKeyConstraint("run_id", "rank", "seq", "kind", name="pk_nesting_issues"),
    ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_nesting_issues_run"),
    CheckConstraint(f"severity IN ({', '.join(repr(s) for s in SEVERITIES)})", name="ck_nesting_issues_severity"),
    comment="Nesting problems found by modtrace analyze: events that do not form a proper hierarchy, and unusual closes.",
)

tree_nodes = Table(
    "tree_nodes",
    metadata,
    Column("run_id", Integer, nullable=False, comment="The run (runs.id)."),
    Column("clock", String(8), nullable=False, comment="host | device: the clock the node's times are on (device rows only for a run with device times)."),
    Column("node", Integer, nullable=False, comment="Position of the node in the tree's pre-order, from 0: children follow their parent in order of first call."),
    Column("node_id", BigInteger, nullable=False, comment="The node's call path (the (phase, fqn) of each span from a root down) hashed, as a signed 64-bit integer; shared by the node's rows on both clocks."),
    Column("parent_node_id", BigInteger, nullable=True, comment="node_id of the parent node; NULL at a root."),
    Column("level", Integer, nullable=False, comment="Depth of the node in the tree, 0 at a root."),
    Column("fqn", Text, nullable=False, comment="Fully qualified name of the node's module (modules.fqn)."),
    Column("module_type", String(200), nullable=False, comment="Class name of the node's module (modules.module_type)."),
    Column("phase", String(16), nullable=False, comment="forward | backward | recompute | backward_call."),
    Column("calls", BigInteger, nullable=False, comment="Spans on this path, every rank and step."),
    Column("steps", Integer, nullable=False, comment="(rank, step) pairs the node ran in."),
    Column("inclusive_total_ns", BigInteger, nullable=False, comment="Summed duration_ns of the node's spans, in nanoseconds (spans never exited count 0)."),
    Column("self_total_ns", BigInteger, nullable=False, comment="Summed self_ns of the node's spans, in nanoseconds."),
    Column("inclusive_median_ns", Double, nullable=False, comment="Median over the node's (rank, step) pairs of its summed duration_ns in that step, in nanoseconds."),
    Column("self_median_ns", Double, nullable=False, comment="Median over the node's (rank, step) pairs of its summed self_ns in that step, in nanoseconds."),
    Column("percent", Double, nullable=True, comment="inclusive_total_ns as a percentage of the run's summed step time (modtrace.analysis.step_time); NULL when that is 0."),
    Column("step_rule", String(16), nullable=False, comment="optimizer | manual | root: the step rule the steps followed (the run's own, resolved from runs.step_on)."),
    Column("source", String(8), nullable=False, server_default="hooks", comment="hooks | kernels | mixed: whether the node's spans were measured by module hooks, attributed from compiled kernels (status attributed), or some of each."),
    PrimaryKeyConstraint("run_id", "clock", "node", name="pk_tree_nodes"),
    ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_tree_nodes_run"),
    CheckConstraint("clock IN ('host', 'device')", name="ck_tree_nodes_clock"),
    sqlite_with_rowid=False,
    comment="The module call tree of a run as modtrace tree shows it by default (every rank, phase and step, the run's own step rule), written by modtrace analyze with the spans; modtrace tree reads it instead of the spans when its options allow.",
)

# A run's steps under its own step rule, stored with its spans by the analysis
# (modtrace.results.materialize) so that the steps and span_steps views read a run's rows by
# key instead of computing them from every run's spans on each read.
STEP_RULE_COMMENT = "optimizer | manual | root: the step rule the steps follow (the run's own, resolved from runs.step_on)."

step_rows = Table(
    "step_rows",
    metadata,
    Column("run_id", Integer, nullable=False, comment="The run (runs.id)."),
    Column("rank", Integer, nullable=False, comment="Rank that recorded the step."),
    Column("step", Integer, nullable=False, comment="Step under the run's step rule, from 0."),
    Column("step_rule", String(16), nullable=False, comment=STEP_RULE_COMMENT),
    Column("start_ns", BigInteger, nullable=False, comment="start_ns of the step's first span."),
    Column("wall_ns", BigInteger, nullable=False, comment="Wall time of the step in nanoseconds (modtrace.analysis.step_time)."),
    Column("step_ns", BigInteger, nullable=False, comment="Step time in nanoseconds: the union of the step's closed root spans (modtrace.analysis.step_time)."),
    Column("forward_ns", BigInteger, nullable=False, comment="Summed self_ns of the step's forward spans."),
    Column("backward_ns", BigInteger, nullable=False, comment="Summed self_ns of the step's backward and backward_call spans."),
    Column("recompute_ns", BigInteger, nullable=False, comment="Summed self_ns of the step's recompute spans."),
    Column("spans", BigInteger, nullable=False, comment="Spans entered in the step."),
    Column("unclosed", BigInteger, nullable=False, comment="Spans of the step never exited."),
    PrimaryKeyConstraint("run_id", "rank", "step", name="pk_step_rows"),
    ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_step_rows_run"),
    sqlite_with_rowid=False,
    comment="The step table of a run under its own step rule (modtrace.analysis.step_time.step_table), written by modtrace analyze with the spans and replaced with them; the steps view reads it.",
)

step_starts = Table(
    "step_starts",
    metadata,
    Column("run_id", Integer, nullable=False, comment="The run (runs.id)."),
    Column("rank", Integer, nullable=False, comment="Rank that recorded the spans."),
    Column("thread_id", Integer, nullable=False, comment="threads.thread_id of the spans."),
    Column("span_id", BigInteger, nullable=False, comment="span_rows.span_id of the thread's first span in the step (after a span of another step, or none)."),
    Column("step", Integer, nullable=False, comment="step_rows.step of this span and of the thread's spans after it up to its next row."),
    Column("nth", Integer, nullable=False, comment="The row's place among its thread's rows, from 1: a span's step is that of the row whose nth is the count of its thread's rows at or before it."),
    PrimaryKeyConstraint("run_id", "rank", "thread_id", "span_id", name="pk_step_starts"),
    Index("ix_step_starts_nth", "run_id", "rank", "thread_id", "nth", unique=True),
    ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE", name="fk_step_starts_run"),
    sqlite_with_rowid=False,
    comment="Each span's step under its run's step rule in compact form: where each thread's spans enter another step (modtrace.analysis.steps.step_starts), written with step_rows; the span_steps view reads it.",
)

# Public relations engineers query, and the columns each must expose.  Tests
# check that the live database has them and that docs/schema.md lists them.
PUBLIC_RELATIONS: dict[str, tuple[str, ...]] = {
    "runs": (
        "id", "name", "status", "started_at", "ended_at", "command", "hostname", "world_size",
        "python_version", "torch_version", "modtrace_version", "tags", "step_on", "analysis", "counters",
    ),
    "root_calls": ("run_id", "rank", "seq", "call_id", "kind"),
    "modules": ("run_id", "module_id", "fqn", "module_type", "parent_module_id", "compiled"),
    "event_log": (
        "run_id", "seq", "ts_ns", "kind", "fqn", "module_type", "phase", "call_id", "step",
        "rank", "thread_id", "device", "stream", "status", "device_ts_ns", "mem_bytes",
    ),
    "spans": (
        "run_id", "rank", "span_id", "parent_span_id", "depth", "fqn", "module_type", "phase", "call_id",
        "step", "thread_id", "start_ns", "end_ns", "duration_ns", "self_ns", "device", "stream", "status",
        "device_start_ns", "device_end_ns", "device_duration_ns", "device_self_ns", "mem_delta_bytes", "mem_max_bytes",
        "flops", "flops_self", "bytes", "bytes_self", "ops", "ops_self", "unknown_ops", "unknown_ops_self",
        "kept_mem_bytes", "kept_mem_bytes_self", "peak_mem_bytes", "peak_mem_bytes_self",
    ),
    "nesting_issues": (
        "run_id", "rank", "seq", "kind", "severity", "fqn", "phase", "call_id", "step", "thread_id", "message",
    ),
    "span_steps": ("run_id", "rank", "span_id", "step", "recorded_step", "step_rule"),
    "steps": (
        "run_id", "rank", "step", "step_rule", "start_ns", "wall_ns", "step_ns", "forward_ns", "backward_ns",
        "recompute_ns", "spans", "unclosed",
    ),
    "step_memory": ("run_id", "rank", "first_seq", "step", "device", "base_bytes", "peak_bytes"),
}
