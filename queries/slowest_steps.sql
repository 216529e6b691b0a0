-- Slowest steps: the steps with the longest wall time, and the module that took
-- the most self time in each.
--
-- Steps follow the run's step rule and their wall time is defined as in
-- step_breakdown (both read the steps view): from the step's first span start
-- to the next step's first start on the same rank, or to its own last end when
-- that is later; the last step, and one whose next step was not recorded, ends
-- at its last span's end. Each rank's steps are ranked separately and listed
-- together, slowest first.
--
-- Parameters:
--   :run_id  the run (modtrace query --run RUN)
--   :limit   most rows to return (default: 10)
--
-- Columns:
--   rank           rank that recorded the step
--   step           step number under the run's step rule, from 0
--   step_rule      what makes a step: optimizer, manual or root (see docs/schema.md)
--   wall_ms        step wall time, milliseconds
--   module_ms      time inside module spans (sum of self time; threads running at once add up), milliseconds
--   vs_median_pct  wall time relative to the rank's median step, percent (100 = a typical step)
--   top_module     module with the most self time in the step
--   top_phase      phase of that time: forward, backward or recompute
--   top_ms         that module's self time in that phase, milliseconds
WITH walls AS (
    SELECT
        rank,
        step,
        step_rule,
        CAST(wall_ns AS DOUBLE PRECISION) AS wall_ns,
        CAST(forward_ns + backward_ns + recompute_ns AS DOUBLE PRECISION) AS module_ns
    FROM steps
    WHERE run_id = :run_id
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
        s.rank,
        t.step,
        s.fqn,
        s.phase,
        SUM(COALESCE(s.self_ns, 0)) AS self_ns
    FROM spans s
    JOIN span_steps t ON t.run_id = s.run_id AND t.rank = s.rank AND t.span_id = s.span_id
    WHERE s.run_id = :run_id AND t.run_id = :run_id
    GROUP BY s.rank, t.step, s.fqn, s.phase
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
    w.step_rule,
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
