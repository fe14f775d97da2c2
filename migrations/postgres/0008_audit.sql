-- The audit log (SPEC §10): one row per event, never content, each team's
-- events a hash chain (`audit::chain`). `audit_heads` holds where each
-- team's chain ends, so an appender links after it under a row lock, and a
-- deleted last event is still found.

CREATE TABLE audit_events (
    id                    TEXT    PRIMARY KEY,          -- UUIDv7
    team_id               TEXT    NOT NULL,
    seq                   BIGINT  NOT NULL,             -- position in the team's chain, from 1
    at_ms                 BIGINT  NOT NULL,
    trace_id              TEXT    NOT NULL DEFAULT '',
    principal             TEXT    NOT NULL DEFAULT '',
    category              TEXT    NOT NULL,
    action                TEXT    NOT NULL,
    subject               TEXT    NOT NULL DEFAULT '',
    decision              TEXT    NOT NULL DEFAULT '',
    reason                TEXT    NOT NULL DEFAULT '',
    input_sha256          TEXT,
    output_sha256         TEXT,
    input_bytes           BIGINT,
    output_bytes          BIGINT,
    duration_ms           BIGINT,
    estimated_cost_micros BIGINT,
    actual_cost_micros    BIGINT,
    idempotency_key       TEXT,
    prev_hash             TEXT    NOT NULL,
    hash                  TEXT    NOT NULL,
    UNIQUE (team_id, seq)
);
CREATE INDEX audit_events_team_time ON audit_events (team_id, at_ms);
CREATE INDEX audit_events_trace ON audit_events (trace_id);

CREATE TABLE audit_heads (
    team_id TEXT    PRIMARY KEY,
    seq     BIGINT  NOT NULL,
    hash    TEXT    NOT NULL
);
