-- Modules with the biggest memory deltas: which module calls leave device memory allocated.
--
-- A span's memory delta is the bytes allocated on its device at its exit
-- minus at its enter (spans.mem_delta_bytes, torch.cuda.memory_allocated
-- read on the host): what the call left allocated, e.g. activations kept
-- for the backward. One row per module and phase, over all steps and
-- ranks. Only runs recorded on CUDA with device time have it; on other runs
-- every module is listed with NULL memory columns.
--
-- Parameters:
--   :run_id  the run (modtrace query --run RUN; a name, id, @ or @~N)
--   :limit   most rows to return (default: 20)
--
-- Columns:
--   fqn              module's fully qualified name
--   module_type      module's class name
--   phase            forward, backward or recompute
--   calls            spans of the module in that phase with a memory delta
--   max_delta_bytes  the biggest memory delta of one call, bytes (NULL without memory readings)
--   mean_delta_bytes  the mean memory delta per call, bytes
--   peak_bytes       the most allocated at any event inside one of its calls, bytes
SELECT
    fqn,
    module_type,
    phase,
    CAST(COUNT(mem_delta_bytes) AS BIGINT) AS calls,
    CAST(MAX(mem_delta_bytes) AS BIGINT) AS max_delta_bytes,
    CAST(AVG(CAST(mem_delta_bytes AS DOUBLE PRECISION)) AS DOUBLE PRECISION) AS mean_delta_bytes,
    CAST(MAX(mem_max_bytes) AS BIGINT) AS peak_bytes
FROM spans
WHERE run_id = :run_id
GROUP BY fqn, module_type, phase
ORDER BY CASE WHEN MAX(mem_delta_bytes) IS NULL THEN 1 ELSE 0 END, MAX(mem_delta_bytes) DESC, fqn, phase
LIMIT :limit
