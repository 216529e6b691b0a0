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
WITH backward AS (
    SELECT rank, thread_id, graph_task, span_id, exit_seq, fqn, duration_ns, self_ns, status
    FROM spans
    WHERE run_id = :run_id AND phase = 'backward'
),
marks AS (
    -- per stack (rank, thread, graph task) in seq order: each backward span's
    -- self time at its enter, and a zero at its exit
    SELECT rank, thread_id, graph_task, span_id AS seq, COALESCE(self_ns, 0) AS ns, 0 AS is_exit,
           span_id AS owner, fqn, duration_ns, status
    FROM backward
    UNION ALL
    SELECT rank, thread_id, graph_task, exit_seq AS seq, 0 AS ns, 1 AS is_exit,
           span_id AS owner, fqn, duration_ns, status
    FROM backward
    WHERE exit_seq IS NOT NULL
),
running AS (
    SELECT
        rank,
        owner,
        fqn,
        duration_ns,
        status,
        ns,
        is_exit,
        SUM(ns) OVER (PARTITION BY rank, thread_id, graph_task ORDER BY seq ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS total
    FROM marks
),
inside AS (
    -- each backward span's time in backward code: the backward self time of
    -- its subtree (the running total gained from its enter to its exit, plus
    -- its own). What its duration has beyond that is recompute nested in it.
    SELECT
        MAX(fqn) AS fqn,
        MAX(duration_ns) AS duration_ns,
        MAX(status) AS status,
        CASE WHEN COUNT(*) = 2 THEN
            SUM(CASE WHEN is_exit = 1 THEN total ELSE 0 END) - SUM(CASE WHEN is_exit = 0 THEN total ELSE 0 END) + SUM(ns)
        ELSE 0 END AS backward_ns
    FROM running
    GROUP BY rank, owner
),
per_backward AS (
    SELECT
        fqn,
        COUNT(*) AS backward_calls,
        CAST(SUM(backward_ns) AS DOUBLE PRECISION) AS backward_ns,
        CAST(SUM(COALESCE(duration_ns, 0) - backward_ns) AS DOUBLE PRECISION) AS recompute_ns,
        SUM(CASE WHEN status = 'closed_at_end_of_backward' THEN 1 ELSE 0 END) AS closed_at_end
    FROM inside
    GROUP BY fqn
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
