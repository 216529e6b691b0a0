-- Rank stragglers: for each step, how far apart the ranks' step times are and
-- which rank was slowest.
--
-- Steps follow the run's step rule and a rank's step time is its wall time as
-- step_breakdown defines it (both read the steps view: first span start to the
-- next step's first start on that rank, or to the step's own last end when
-- that is later; the last step, and one whose next step was not recorded, ends
-- at its last span's end). Ranks' clocks are not compared, only their step
-- durations. A rank that never reached a step is missing from that step's row
-- (see ranks).
--
-- Parameters:
--   :run_id  the run (modtrace query --run RUN)
--
-- Columns:
--   step            step number under the run's step rule, from 0
--   ranks           ranks that recorded the step
--   fastest_ms      shortest step time among the ranks, milliseconds
--   mean_ms         mean step time over the ranks, milliseconds
--   slowest_ms      longest step time among the ranks, milliseconds
--   spread_ms       slowest_ms - fastest_ms, milliseconds
--   spread_pct      spread as a share of the fastest step time, percent
--   slowest_rank    the rank with the longest step time (lowest rank on ties)
WITH walls AS (
    SELECT
        rank,
        step,
        CAST(wall_ns AS DOUBLE PRECISION) AS wall_ns
    FROM steps
    WHERE run_id = :run_id
),
ranked AS (
    SELECT
        rank,
        step,
        wall_ns,
        ROW_NUMBER() OVER (PARTITION BY step ORDER BY wall_ns DESC, rank) AS pos
    FROM walls
)
SELECT
    step,
    COUNT(*) AS ranks,
    MIN(wall_ns) / 1000000 AS fastest_ms,
    AVG(wall_ns) / 1000000 AS mean_ms,
    MAX(wall_ns) / 1000000 AS slowest_ms,
    (MAX(wall_ns) - MIN(wall_ns)) / 1000000 AS spread_ms,
    100 * (MAX(wall_ns) - MIN(wall_ns)) / NULLIF(MIN(wall_ns), 0) AS spread_pct,
    MIN(CASE WHEN pos = 1 THEN rank END) AS slowest_rank
FROM ranked
GROUP BY step
ORDER BY step
