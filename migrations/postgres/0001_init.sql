-- Usage records, tenant limits and prompts. Times are unix milliseconds (UTC)
-- on both backends so range queries and month arithmetic are identical; money
-- is integer micro-USD so sums and cap checks are exact.

CREATE TABLE usage_records (
    id              BIGSERIAL PRIMARY KEY,
    created_at_ms   BIGINT  NOT NULL,
    team_id         TEXT    NOT NULL,
    user_id         TEXT    NOT NULL DEFAULT '',
    task            TEXT    NOT NULL,
    provider        TEXT    NOT NULL DEFAULT '',
    model           TEXT    NOT NULL DEFAULT '',
    prompt_key      TEXT    NOT NULL DEFAULT '',
    prompt_version  BIGINT  NOT NULL DEFAULT 0,
    trace_id        TEXT    NOT NULL,
    input_tokens    BIGINT  NOT NULL DEFAULT 0,
    output_tokens   BIGINT  NOT NULL DEFAULT 0,
    cost_micros     BIGINT,              -- micro-USD; NULL when a model has no price
    latency_ms      BIGINT  NOT NULL DEFAULT 0,
    outcome         TEXT    NOT NULL,    -- ok | error code
    attempts        TEXT    NOT NULL DEFAULT '[]',  -- JSON array
    degraded        BIGINT  NOT NULL DEFAULT 0,
    channel         TEXT    NOT NULL DEFAULT '',
    priority        TEXT    NOT NULL DEFAULT ''
);
CREATE INDEX usage_records_team_time ON usage_records (team_id, created_at_ms);
CREATE INDEX usage_records_trace ON usage_records (trace_id);

CREATE TABLE tenant_limits (
    team_id         TEXT PRIMARY KEY,
    max_tokens      BIGINT,
    max_requests    BIGINT,
    max_cost_micros BIGINT,
    updated_at_ms   BIGINT NOT NULL
);

CREATE TABLE ai_prompts (
    id                   BIGSERIAL PRIMARY KEY,
    team_id              TEXT    NOT NULL DEFAULT '',   -- '' is the global default
    prompt_key           TEXT    NOT NULL,
    version              BIGINT  NOT NULL,
    system_prompt        TEXT    NOT NULL,
    user_prompt_template TEXT    NOT NULL,
    model                TEXT,
    temperature          DOUBLE PRECISION,
    max_tokens           BIGINT,
    is_active            BIGINT  NOT NULL DEFAULT 0,
    usage_count          BIGINT  NOT NULL DEFAULT 0,
    avg_latency_ms       DOUBLE PRECISION NOT NULL DEFAULT 0,
    success_rate         DOUBLE PRECISION NOT NULL DEFAULT 1,
    created_at_ms        BIGINT  NOT NULL,
    created_by           TEXT    NOT NULL DEFAULT '',
    UNIQUE (team_id, prompt_key, version)
);
-- Exactly one active version per (team, key), enforced by the database.
CREATE UNIQUE INDEX ai_prompts_one_active ON ai_prompts (team_id, prompt_key) WHERE is_active = 1;
