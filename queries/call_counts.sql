-- Call counts per module per step: how often each module ran in each phase of
-- each step, to spot modules called a varying number of times (data-dependent
-- control flow, a loop that grew, a module called twice by mistake).
--
-- Steps follow the run's step rule (span_steps). Rows come in execution order
-- within a step (by each module's first span).
-- A forward call without a backward span is normal for modules whose output
-- needs no gradient (eval-only paths, torch.no_grad).
--
-- Parameters:
--   :run_id  the run (modtrace query --run RUN)
--
-- Columns:
--   rank             rank that recorded the calls
--   step             step number under the run's step rule, from 0
--   fqn              module's fully qualified name
--   forward_calls    forward spans of the module in the step
--   backward_calls   backward spans of the module in the step
--   recompute_calls  recompute spans of the module in the step
SELECT
    s.rank,
    t.step,
    s.fqn,
    CAST(SUM(CASE WHEN s.phase = 'forward' THEN 1 ELSE 0 END) AS BIGINT) AS forward_calls,
    CAST(SUM(CASE WHEN s.phase = 'backward' THEN 1 ELSE 0 END) AS BIGINT) AS backward_calls,
    CAST(SUM(CASE WHEN s.phase = 'recompute' THEN 1 ELSE 0 END) AS BIGINT) AS recompute_calls
FROM spans s
JOIN span_steps t ON t.run_id = s.run_id AND t.rank = s.rank AND t.span_id = s.span_id
WHERE s.run_id = :run_id AND t.run_id = :run_id
GROUP BY s.rank, t.step, s.fqn
ORDER BY s.rank, t.step, MIN(s.span_id)
