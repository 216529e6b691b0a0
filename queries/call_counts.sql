-- Call counts per module per step: how often each module ran in each phase of
-- each step, to spot modules called a varying number of times (data-dependent
-- control flow, a loop that grew, a module called twice by mistake).
--
-- Rows come in execution order within a step (by each module's first span).
-- A forward call without a backward span is normal for modules whose output
-- needs no gradient (eval-only paths, torch.no_grad).
--
-- Parameters:
--   :run_id  the run (modtrace query --run RUN)
--
-- Columns:
--   rank             rank that recorded the calls
--   step             step number, from 0
--   fqn              module's fully qualified name
--   forward_calls    forward spans of the module in the step
--   backward_calls   backward spans of the module in the step
--   recompute_calls  recompute spans of the module in the step
SELECT
    rank,
    step,
    fqn,
    CAST(SUM(CASE WHEN phase = 'forward' THEN 1 ELSE 0 END) AS BIGINT) AS forward_calls,
    CAST(SUM(CASE WHEN phase = 'backward' THEN 1 ELSE 0 END) AS BIGINT) AS backward_calls,
    CAST(SUM(CASE WHEN phase = 'recompute' THEN 1 ELSE 0 END) AS BIGINT) AS recompute_calls
FROM spans
WHERE run_id = :run_id
GROUP BY rank, step, fqn
ORDER BY rank, step, MIN(span_id)
