-- Budgets per user and per day (SPEC §14.2). The ledger's rows become
-- buckets: a team's (user_id '') or one of its users' spending in a UTC
-- month or day. A call reserves in each of its buckets or in none; existing
-- rows are the teams' months, unchanged.
ALTER TABLE usage_ledger ADD COLUMN user_id TEXT NOT NULL DEFAULT '';
ALTER TABLE usage_ledger ADD COLUMN period TEXT NOT NULL DEFAULT 'month'
    CHECK (period IN ('month', 'day'));
ALTER TABLE usage_ledger RENAME COLUMN month_start_ms TO period_start_ms;
ALTER TABLE usage_ledger DROP CONSTRAINT usage_ledger_pkey;
ALTER TABLE usage_ledger ADD PRIMARY KEY (team_id, user_id, period, period_start_ms);

-- The UTC day a reservation counts in (its call's start, like its month).
ALTER TABLE usage_reservations ADD COLUMN day_start_ms BIGINT NOT NULL DEFAULT 0;
UPDATE usage_reservations SET day_start_ms = created_at_ms - (created_at_ms % 86400000);

-- Calls in flight during the upgrade hold their reservations in their team's
-- month row only; their other buckets (the team's day, the user's month and
-- day) take them too, so settling or sweeping them releases what they hold
-- everywhere. Those rows cannot exist yet: only month rows of teams do.
INSERT INTO usage_ledger (team_id, user_id, period, period_start_ms, reserved_tokens,
    reserved_requests, reserved_cost_micros)
SELECT team_id, '', 'day', day_start_ms, SUM(input_tokens + output_tokens), SUM(requests),
    SUM(cost_micros)
FROM usage_reservations GROUP BY team_id, day_start_ms
UNION ALL
SELECT team_id, user_id, 'month', month_start_ms, SUM(input_tokens + output_tokens), SUM(requests),
    SUM(cost_micros)
FROM usage_reservations WHERE user_id <> '' GROUP BY team_id, user_id, month_start_ms
UNION ALL
SELECT team_id, user_id, 'day', day_start_ms, SUM(input_tokens + output_tokens), SUM(requests),
    SUM(cost_micros)
FROM usage_reservations WHERE user_id <> '' GROUP BY team_id, user_id, day_start_ms;

-- A team's daily caps beside its monthly ones. An override row written
-- before this has none (NULL: no daily cap), whatever the config's defaults.
ALTER TABLE tenant_limits
    ADD COLUMN max_tokens_per_day BIGINT CHECK (max_tokens_per_day IS NULL OR max_tokens_per_day >= 0),
    ADD COLUMN max_requests_per_day BIGINT CHECK (max_requests_per_day IS NULL OR max_requests_per_day >= 0),
    ADD COLUMN max_cost_micros_per_day BIGINT
        CHECK (max_cost_micros_per_day IS NULL OR max_cost_micros_per_day >= 0);

-- A user's overrides of `[metering.user_limits]`, within a team.
CREATE TABLE user_limits (
    team_id                 TEXT    NOT NULL,
    user_id                 TEXT    NOT NULL,
    max_tokens              BIGINT CHECK (max_tokens IS NULL OR max_tokens >= 0),
    max_requests            BIGINT CHECK (max_requests IS NULL OR max_requests >= 0),
    max_cost_micros         BIGINT CHECK (max_cost_micros IS NULL OR max_cost_micros >= 0),
    max_tokens_per_day      BIGINT CHECK (max_tokens_per_day IS NULL OR max_tokens_per_day >= 0),
    max_requests_per_day    BIGINT CHECK (max_requests_per_day IS NULL OR max_requests_per_day >= 0),
    max_cost_micros_per_day BIGINT CHECK (max_cost_micros_per_day IS NULL OR max_cost_micros_per_day >= 0),
    updated_at_ms           BIGINT  NOT NULL,
    PRIMARY KEY (team_id, user_id)
);
