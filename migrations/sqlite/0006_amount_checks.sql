-- Amounts can never be negative, and never overflow into SQLite's floating
-- point (an INTEGER column silently stores an overflowing sum as REAL).
-- The service validates every amount before it is written (plausible token
-- counts, bounded prices, saturating sums); these constraints make a bug
-- fail its own statement instead of corrupting a team's month. A batch that
-- fails one is retried operation by operation, so only the bad one fails
-- (docs/metering.md).
--
-- SQLite cannot add a CHECK to a table, so each table is copied once into
-- one that has it. Rows that broke the rule before (the overflow this
-- fixes) are clamped to [0, i64::MAX] on the way.
CREATE TABLE usage_ledger_checked (
    team_id            TEXT    NOT NULL,
    month_start_ms     INTEGER NOT NULL,
    spent_tokens       INTEGER NOT NULL DEFAULT 0 CHECK (typeof(spent_tokens) = 'integer' AND spent_tokens >= 0),
    spent_requests     INTEGER NOT NULL DEFAULT 0 CHECK (typeof(spent_requests) = 'integer' AND spent_requests >= 0),
    spent_cost_micros  INTEGER NOT NULL DEFAULT 0 CHECK (typeof(spent_cost_micros) = 'integer' AND spent_cost_micros >= 0),
    reserved_tokens    INTEGER NOT NULL DEFAULT 0 CHECK (typeof(reserved_tokens) = 'integer' AND reserved_tokens >= 0),
    reserved_requests  INTEGER NOT NULL DEFAULT 0 CHECK (typeof(reserved_requests) = 'integer' AND reserved_requests >= 0),
    reserved_cost_micros INTEGER NOT NULL DEFAULT 0 CHECK (typeof(reserved_cost_micros) = 'integer' AND reserved_cost_micros >= 0),
    PRIMARY KEY (team_id, month_start_ms)
);
INSERT INTO usage_ledger_checked
SELECT team_id, month_start_ms,
    CAST(MAX(spent_tokens, 0) AS INTEGER), CAST(MAX(spent_requests, 0) AS INTEGER),
    CAST(MAX(spent_cost_micros, 0) AS INTEGER), CAST(MAX(reserved_tokens, 0) AS INTEGER),
    CAST(MAX(reserved_requests, 0) AS INTEGER), CAST(MAX(reserved_cost_micros, 0) AS INTEGER)
FROM usage_ledger;
DROP TABLE usage_ledger;
ALTER TABLE usage_ledger_checked RENAME TO usage_ledger;

CREATE TABLE usage_reservations_checked (
    id              TEXT    PRIMARY KEY,
    team_id         TEXT    NOT NULL,
    month_start_ms  INTEGER NOT NULL,
    input_tokens    INTEGER NOT NULL CHECK (typeof(input_tokens) = 'integer' AND input_tokens >= 0),
    output_tokens   INTEGER NOT NULL CHECK (typeof(output_tokens) = 'integer' AND output_tokens >= 0),
    requests        INTEGER NOT NULL CHECK (typeof(requests) = 'integer' AND requests >= 0),
    cost_micros     INTEGER NOT NULL CHECK (typeof(cost_micros) = 'integer' AND cost_micros >= 0),
    task            TEXT    NOT NULL,
    user_id         TEXT    NOT NULL DEFAULT '',
    trace_id        TEXT    NOT NULL,
    channel         TEXT    NOT NULL DEFAULT '',
    priority        TEXT    NOT NULL DEFAULT '',
    created_at_ms   INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO usage_reservations_checked (id, team_id, month_start_ms, input_tokens, output_tokens,
    requests, cost_micros, task, user_id, trace_id, channel, priority, created_at_ms)
SELECT id, team_id, month_start_ms, CAST(MAX(input_tokens, 0) AS INTEGER),
    CAST(MAX(output_tokens, 0) AS INTEGER), CAST(MAX(requests, 0) AS INTEGER),
    CAST(MAX(cost_micros, 0) AS INTEGER), task, user_id, trace_id, channel, priority, created_at_ms
FROM usage_reservations;
DROP TABLE usage_reservations;
ALTER TABLE usage_reservations_checked RENAME TO usage_reservations;

CREATE TABLE usage_records_checked (
    id              INTEGER PRIMARY KEY,
    created_at_ms   INTEGER NOT NULL,
    team_id         TEXT    NOT NULL,
    user_id         TEXT    NOT NULL DEFAULT '',
    task            TEXT    NOT NULL,
    provider        TEXT    NOT NULL DEFAULT '',
    model           TEXT    NOT NULL DEFAULT '',
    prompt_key      TEXT    NOT NULL DEFAULT '',
    prompt_version  INTEGER NOT NULL DEFAULT 0,
    trace_id        TEXT    NOT NULL,
    input_tokens    INTEGER NOT NULL DEFAULT 0 CHECK (typeof(input_tokens) = 'integer' AND input_tokens >= 0),
    output_tokens   INTEGER NOT NULL DEFAULT 0 CHECK (typeof(output_tokens) = 'integer' AND output_tokens >= 0),
    cost_micros     BIGINT CHECK (cost_micros IS NULL OR (typeof(cost_micros) = 'integer' AND cost_micros >= 0)),
    latency_ms      INTEGER NOT NULL DEFAULT 0 CHECK (latency_ms >= 0),
    outcome         TEXT    NOT NULL,
    attempts        TEXT    NOT NULL DEFAULT '[]',
    degraded        INTEGER NOT NULL DEFAULT 0,
    channel         TEXT    NOT NULL DEFAULT '',
    priority        TEXT    NOT NULL DEFAULT ''
);
INSERT INTO usage_records_checked (id, created_at_ms, team_id, user_id, task, provider, model,
    prompt_key, prompt_version, trace_id, input_tokens, output_tokens, cost_micros, latency_ms,
    outcome, attempts, degraded, channel, priority)
SELECT id, created_at_ms, team_id, user_id, task, provider, model,
    prompt_key, prompt_version, trace_id, CAST(MAX(input_tokens, 0) AS INTEGER),
    CAST(MAX(output_tokens, 0) AS INTEGER),
    CASE WHEN cost_micros IS NULL THEN NULL ELSE CAST(MAX(cost_micros, 0) AS INTEGER) END,
    MAX(latency_ms, 0), outcome, attempts, degraded, channel, priority
FROM usage_records;
DROP TABLE usage_records;
ALTER TABLE usage_records_checked RENAME TO usage_records;
CREATE INDEX usage_records_team_time ON usage_records (team_id, created_at_ms);
CREATE INDEX usage_records_trace ON usage_records (trace_id);

CREATE TABLE tenant_limits_checked (
    team_id         TEXT PRIMARY KEY,
    max_tokens      INTEGER CHECK (max_tokens IS NULL OR max_tokens >= 0),
    max_requests    INTEGER CHECK (max_requests IS NULL OR max_requests >= 0),
    max_cost_micros BIGINT CHECK (max_cost_micros IS NULL OR max_cost_micros >= 0),
    updated_at_ms   INTEGER NOT NULL
);
INSERT INTO tenant_limits_checked (team_id, max_tokens, max_requests, max_cost_micros, updated_at_ms)
SELECT team_id, MAX(max_tokens, 0), MAX(max_requests, 0), MAX(max_cost_micros, 0), updated_at_ms
FROM tenant_limits;
DROP TABLE tenant_limits;
ALTER TABLE tenant_limits_checked RENAME TO tenant_limits;
