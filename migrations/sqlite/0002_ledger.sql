-- The reserve -> settle ledger. One row per (team, UTC month): what was spent
-- (settled calls) and what is reserved by calls in flight. A guarded UPDATE
-- (`... WHERE spent + reserved + estimate <= cap`) admits a call, so
-- concurrent requests and replicas can never overshoot a cap.
CREATE TABLE usage_ledger (
    team_id            TEXT    NOT NULL,
    month_start_ms     INTEGER NOT NULL,
    spent_tokens       INTEGER NOT NULL DEFAULT 0,
    spent_requests     INTEGER NOT NULL DEFAULT 0,
    spent_cost_micros  INTEGER NOT NULL DEFAULT 0,
    reserved_tokens    INTEGER NOT NULL DEFAULT 0,
    reserved_requests  INTEGER NOT NULL DEFAULT 0,
    reserved_cost_micros INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (team_id, month_start_ms)
);

-- One row per call in flight; deleted at settlement. Rows that outlive any
-- possible request (a crash) are charged at their estimate by the sweeper.
CREATE TABLE usage_reservations (
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
);
CREATE INDEX usage_reservations_created ON usage_reservations (created_at_ms);
