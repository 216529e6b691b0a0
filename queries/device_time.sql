-- Modules with the most device time: what the GPU spent in each module, one row per module.
--
-- Device self time is a span's device duration minus the device durations
-- of its children on the same device and stream (see spans.device_self_ns):
-- the kernels the module launched itself, and the idle gaps of its stream
-- inside the call. Summed over forward, backward and recompute spans of all
-- steps and ranks. Only runs recorded on CUDA with device time have it; on
-- other runs every module is listed with NULL device times.
--
-- Parameters:
--   :run_id  the run (modtrace query --run RUN; a name, id, @ or @~N)
--   :limit   most rows to return (default: 20)
--
-- Columns:
--   fqn             module's fully qualified name
--   module_type     module's class name
--   calls           forward calls (summed over ranks)
--   timed_spans     spans of the module with a device time
--   device_self_ms  total device self time in all phases, milliseconds (NULL without device time)
--   device_self_pct  share of the run's total device self time in modules, percent
--   device_ms       total device time of its calls, children included, milliseconds
--   host_self_ms    host self time of the same spans, milliseconds: launching versus running
WITH per_module AS (
    SELECT
        fqn,
        module_type,
        SUM(CASE WHEN phase = 'forward' THEN 1 ELSE 0 END) AS calls,
        COUNT(device_duration_ns) AS timed_spans,
        CAST(SUM(device_self_ns) AS DOUBLE PRECISION) AS device_self_ns,
        CAST(SUM(device_duration_ns) AS DOUBLE PRECISION) AS device_ns,
        CAST(SUM(CASE WHEN device_duration_ns IS NOT NULL THEN self_ns END) AS DOUBLE PRECISION) AS host_self_ns
    FROM spans
    WHERE run_id = :run_id
    GROUP BY fqn, module_type
)
SELECT
    fqn,
    module_type,
    CAST(calls AS BIGINT) AS calls,
    CAST(timed_spans AS BIGINT) AS timed_spans,
    device_self_ns / 1000000 AS device_self_ms,
    100 * device_self_ns / NULLIF(SUM(device_self_ns) OVER (), 0) AS device_self_pct,
    device_ns / 1000000 AS device_ms,
    host_self_ns / 1000000 AS host_self_ms
FROM per_module
ORDER BY CASE WHEN device_self_ns IS NULL THEN 1 ELSE 0 END, device_self_ns DESC, fqn
LIMIT :limit
