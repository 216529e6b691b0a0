-- Modules furthest below the run's median throughput: achieved FLOP/s per module and phase on the counted steps.
--
-- A module's achieved throughput is its own FLOPs (spans.flops_self) over its
-- own time (device self time where the run has it, else host self time),
-- summed over its spans of the counted steps (the spans with counters; see
-- runs.counters and "Work counters" in docs/schema.md). Modules and phases
-- whose own ops do no FLOPs are left out. Arithmetic intensity is FLOPs per
-- byte of its ops' tensor inputs and outputs. vs_median is a module's
-- throughput over the median of every listed module's: the lowest first.
--
-- Parameters:
--   :run_id  the run (modtrace query --run RUN; a name, id, @ or @~N)
--   :limit   most rows to return (default: 20)
--
-- Columns:
--   fqn            module's fully qualified name
--   phase          forward, backward, recompute or backward_call
--   spans          counted spans of the module in that phase (summed over ranks)
--   flops          FLOPs of the module's own ops in those spans
--   bytes          bytes of the module's own ops' tensor inputs and outputs
--   self_ms        the spans' self time, milliseconds (device self time where the run has it)
--   gflop_per_s    achieved throughput: flops / self time, GFLOP/s
--   flop_per_byte  arithmetic intensity: flops / bytes
--   vs_median      gflop_per_s over the median gflop_per_s of the listed modules and phases
--   unknown_ops    the module's own ops with no FLOP formula: flops is a lower bound when not 0
WITH per_module AS (
    SELECT
        fqn,
        phase,
        COUNT(*) AS spans,
        CAST(SUM(flops_self) AS BIGINT) AS flops,
        CAST(SUM(bytes_self) AS BIGINT) AS bytes,
        CAST(SUM(COALESCE(device_self_ns, self_ns)) AS BIGINT) AS self_ns,
        CAST(SUM(unknown_ops_self) AS BIGINT) AS unknown_ops
    FROM spans
    WHERE run_id = :run_id AND flops_self IS NOT NULL AND self_ns IS NOT NULL
    GROUP BY fqn, phase
    HAVING SUM(flops_self) > 0 AND SUM(COALESCE(device_self_ns, self_ns)) > 0
),
rated AS (
    SELECT
        fqn, phase, spans, flops, bytes, self_ns, unknown_ops,
        CAST(flops AS DOUBLE PRECISION) / self_ns AS gflop_per_s,
        ROW_NUMBER() OVER (ORDER BY CAST(flops AS DOUBLE PRECISION) / self_ns, fqn, phase) AS pos,
        COUNT(*) OVER () AS n
    FROM per_module
),
middle AS (
    SELECT AVG(gflop_per_s) AS gflop_per_s FROM rated WHERE pos IN ((n + 1) / 2, (n + 2) / 2)
)
SELECT
    r.fqn,
    r.phase,
    CAST(r.spans AS BIGINT) AS spans,
    r.flops,
    r.bytes,
    CAST(r.self_ns AS DOUBLE PRECISION) / 1000000 AS self_ms,
    r.gflop_per_s,
    CAST(r.flops AS DOUBLE PRECISION) / NULLIF(r.bytes, 0) AS flop_per_byte,
    r.gflop_per_s / NULLIF(m.gflop_per_s, 0) AS vs_median,
    r.unknown_ops
FROM rated r
CROSS JOIN middle m
ORDER BY r.pos
LIMIT :limit
