-- Nesting issues summary: what kinds of nesting problems and unusual closes a
-- run's events show, worst first.
--
-- A healthy record has no error or warning rows; info rows
-- (closed_at_end_of_backward, early_stop) are normal for modules whose inputs
-- need no gradient and for non-reentrant checkpointing. The nesting_issues
-- relation has one row per event with the full message.
--
-- Parameters:
--   :run_id  the run (modtrace query --run RUN)
--
-- Columns:
--   severity       error, warning or info
--   kind           issue kind (unclosed, crossed, no_enter, ...; see docs/schema.md)
--   phase          forward, backward or recompute
--   issues         rows of that severity, kind and phase
--   modules        distinct modules involved
--   steps          distinct steps involved
--   first_step     earliest step involved
--   first_seq      seq of the earliest event involved (on the lowest rank that has one)
--   example        message of that earliest event
WITH grouped AS (
    SELECT
        severity,
        kind,
        phase,
        COUNT(*) AS issues,
        COUNT(DISTINCT fqn) AS modules,
        COUNT(DISTINCT step) AS steps,
        MIN(step) AS first_step
    FROM nesting_issues
    WHERE run_id = :run_id
    GROUP BY severity, kind, phase
),
firsts AS (
    SELECT
        severity,
        kind,
        phase,
        seq,
        message,
        ROW_NUMBER() OVER (PARTITION BY severity, kind, phase ORDER BY rank, seq) AS pos
    FROM nesting_issues
    WHERE run_id = :run_id
)
SELECT
    g.severity,
    g.kind,
    g.phase,
    g.issues,
    g.modules,
    g.steps,
    g.first_step,
    f.seq AS first_seq,
    f.message AS example
FROM grouped g
JOIN firsts f ON f.severity = g.severity AND f.kind = g.kind AND f.phase = g.phase AND f.pos = 1
ORDER BY CASE g.severity WHEN 'error' THEN 0 WHEN 'warning' THEN 1 ELSE 2 END, g.issues DESC, g.kind, g.phase
