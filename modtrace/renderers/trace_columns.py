"""The span columns a Perfetto trace shows or places its slices by.

Apart from ``perfetto`` (which needs polars) so that the CLI can begin reading
them before polars is imported: the read runs while the import does.
"""

from __future__ import annotations

# With the names that come from module_id and device_id; a caller may read only these.
TRACE_SPAN_COLUMNS: tuple[str, ...] = (
    "rank", "span_id", "parent_span_id", "depth", "module_id", "phase", "call_id", "step", "thread_id",
    "graph_task", "start_ns", "end_ns", "self_ns", "device_id", "stream", "status",
)
