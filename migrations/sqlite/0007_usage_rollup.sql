-- Per-day rollups of usage records, kept by a trigger on every insert, so
-- GetUsage reads a few rows per (day, task, provider, model) instead of
-- every record of the period (an SMS pipeline writes millions a month).
-- Latencies are kept as a histogram: each record counts in the bucket of
-- its latency's floor, exact below 32 ms and within 1/32 (about 3 %) above
-- (`usage::summary::latency_floor` is the same arithmetic).

CREATE TABLE usage_rollup (
    team_id       TEXT    NOT NULL,
    day           INTEGER NOT NULL,            -- UTC day: created_at_ms / 86400000
    task          TEXT    NOT NULL,
    provider      TEXT    NOT NULL,
    model         TEXT    NOT NULL,
    requests      INTEGER NOT NULL DEFAULT 0,
    input_tokens  INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cost_micros   INTEGER NOT NULL DEFAULT 0,  -- priced records only
    errors        INTEGER NOT NULL DEFAULT 0,
    degraded      INTEGER NOT NULL DEFAULT 0,
    unpriced      INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (team_id, day, task, provider, model)
) WITHOUT ROWID;

CREATE TABLE usage_latency_rollup (
    team_id  TEXT    NOT NULL,
    day      INTEGER NOT NULL,
    task     TEXT    NOT NULL,
    provider TEXT    NOT NULL,
    model    TEXT    NOT NULL,
    floor_ms INTEGER NOT NULL,                 -- the bucket's lowest latency
    count    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (team_id, day, task, provider, model, floor_ms)
) WITHOUT ROWID;

-- Bucket widths: a latency in [lower_ms, 2 * lower_ms) falls in buckets of
-- `width` ms (32 per doubling), from 32 ms up.
CREATE TABLE latency_bucket_widths (
    lower_ms INTEGER PRIMARY KEY,
    width    INTEGER NOT NULL
);
WITH RECURSIVE w(lower_ms, width) AS (
    SELECT 32, 1
    UNION ALL
    SELECT lower_ms * 2, width * 2 FROM w WHERE lower_ms < 2305843009213693952
)
INSERT INTO latency_bucket_widths SELECT lower_ms, width FROM w;

CREATE TRIGGER usage_records_rollup AFTER INSERT ON usage_records
BEGIN
    INSERT INTO usage_rollup (team_id, day, task, provider, model, requests, input_tokens,
                              output_tokens, cost_micros, errors, degraded, unpriced)
    VALUES (NEW.team_id, NEW.created_at_ms / 86400000, NEW.task, NEW.provider, NEW.model, 1,
            NEW.input_tokens, NEW.output_tokens, COALESCE(NEW.cost_micros, 0),
            CASE WHEN NEW.outcome = 'ok' THEN 0 ELSE 1 END,
            CASE WHEN NEW.degraded <> 0 THEN 1 ELSE 0 END,
            CASE WHEN NEW.cost_micros IS NULL THEN 1 ELSE 0 END)
    ON CONFLICT (team_id, day, task, provider, model) DO UPDATE SET
        requests = requests + 1,
        input_tokens = input_tokens + excluded.input_tokens,
        output_tokens = output_tokens + excluded.output_tokens,
        cost_micros = cost_micros + excluded.cost_micros,
        errors = errors + excluded.errors,
        degraded = degraded + excluded.degraded,
        unpriced = unpriced + excluded.unpriced;
    INSERT INTO usage_latency_rollup (team_id, day, task, provider, model, floor_ms, count)
    VALUES (NEW.team_id, NEW.created_at_ms / 86400000, NEW.task, NEW.provider, NEW.model,
            CASE WHEN NEW.latency_ms < 32 THEN max(NEW.latency_ms, 0)
                 ELSE NEW.latency_ms / (SELECT width FROM latency_bucket_widths
                                        WHERE lower_ms <= NEW.latency_ms
                                        ORDER BY lower_ms DESC LIMIT 1)
                      * (SELECT width FROM latency_bucket_widths
                         WHERE lower_ms <= NEW.latency_ms
                         ORDER BY lower_ms DESC LIMIT 1)
            END, 1)
    ON CONFLICT (team_id, day, task, provider, model, floor_ms) DO UPDATE SET
        count = count + 1;
END;

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
SELECT team_id, day, task, provider, model, floor_ms, COUNT(*) FROM (
    SELECT team_id, created_at_ms / 86400000 AS day, task, provider, model,
           CASE WHEN latency_ms < 32 THEN max(latency_ms, 0)
                ELSE latency_ms / (SELECT width FROM latency_bucket_widths
                                   WHERE lower_ms <= latency_ms ORDER BY lower_ms DESC LIMIT 1)
                     * (SELECT width FROM latency_bucket_widths
                        WHERE lower_ms <= latency_ms ORDER BY lower_ms DESC LIMIT 1)
           END AS floor_ms
    FROM usage_records
)
GROUP BY team_id, day, task, provider, model, floor_ms;
