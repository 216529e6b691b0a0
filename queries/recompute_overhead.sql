-- Recompute overhead per checkpointed module: what activation checkpointing
-- costs, one row per module whose forward was recomputed during backward.
--
-- A checkpointed module is one with a recompute span directly under a
-- backward span (the outermost module of a recomputed region, usually the
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
WITH outer_recompute AS (
    SELECT r.rank, r.fqn, r.module_type, r.duration_ns, r.status
    FROM spans r
    LEFT JOIN spans p ON p.run_id = r.run_id AND p.rank = r.rank AND p.span_id = r.parent_span_id
    WHERE r.run_id = :run_id
      AND r.phase = 'recompute'
      AND (p.phase IS NULL OR p.phase <> 'recompute')
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
