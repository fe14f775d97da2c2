-- Tool invocations that outlive their request or must not run twice:
-- every workflow (http) invocation, for its idempotency key, and every
-- ASYNC one, for its worker. The unique key is what makes "the same key
-- within its window never reaches the webhook twice" hold across
-- concurrent calls and replicas: the second insert conflicts.
--
-- `input` is kept (the worker runs it later, a retry sends it again) and
-- `output` is what GetToolInvocation returns; both are content, unlike
-- the audit log, and live as long as the row (docs/tools.md, retention).

CREATE TABLE tool_invocations (
    id                    TEXT    PRIMARY KEY,          -- UUIDv7
    team_id               TEXT    NOT NULL,
    tool                  TEXT    NOT NULL,
    version               TEXT    NOT NULL,
    mode                  TEXT    NOT NULL,             -- SYNC | ASYNC
    status                TEXT    NOT NULL,             -- PENDING | RUNNING | SUCCEEDED | FAILED | TIMED_OUT
    idempotency_key       TEXT    NOT NULL,
    window_start_ms       BIGINT  NOT NULL,
    trace_id              TEXT    NOT NULL DEFAULT '',
    principal             TEXT    NOT NULL DEFAULT '',
    input                 TEXT    NOT NULL,             -- JSON
    output                TEXT,                         -- JSON
    error_code            TEXT,
    error_message         TEXT,
    estimated_cost_micros BIGINT  NOT NULL DEFAULT 0,
    cost_micros           BIGINT,
    duration_ms           BIGINT,
    execution_id          TEXT,
    attempts              BIGINT  NOT NULL DEFAULT 0,
    created_at_ms         BIGINT  NOT NULL,
    timeout_ms            BIGINT  NOT NULL DEFAULT 0,      -- the tool's timeout: a runner's lease is this and the slack
    updated_at_ms         BIGINT  NOT NULL,
    lease_until_ms        BIGINT,                      -- a RUNNING row's owner holds it until then
    UNIQUE (team_id, idempotency_key, window_start_ms)
);
CREATE INDEX tool_invocations_work ON tool_invocations (status, lease_until_ms);
