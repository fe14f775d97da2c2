-- usage.cap.warning / usage.cap.reached, once per cap, level and period
-- (ADR 0036): a crossing or a refusal appends its event only when its row
-- here is new, in the same ledger transaction, whichever replica saw it.
CREATE TABLE cap_events (
    team_id   TEXT    NOT NULL,
    user_id   TEXT    NOT NULL,            -- '' for the team's own caps
    period    TEXT    NOT NULL,            -- month | day
    start_ms  BIGINT NOT NULL,
    cap       TEXT    NOT NULL,            -- requests | tokens | cost_usd
    level     TEXT    NOT NULL,            -- warning | reached
    at_ms     BIGINT NOT NULL,
    PRIMARY KEY (team_id, user_id, period, start_ms, cap, level)
);
