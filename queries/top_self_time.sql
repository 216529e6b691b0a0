-- Top modules by self time: where a run's time goes, one row per module.
--
-- Self time is a span's duration minus its child spans' durations: the time
-- spent in the module's own code and in torch ops it called directly, not in
-- its submodules. Summed over the spans of every phase, all
-- steps and ranks; spans never exited count as calls but add no time.
--
-- Parameters:
--   :run_id  the run (modtrace query --run RUN; a name, id, @ or @~N)
--   :limit   most rows to return (default: 20)
--
-- Columns:
--   fqn             module's fully qualified name
--   module_type     module's class name
--   calls           forward calls (summed over ranks)
--   self_ms         total self time in all phases, milliseconds
--   self_pct        share of the run's total self time in modules, percent
--   forward_ms      self time in forward, milliseconds
--   backward_ms     self time in backward (and backward_call: modules called by backward code), milliseconds
--   recompute_ms    self time in activation-checkpoint recompute, milliseconds
--   self_us_per_call  self_ms per forward call, microseconds (NULL without forward calls)
WITH per_module AS (
    SELECT
        fqn,
        module_type,
        SUM(CASE WHEN phase = 'forward' THEN 1 ELSE 0 END) AS calls,
        CAST(SUM(COALESCE(self_ns, 0)) AS DOUBLE PRECISION) AS self_ns,
        CAST(SUM(CASE WHEN phase = 'forward' THEN COALESCE(self_ns, 0) ELSE 0 END) AS DOUBLE PRECISION) AS forward_ns,
        CAST(SUM(CASE WHEN phase IN ('backward', 'backward_call') THEN COALESCE(self_ns, 0) ELSE 0 END) AS DOUBLE PRECISION) AS backward_ns,
        CAST(SUM(CASE WHEN phase = 'recompute' THEN COALESCE(self_ns, 0) ELSE 0 END) AS DOUBLE PRECISION) AS recompute_ns
    FROM spans
    WHERE run_id = :run_id
    GROUP BY fqn, module_type
)
SELECT
    fqn,
    module_type,
    CAST(calls AS BIGINT) AS calls,
    self_ns / 1000000 AS self_ms,
    100 * self_ns / NULLIF(SUM(self_ns) OVER (), 0) AS self_pct,
    forward_ns / 1000000 AS forward_ms,
    backward_ns / 1000000 AS backward_ms,
    recompute_ns / 1000000 AS recompute_ms,
    self_ns / 1000 / NULLIF(calls, 0) AS self_us_per_call
FROM per_module
ORDER BY self_ns DESC, fqn
LIMIT :limit
