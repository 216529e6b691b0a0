-- Per-step breakdown: how each step's wall time splits into forward, backward,
-- recompute and time outside any module.
--
-- Step time is defined once for every view of a step (docs/schema.md, "Step
-- time"): the summed duration of the step's root spans (depth 0, every phase),
-- i.e. the time inside module calls. It splits into phases by self time, so
-- nested modules are not counted twice: forward + backward + recompute = step
-- time (recompute runs inside backward spans and is counted only as
-- recompute; a backward_call, a module called by backward code, counts as
-- backward). A step's wall time runs from its first span's start to the next
-- step's first start on the same rank (so the optimizer step and data loading
-- that follow a step's backward count as its outside time); the last step ends
-- at its last span's end. outside = wall - step time. Threads that run modules
-- concurrently can make outside negative.
--
-- Parameters:
--   :run_id  the run (modtrace query --run RUN)
--
-- Columns:
--   rank          rank that recorded the step
--   step          step number, from 0
--   wall_ms       step wall time (see above), milliseconds
--   step_ms       step time: time inside root module spans, milliseconds
--   forward_ms    time in forward module code, milliseconds
--   backward_ms   time in backward module spans (and backward_call spans), milliseconds
--   recompute_ms  time recomputing checkpointed forwards during backward, milliseconds
--   outside_ms    wall time outside any module span, milliseconds
--   module_pct    share of wall time inside module spans (step / wall), percent
--   spans         spans entered in the step (all phases)
WITH per_step AS (
    SELECT
        rank,
        step,
        MIN(start_ns) AS start_ns,
        MAX(COALESCE(end_ns, start_ns)) AS last_ns,
        SUM(CASE WHEN phase = 'forward' THEN COALESCE(self_ns, 0) ELSE 0 END) AS forward_ns,
        SUM(CASE WHEN phase IN ('backward', 'backward_call') THEN COALESCE(self_ns, 0) ELSE 0 END) AS backward_ns,
        SUM(CASE WHEN phase = 'recompute' THEN COALESCE(self_ns, 0) ELSE 0 END) AS recompute_ns,
        SUM(CASE WHEN depth = 0 THEN COALESCE(duration_ns, 0) ELSE 0 END) AS step_ns,
        COUNT(*) AS spans
    FROM spans
    WHERE run_id = :run_id
    GROUP BY rank, step
),
bounded AS (
    SELECT
        rank,
        step,
        CAST(COALESCE(CASE WHEN LEAD(step) OVER (PARTITION BY rank ORDER BY step) = step + 1 THEN LEAD(start_ns) OVER (PARTITION BY rank ORDER BY step) END, last_ns) - start_ns AS DOUBLE PRECISION) AS wall_ns,
        CAST(forward_ns AS DOUBLE PRECISION) AS forward_ns,
        CAST(backward_ns AS DOUBLE PRECISION) AS backward_ns,
        CAST(recompute_ns AS DOUBLE PRECISION) AS recompute_ns,
        CAST(step_ns AS DOUBLE PRECISION) AS step_ns,
        spans
    FROM per_step
)
SELECT
    rank,
    step,
    wall_ns / 1000000 AS wall_ms,
    step_ns / 1000000 AS step_ms,
    forward_ns / 1000000 AS forward_ms,
    backward_ns / 1000000 AS backward_ms,
    recompute_ns / 1000000 AS recompute_ms,
    (wall_ns - step_ns) / 1000000 AS outside_ms,
    100 * step_ns / NULLIF(wall_ns, 0) AS module_pct,
    spans
FROM bounded
ORDER BY rank, step
