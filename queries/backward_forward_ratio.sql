-- Backward-to-forward ratio per module: how expensive each module's backward
-- is compared with its forward.
--
-- Uses inclusive time (the module and everything under it). Backward time
-- leaves out the recompute of checkpointed forwards that ran inside the
-- module's backward spans; that time is shown in recompute_ms (recompute_overhead
-- attributes it to the checkpointed module instead). A module whose inputs need
-- no gradient (the first layer, the root) gets no hooked backward exit and is
-- closed when the autograd graph task ends, so its backward time reaches to
-- the end of backward (counted in closed_at_end). A ratio around 2 is typical
-- of matmul-heavy modules. Modules without backward spans are left out.
--
-- Parameters:
--   :run_id  the run (modtrace query --run RUN)
--
-- Columns:
--   fqn             module's fully qualified name
--   module_type     module's class name
--   forward_calls   forward spans
--   backward_calls  backward spans
--   forward_ms      inclusive forward time, milliseconds
--   backward_ms     inclusive backward time without the recompute inside it, milliseconds
--   recompute_ms    recompute that ran inside the module's backward spans, milliseconds
--   ratio           backward_ms / forward_ms (NULL when forward_ms is 0; such rows come last)
--   closed_at_end   backward spans closed at the end of the graph task instead of by a hook
WITH outer_recompute AS (
    -- recompute spans directly under a backward span (or at a root): each
    -- recomputed region once
    SELECT r.rank, r.thread_id, r.graph_task, r.span_id, r.exit_seq, r.duration_ns
    FROM spans r
    LEFT JOIN spans p ON p.run_id = r.run_id AND p.rank = r.rank AND p.span_id = r.parent_span_id
    WHERE r.run_id = :run_id
      AND r.phase = 'recompute'
      AND r.duration_ns IS NOT NULL
      AND (p.phase IS NULL OR p.phase <> 'recompute')
),
backward AS (
    SELECT rank, span_id, thread_id, graph_task, exit_seq, fqn, duration_ns, status
    FROM spans
    WHERE run_id = :run_id AND phase = 'backward'
),
inside AS (
    -- recompute time nested in each backward span (same rank, thread and
    -- graph task, between its enter and exit events)
    SELECT b.rank, b.span_id, SUM(o.duration_ns) AS recompute_ns
    FROM backward b
    JOIN outer_recompute o
      ON o.rank = b.rank
     AND o.thread_id = b.thread_id
     AND o.graph_task = b.graph_task
     AND o.span_id > b.span_id
     AND o.exit_seq < b.exit_seq
    GROUP BY b.rank, b.span_id
),
per_backward AS (
    SELECT
        b.fqn,
        COUNT(*) AS backward_calls,
        CAST(SUM(COALESCE(b.duration_ns, 0) - COALESCE(i.recompute_ns, 0)) AS DOUBLE PRECISION) AS backward_ns,
        CAST(SUM(COALESCE(i.recompute_ns, 0)) AS DOUBLE PRECISION) AS recompute_ns,
        SUM(CASE WHEN b.status = 'closed_at_end_of_backward' THEN 1 ELSE 0 END) AS closed_at_end
    FROM backward b
    LEFT JOIN inside i ON i.rank = b.rank AND i.span_id = b.span_id
    GROUP BY b.fqn
),
per_forward AS (
    SELECT
        fqn,
        module_type,
        COUNT(*) AS forward_calls,
        CAST(SUM(COALESCE(duration_ns, 0)) AS DOUBLE PRECISION) AS forward_ns
    FROM spans
    WHERE run_id = :run_id AND phase = 'forward'
    GROUP BY fqn, module_type
)
SELECT
    f.fqn,
    f.module_type,
    f.forward_calls,
    b.backward_calls,
    f.forward_ns / 1000000 AS forward_ms,
    b.backward_ns / 1000000 AS backward_ms,
    b.recompute_ns / 1000000 AS recompute_ms,
    b.backward_ns / NULLIF(f.forward_ns, 0) AS ratio,
    CAST(b.closed_at_end AS BIGINT) AS closed_at_end
FROM per_forward f
JOIN per_backward b ON b.fqn = f.fqn
ORDER BY CASE WHEN f.forward_ns > 0 THEN 0 ELSE 1 END, b.backward_ns / NULLIF(f.forward_ns, 0) DESC, f.fqn
