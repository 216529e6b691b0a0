-- Device placement and stream use per module: where each module computed,
-- on which accelerator stream, and how much time it spent there.
--
-- Device and stream are taken at each span's enter. A module listed on more
-- than one device or stream moved (or was called with inputs on different
-- devices); device is NULL when a call had no tensor input, parameter or
-- buffer, and stream is NULL on CPU.
--
-- Parameters:
--   :run_id  the run (modtrace query --run RUN)
--
-- Columns:
--   fqn              module's fully qualified name
--   module_type      module's class name
--   device           device the calls computed on (cpu, cuda:0, ...)
--   stream           accelerator stream handle; NULL on CPU
--   forward_calls    forward spans on this device and stream
--   backward_calls   backward spans on this device and stream
--   recompute_calls  recompute spans on this device and stream
--   self_ms          self time of those spans, milliseconds
--   placements       number of (device, stream) pairs the module used in the run
WITH per_place AS (
    SELECT
        fqn,
        module_type,
        device,
        stream,
        SUM(CASE WHEN phase = 'forward' THEN 1 ELSE 0 END) AS forward_calls,
        SUM(CASE WHEN phase = 'backward' THEN 1 ELSE 0 END) AS backward_calls,
        SUM(CASE WHEN phase = 'recompute' THEN 1 ELSE 0 END) AS recompute_calls,
        CAST(SUM(COALESCE(self_ns, 0)) AS DOUBLE PRECISION) AS self_ns,
        MIN(span_id) AS first_span
    FROM spans
    WHERE run_id = :run_id
    GROUP BY fqn, module_type, device, stream
)
SELECT
    fqn,
    module_type,
    device,
    stream,
    CAST(forward_calls AS BIGINT) AS forward_calls,
    CAST(backward_calls AS BIGINT) AS backward_calls,
    CAST(recompute_calls AS BIGINT) AS recompute_calls,
    self_ns / 1000000 AS self_ms,
    COUNT(*) OVER (PARTITION BY fqn) AS placements
FROM per_place
ORDER BY placements DESC, fqn, first_span
