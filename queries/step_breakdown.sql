-- Per-step breakdown: how each step's wall time splits into forward, backward,
-- recompute and time outside any module.
--
-- Steps follow the run's step rule (optimizer steps, or root calls for an
-- inference or serving run, as modtrace runs counts them; step_rule says
-- which), and their times are defined once for every view of a step
-- (docs/schema.md, "Step time"); this query reads them from the steps view.
-- Step time is the time inside module calls: the union of the step's root
-- spans (depth 0, every phase), so root calls that threads ran at once count
-- once. It splits into phases by self time: forward + backward + recompute =
-- step time when the step's root spans do not overlap (recompute runs inside
-- backward spans and is counted only as recompute). A step's wall time runs
-- from its first span's start to the next step's first start on the same rank
-- (so the optimizer step and data loading that follow a step's backward count
-- as its outside time), or to its own last end when that is later (requests
-- overlapping on threads); the last step ends at its last span's end.
-- outside = wall - step time.
--
-- Parameters:
--   :run_id  the run (modtrace query --run RUN)
--
-- Columns:
--   rank          rank that recorded the step
--   step          step number under the run's step rule, from 0
--   step_rule     what makes a step: optimizer, manual or root (see docs/schema.md)
--   wall_ms       step wall time (see above), milliseconds
--   step_ms       step time: time inside root module spans, milliseconds
--   forward_ms    time in forward module code, milliseconds
--   backward_ms   time in backward module spans (and backward_call spans), milliseconds
--   recompute_ms  time recomputing checkpointed forwards during backward, milliseconds
--   outside_ms    wall time outside any module span, milliseconds
--   module_pct    share of wall time inside module spans (step / wall), percent
--   spans         spans entered in the step (all phases)
SELECT
    rank,
    step,
    step_rule,
    CAST(wall_ns AS DOUBLE PRECISION) / 1000000 AS wall_ms,
    CAST(step_ns AS DOUBLE PRECISION) / 1000000 AS step_ms,
    CAST(forward_ns AS DOUBLE PRECISION) / 1000000 AS forward_ms,
    CAST(backward_ns AS DOUBLE PRECISION) / 1000000 AS backward_ms,
    CAST(recompute_ns AS DOUBLE PRECISION) / 1000000 AS recompute_ms,
    CAST(wall_ns - step_ns AS DOUBLE PRECISION) / 1000000 AS outside_ms,
    100 * CAST(step_ns AS DOUBLE PRECISION) / NULLIF(wall_ns, 0) AS module_pct,
    spans
FROM steps
WHERE run_id = :run_id
ORDER BY rank, step
