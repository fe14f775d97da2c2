-- Human approval of tool calls (SPEC §14.1). A held InvokeTool names its
-- invocation (stored AWAITING_APPROVAL) by invocation_id; a held Converse
-- tool call names its conversation and call. Deciding and expiring are
-- UPDATEs guarded by status = 'PENDING': the first decision, or the
-- sweeper's expiry, wins, on any replica.
--
-- `input` is the call's input as the decider sees it; input_sha256 (hex, of
-- its compact JSON) is what the API shows to those who may not see it.

CREATE TABLE approvals (
    id              TEXT    PRIMARY KEY,          -- UUIDv7: sorts by creation
    team_id         TEXT    NOT NULL,
    tool            TEXT    NOT NULL,
    version         TEXT    NOT NULL,
    requested_by    TEXT    NOT NULL,             -- the principal that made the call
    trace_id        TEXT    NOT NULL DEFAULT '',
    input           TEXT    NOT NULL,             -- JSON
    input_sha256    TEXT    NOT NULL,
    invocation_id   TEXT,                         -- an InvokeTool held for approval
    conversation_id TEXT,                         -- a Converse tool call held: its
    call_id         TEXT,                         -- conversation and call
    status          TEXT    NOT NULL,             -- PENDING | APPROVED | REJECTED | EXPIRED
    decided_by      TEXT,
    reason          TEXT    NOT NULL DEFAULT '',
    created_at_ms   BIGINT  NOT NULL,
    decided_at_ms   BIGINT,
    expires_at_ms   BIGINT  NOT NULL
);
CREATE INDEX approvals_list ON approvals (team_id, status, id);
CREATE INDEX approvals_expiry ON approvals (status, expires_at_ms);
CREATE INDEX approvals_invocation ON approvals (invocation_id);
-- A held call's approval is the newest for its conversation and call: a
-- provider may give a later turn's call the ID of an earlier one (decided
-- long ago), so the pair is not unique and an old decision never settles
-- a new call.
CREATE INDEX approvals_call ON approvals (team_id, conversation_id, call_id, id);
