-- Recompute overhead per checkpointed module: what activation checkpointing
-- costs, one row per module whose forward was recomputed during backward.
--
-- A checkpointed module is the outermost module of a recomputed region: a
-- recompute span with no other recompute span open around it (usually the
-- module passed to torch.utils.checkpoint). Its recompute time is the
-- inclusive time of those outermost recompute spans; spans inside them are
-- part of it. Non-reentrant checkpointing may stop a recompute early once the
-- needed activations exist (early_stops), which makes it cheaper than the
-- forward.
--
-- Parameters:
--   :run_id  the run (modtrace query --run RUN)
--
-- Columns:
--   fqn               checkpointed module's fully qualified name
--   module_type       module's class name
--   recomputes        outermost recompute spans of the module
--   early_stops       of those, recomputes that stopped early
--   recompute_ms      inclusive time of those recompute spans, milliseconds
--   forward_ms        inclusive time of the module's forward spans, milliseconds
--   overhead_pct      recompute_ms as a share of forward_ms, percent
--   backward_share_pct  recompute_ms as a share of the run's backward time (outermost backward spans), percent
WITH recompute AS (
    SELECT rank, thread_id, graph_task, span_id, exit_seq, fqn, module_type, duration_ns, status
    FROM spans
    WHERE run_id = :run_id AND phase = 'recompute'
),
marks AS (
    -- per stack (rank, thread, graph task) in seq order: +1 at each recompute
    -- span's enter, -1 at its exit
    SELECT rank, thread_id, graph_task, span_id AS seq, 1 AS delta, fqn, module_type, duration_ns, status
    FROM recompute
    UNION ALL
    SELECT rank, thread_id, graph_task, exit_seq AS seq, -1 AS delta, NULL, NULL, NULL, NULL
    FROM recompute
    WHERE exit_seq IS NOT NULL
),
open_counts AS (
    SELECT
        delta, fqn, module_type, duration_ns, status,
        SUM(delta) OVER (PARTITION BY rank, thread_id, graph_task ORDER BY seq ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS open_spans
    FROM marks
),
outer_recompute AS (
    -- recompute spans entered while no other recompute span was open on
    -- their stack: the outermost module of each recomputed region
    SELECT fqn, module_type, duration_ns, status
    FROM open_counts
    WHERE delta = 1 AND open_spans = 1
),
per_module AS (
    SELECT
        fqn,
        module_type,
        COUNT(*) AS recomputes,
        SUM(CASE WHEN status = 'early_stop' THEN 1 ELSE 0 END) AS early_stops,
        CAST(SUM(COALESCE(duration_ns, 0)) AS DOUBLE PRECISION) AS recompute_ns
    FROM outer_recompute
    GROUP BY fqn, module_type
),
forward AS (
    SELECT fqn, CAST(SUM(COALESCE(duration_ns, 0)) AS DOUBLE PRECISION) AS forward_ns
    FROM spans
    WHERE run_id = :run_id AND phase = 'forward'
    GROUP BY fqn
),
backward AS (
    SELECT CAST(SUM(COALESCE(duration_ns, 0)) AS DOUBLE PRECISION) AS backward_ns
    FROM spans
    WHERE run_id = :run_id AND phase = 'backward' AND parent_span_id IS NULL
)
SELECT
    m.fqn,
    m.module_type,
    m.recomputes,
    CAST(m.early_stops AS BIGINT) AS early_stops,
    m.recompute_ns / 1000000 AS recompute_ms,
    f.forward_ns / 1000000 AS forward_ms,
    100 * m.recompute_ns / NULLIF(f.forward_ns, 0) AS overhead_pct,
    100 * m.recompute_ns / NULLIF(b.backward_ns, 0) AS backward_share_pct
FROM per_module m
LEFT JOIN forward f ON f.fqn = m.fqn
CROSS JOIN backward b
ORDER BY m.recompute_ns DESC, m.fqn
