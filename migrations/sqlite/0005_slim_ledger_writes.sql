-- Fewer pages per metered call. Every call waits for the ledger commits
-- that insert its reservation, delete it and insert its usage record, and
-- each B-tree page such a commit dirties is written whole to the WAL and
-- is part of the fsync the call waits for. Measured with the ledger's
-- statements, one call per commit: 8.8 pages before, 5.7 after.
--
-- 1. Reservations hold only calls in flight (a few thousand rows at most).
--    As a rowid table with two indexes, each insert and each delete dirtied
--    three pages; keyed by its ID alone (WITHOUT ROWID) and without the
--    created_at_ms index, one. The sweeper's scan by age reads the whole
--    table, which is only the calls in flight.
-- 2. usage_records loses AUTOINCREMENT, which updated sqlite_sequence (one
--    more page) on every insert. Records are never deleted, so a plain
--    INTEGER PRIMARY KEY hands out the same increasing IDs. This copies the
--    table once (docs/operations.md, upgrades).
--
-- Same columns and IDs: an older release still works on these tables.
CREATE TABLE usage_reservations_slim (
    id              TEXT    PRIMARY KEY,
    team_id         TEXT    NOT NULL,
    month_start_ms  INTEGER NOT NULL,
    input_tokens    INTEGER NOT NULL,
    output_tokens   INTEGER NOT NULL,
    requests        INTEGER NOT NULL,
    cost_micros     INTEGER NOT NULL,
    task            TEXT    NOT NULL,
    user_id         TEXT    NOT NULL DEFAULT '',
    trace_id        TEXT    NOT NULL,
    channel         TEXT    NOT NULL DEFAULT '',
    priority        TEXT    NOT NULL DEFAULT '',
    created_at_ms   INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO usage_reservations_slim (id, team_id, month_start_ms, input_tokens, output_tokens,
    requests, cost_micros, task, user_id, trace_id, channel, priority, created_at_ms)
SELECT id, team_id, month_start_ms, input_tokens, output_tokens,
    requests, cost_micros, task, user_id, trace_id, channel, priority, created_at_ms
FROM usage_reservations;
DROP TABLE usage_reservations;
ALTER TABLE usage_reservations_slim RENAME TO usage_reservations;

CREATE TABLE usage_records_slim (
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
    input_tokens    INTEGER NOT NULL DEFAULT 0,
    output_tokens   INTEGER NOT NULL DEFAULT 0,
    cost_micros     BIGINT,              -- micro-USD; NULL when a model has no price
    latency_ms      INTEGER NOT NULL DEFAULT 0,
    outcome         TEXT    NOT NULL,    -- ok | error code
    attempts        TEXT    NOT NULL DEFAULT '[]',  -- JSON array
    degraded        INTEGER NOT NULL DEFAULT 0,
    channel         TEXT    NOT NULL DEFAULT '',
    priority        TEXT    NOT NULL DEFAULT ''
);
INSERT INTO usage_records_slim (id, created_at_ms, team_id, user_id, task, provider, model,
    prompt_key, prompt_version, trace_id, input_tokens, output_tokens, cost_micros, latency_ms,
    outcome, attempts, degraded, channel, priority)
SELECT id, created_at_ms, team_id, user_id, task, provider, model,
    prompt_key, prompt_version, trace_id, input_tokens, output_tokens, cost_micros, latency_ms,
    outcome, attempts, degraded, channel, priority
FROM usage_records;
DROP TABLE usage_records;
ALTER TABLE usage_records_slim RENAME TO usage_records;
CREATE INDEX usage_records_team_time ON usage_records (team_id, created_at_ms);
CREATE INDEX usage_records_trace ON usage_records (trace_id);
