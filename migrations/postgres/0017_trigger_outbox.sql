-- The triggers' outbox (SPEC §16): one row per trigger an audit event
-- matched, inserted in the ledger transaction that appends the event, so a
-- committed event never loses its trigger to a crash. The relay (every
-- replica's) takes PENDING rows under a lease, starts the trigger's tool
-- ASYNC with the idempotency key `trigger:<id>` (a replay never reaches a
-- webhook twice), and marks the row FIRED (or FAILED: refused by the tool
-- entry point) with its trigger.fired event in one transaction.
CREATE TABLE trigger_outbox (
    id              TEXT    PRIMARY KEY,          -- UUIDv7: sorts by creation
    trigger_name    TEXT    NOT NULL,
    team_id         TEXT    NOT NULL,
    event           TEXT    NOT NULL,             -- JSON: the event's fields
    status          TEXT    NOT NULL,             -- PENDING | FIRED | FAILED
    invocation_id   TEXT,
    error           TEXT    NOT NULL DEFAULT '',
    attempts        BIGINT  NOT NULL DEFAULT 0,
    lease_until_ms  BIGINT  NOT NULL DEFAULT 0,
    created_at_ms   BIGINT  NOT NULL,
    updated_at_ms   BIGINT  NOT NULL
);
CREATE INDEX trigger_outbox_pending ON trigger_outbox (status, lease_until_ms);
