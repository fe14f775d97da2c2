-- Per-day rollups of usage records, kept by a trigger on every insert, so
-- GetUsage reads a few rows per (day, task, provider, model) instead of
-- every record of the period (an SMS pipeline writes millions a month).
-- Latencies are kept as a histogram: each record counts in the bucket of
-- its latency's floor, exact below 32 ms and within 1/32 (about 3 %) above
-- (`usage::summary::latency_floor` is the same arithmetic).
--
-- Lock order: a record is inserted after its team's ledger row is updated
-- (the ledger writers and the sweeper both), so a team's rollup rows are
-- only ever locked by a transaction that holds its ledger row: no cycles.

CREATE TABLE usage_rollup (
    team_id       TEXT   NOT NULL,
    day           BIGINT NOT NULL,            -- UTC day: created_at_ms / 86400000
    task          TEXT   NOT NULL,
    provider      TEXT   NOT NULL,
    model         TEXT   NOT NULL,
    requests      BIGINT NOT NULL DEFAULT 0,
    input_tokens  BIGINT NOT NULL DEFAULT 0,
    output_tokens BIGINT NOT NULL DEFAULT 0,
    cost_micros   BIGINT NOT NULL DEFAULT 0,  -- priced records only
    errors        BIGINT NOT NULL DEFAULT 0,
    degraded      BIGINT NOT NULL DEFAULT 0,
    unpriced      BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (team_id, day, task, provider, model)
);

CREATE TABLE usage_latency_rollup (
    team_id  TEXT   NOT NULL,
    day      BIGINT NOT NULL,
    task     TEXT   NOT NULL,
    provider TEXT   NOT NULL,
    model    TEXT   NOT NULL,
    floor_ms BIGINT NOT NULL,                 -- the bucket's lowest latency
    count    BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (team_id, day, task, provider, model, floor_ms)
);

-- Bucket widths: a latency in [lower_ms, 2 * lower_ms) falls in buckets of
-- `width` ms (32 per doubling), from 32 ms up.
CREATE TABLE latency_bucket_widths (
    lower_ms BIGINT PRIMARY KEY,
    width    BIGINT NOT NULL
);
INSERT INTO latency_bucket_widths
WITH RECURSIVE w(lower_ms, width) AS (
    SELECT 32::BIGINT, 1::BIGINT
    UNION ALL
    SELECT lower_ms * 2, width * 2 FROM w WHERE lower_ms < 2305843009213693952
)
SELECT lower_ms, width FROM w;

CREATE FUNCTION latency_floor(latency_ms BIGINT) RETURNS BIGINT
LANGUAGE sql STABLE AS $$
    SELECT CASE WHEN latency_ms < 32 THEN GREATEST(latency_ms, 0)
                ELSE latency_ms / w.width * w.width END
    FROM (SELECT COALESCE((SELECT width FROM latency_bucket_widths
                           WHERE lower_ms <= latency_ms
                           ORDER BY lower_ms DESC LIMIT 1), 1) AS width) w
$$;

CREATE FUNCTION usage_records_rollup() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO usage_rollup (team_id, day, task, provider, model, requests, input_tokens,
                              output_tokens, cost_micros, errors, degraded, unpriced)
    VALUES (NEW.team_id, NEW.created_at_ms / 86400000, NEW.task, NEW.provider, NEW.model, 1,
            NEW.input_tokens, NEW.output_tokens, COALESCE(NEW.cost_micros, 0),
            CASE WHEN NEW.outcome = 'ok' THEN 0 ELSE 1 END,
            CASE WHEN NEW.degraded <> 0 THEN 1 ELSE 0 END,
            CASE WHEN NEW.cost_micros IS NULL THEN 1 ELSE 0 END)
    ON CONFLICT (team_id, day, task, provider, model) DO UPDATE SET
        requests = usage_rollup.requests + 1,
        input_tokens = usage_rollup.input_tokens + EXCLUDED.input_tokens,
        output_tokens = usage_rollup.output_tokens + EXCLUDED.output_tokens,
        cost_micros = usage_rollup.cost_micros + EXCLUDED.cost_micros,
        errors = usage_rollup.errors + EXCLUDED.errors,
        degraded = usage_rollup.degraded + EXCLUDED.degraded,
        unpriced = usage_rollup.unpriced + EXCLUDED.unpriced;
    INSERT INTO usage_latency_rollup (team_id, day, task, provider, model, floor_ms, count)
    VALUES (NEW.team_id, NEW.created_at_ms / 86400000, NEW.task, NEW.provider, NEW.model,
            latency_floor(NEW.latency_ms), 1)
    ON CONFLICT (team_id, day, task, provider, model, floor_ms) DO UPDATE SET
        count = usage_latency_rollup.count + 1;
    RETURN NULL;
END
$$;

CREATE TRIGGER usage_records_rollup AFTER INSERT ON usage_records
FOR EACH ROW EXECUTE FUNCTION usage_records_rollup();

-- The records already written.
INSERT INTO usage_rollup (team_id, day, task, provider, model, requests, input_tokens,
                          output_tokens, cost_micros, errors, degraded, unpriced)
SELECT team_id, created_at_ms / 86400000, task, provider, model, COUNT(*),
       SUM(input_tokens), SUM(output_tokens), SUM(COALESCE(cost_micros, 0)),
       SUM(CASE WHEN outcome = 'ok' THEN 0 ELSE 1 END),
       SUM(CASE WHEN degraded <> 0 THEN 1 ELSE 0 END),
       SUM(CASE WHEN cost_micros IS NULL THEN 1 ELSE 0 END)
FROM usage_records
GROUP BY team_id, created_at_ms / 86400000, task, provider, model;

INSERT INTO usage_latency_rollup (team_id, day, task, provider, model, floor_ms, count)
SELECT team_id, created_at_ms / 86400000, task, provider, model, latency_floor(latency_ms), COUNT(*)
FROM usage_records
GROUP BY team_id, created_at_ms / 86400000, task, provider, model, latency_floor(latency_ms);
