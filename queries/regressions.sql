-- Regressions between two runs: which modules got slower (or faster) per
-- step, comparing a baseline run with a candidate run.
--
-- Modules are matched by fully qualified name and phase. Times are self time
-- per step (summed over ranks, divided by the run's number of rank-steps, its
-- steps under its step rule as the steps view counts them), so
-- runs of different lengths compare, and the extra time shows up on the module
-- that spends it rather than on every ancestor. change is slower or faster when
-- the per-step self time moved by more than :threshold_pct percent, else same;
-- added or removed when the module (in that phase) ran in only one of the
-- runs. Rows are ordered by the time gained per step, largest first.
--
-- Parameters:
--   :base_run       the baseline run (a name, id, @ or @~N)
--   :cand_run       the candidate run compared with it
--   :threshold_pct  smallest change in percent that counts as slower or faster (default: 5)
--   :limit          most rows to return (default: 50)
--
-- Columns:
--   fqn                    module's fully qualified name
--   phase                  forward, backward or recompute
--   change                 slower, faster, same, added or removed
--   base_calls_per_step    calls per step in the baseline (NULL when absent there)
--   cand_calls_per_step    calls per step in the candidate (NULL when absent there)
--   base_ms_per_step       self time per step in the baseline, milliseconds
--   cand_ms_per_step       self time per step in the candidate, milliseconds
--   delta_ms_per_step      cand_ms_per_step - base_ms_per_step (absent counts as 0), milliseconds
--   delta_pct              delta as a share of the baseline, percent (NULL when added)
WITH base_steps AS (
    SELECT CAST(COUNT(*) AS DOUBLE PRECISION) AS n
    FROM steps
    WHERE run_id = :base_run
),
cand_steps AS (
    SELECT CAST(COUNT(*) AS DOUBLE PRECISION) AS n
    FROM steps
    WHERE run_id = :cand_run
),
base AS (
    SELECT fqn, phase, COUNT(*) AS calls, CAST(SUM(COALESCE(self_ns, 0)) AS DOUBLE PRECISION) AS self_ns
    FROM spans
    WHERE run_id = :base_run
    GROUP BY fqn, phase
),
cand AS (
    SELECT fqn, phase, COUNT(*) AS calls, CAST(SUM(COALESCE(self_ns, 0)) AS DOUBLE PRECISION) AS self_ns
    FROM spans
    WHERE run_id = :cand_run
    GROUP BY fqn, phase
),
keyed AS (
    SELECT fqn, phase FROM base
    UNION
    SELECT fqn, phase FROM cand
),
compared AS (
    SELECT
        k.fqn,
        k.phase,
        b.calls / bs.n AS base_calls,
        c.calls / cs.n AS cand_calls,
        b.self_ns / bs.n / 1000000 AS base_ms,
        c.self_ns / cs.n / 1000000 AS cand_ms
    FROM keyed k
    LEFT JOIN base b ON b.fqn = k.fqn AND b.phase = k.phase
    LEFT JOIN cand c ON c.fqn = k.fqn AND c.phase = k.phase
    CROSS JOIN base_steps bs
    CROSS JOIN cand_steps cs
)
SELECT
    fqn,
    phase,
    CASE
        WHEN base_ms IS NULL THEN 'added'
        WHEN cand_ms IS NULL THEN 'removed'
        WHEN cand_ms > base_ms * (1 + :threshold_pct / 100.0) THEN 'slower'
        WHEN cand_ms < base_ms * (1 - :threshold_pct / 100.0) THEN 'faster'
        ELSE 'same'
    END AS change,
    base_calls AS base_calls_per_step,
    cand_calls AS cand_calls_per_step,
    base_ms AS base_ms_per_step,
    cand_ms AS cand_ms_per_step,
    COALESCE(cand_ms, 0) - COALESCE(base_ms, 0) AS delta_ms_per_step,
    100 * (COALESCE(cand_ms, 0) - COALESCE(base_ms, 0)) / NULLIF(base_ms, 0) AS delta_pct
FROM compared
ORDER BY COALESCE(cand_ms, 0) - COALESCE(base_ms, 0) DESC, fqn, phase
LIMIT :limit
