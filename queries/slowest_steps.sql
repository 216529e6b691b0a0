-- Slowest steps: the steps with the longest wall time, and the module that took
-- the most self time in each.
--
-- Step wall time is defined as in step_breakdown: from the step's first span
-- start to the next step's first start on the same rank (the last step, and one
-- whose next step was not recorded, ends at its last span's end). Each rank's steps are ranked separately and listed
-- together, slowest first.
--
-- Parameters:
--   :run_id  the run (modtrace query --run RUN)
--   :limit   most rows to return (default: 10)
--
-- Columns:
--   rank           rank that recorded the step
--   step           step number, from 0
--   wall_ms        step wall time, milliseconds
--   module_ms      time inside module spans (sum of self time), milliseconds
--   vs_median_pct  wall time relative to the rank's median step, percent (100 = a typical step)
--   top_module     module with the most self time in the step
--   top_phase      phase of that time: forward, backward or recompute
--   top_ms         that module's self time in that phase, milliseconds
WITH per_step AS (
    SELECT
        rank,
        step,
        MIN(start_ns) AS start_ns,
        MAX(COALESCE(end_ns, start_ns)) AS last_ns,
        SUM(COALESCE(self_ns, 0)) AS module_ns
    FROM spans
    WHERE run_id = :run_id
    GROUP BY rank, step
),
walls AS (
    SELECT
        rank,
        step,
        CAST(COALESCE(CASE WHEN LEAD(step) OVER (PARTITION BY rank ORDER BY step) = step + 1 THEN LEAD(start_ns) OVER (PARTITION BY rank ORDER BY step) END, last_ns) - start_ns AS DOUBLE PRECISION) AS wall_ns,
        CAST(module_ns AS DOUBLE PRECISION) AS module_ns
    FROM per_step
),
ordered AS (
    SELECT
        rank,
        wall_ns,
        ROW_NUMBER() OVER (PARTITION BY rank ORDER BY wall_ns, step) AS pos,
        COUNT(*) OVER (PARTITION BY rank) AS n
    FROM walls
),
medians AS (
    -- the middle step, or the mean of the two middle ones
    SELECT rank, AVG(wall_ns) AS median_ns
    FROM ordered
    WHERE pos IN ((n + 1) / 2, (n + 2) / 2)
    GROUP BY rank
),
module_time AS (
    SELECT
        rank,
        step,
        fqn,
        phase,
        SUM(COALESCE(self_ns, 0)) AS self_ns
    FROM spans
    WHERE run_id = :run_id
    GROUP BY rank, step, fqn, phase
),
top_module AS (
    SELECT
        rank,
        step,
        fqn,
        phase,
        self_ns,
        ROW_NUMBER() OVER (PARTITION BY rank, step ORDER BY self_ns DESC, fqn, phase) AS pos
    FROM module_time
)
SELECT
    w.rank,
    w.step,
    w.wall_ns / 1000000 AS wall_ms,
    w.module_ns / 1000000 AS module_ms,
    100 * w.wall_ns / NULLIF(m.median_ns, 0) AS vs_median_pct,
    t.fqn AS top_module,
    t.phase AS top_phase,
    CAST(t.self_ns AS DOUBLE PRECISION) / 1000000 AS top_ms
FROM walls w
JOIN medians m ON m.rank = w.rank
LEFT JOIN top_module t ON t.rank = w.rank AND t.step = w.step AND t.pos = 1
ORDER BY w.wall_ns DESC, w.rank, w.step
LIMIT :limit
