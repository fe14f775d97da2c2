-- Conversations of agents (SPEC §11.6): team-scoped, content kept for the
-- agent's retention_days after the last turn, erased by
-- DeleteConversation or the sweeper (docs/agents.md, storage).
--
-- A turn holds its conversation by a lease (busy_until_ms), taken by a
-- conditional UPDATE: a second turn while one runs is refused, on any
-- replica; a crashed turn's lease runs out with its deadline.

CREATE TABLE conversations (
    id             TEXT    PRIMARY KEY,          -- UUIDv7
    team_id        TEXT    NOT NULL,
    agent          TEXT    NOT NULL,
    principal      TEXT    NOT NULL DEFAULT '',  -- the key that started it
    turns          BIGINT NOT NULL DEFAULT 0,
    created_at_ms  BIGINT NOT NULL,
    updated_at_ms  BIGINT NOT NULL,
    expires_at_ms  BIGINT NOT NULL,
    busy_until_ms  BIGINT,                      -- a running turn's lease
    busy_token     TEXT                          -- which turn holds it
);
CREATE INDEX conversations_expiry ON conversations (expires_at_ms);

-- Each stored message, in order: user, the assistant's tool calls, the
-- tool results, the final answer (the provider's complete answer).
CREATE TABLE conversation_messages (
    conversation_id TEXT    NOT NULL,
    seq             BIGINT NOT NULL,             -- position, from 1
    turn            BIGINT NOT NULL,
    role            TEXT    NOT NULL,             -- user | assistant | tool
    content         TEXT    NOT NULL,
    tool_calls      TEXT,                         -- JSON array of {id, name, arguments}
    tool_result     TEXT,                         -- JSON {call_id, name, content, is_error}
    created_at_ms   BIGINT NOT NULL,
    PRIMARY KEY (conversation_id, seq)
);

-- One row per completed turn: how it ended and its memory suggestions
-- (stored for the caller; never turned into memories by us).
CREATE TABLE conversation_turns (
    conversation_id    TEXT    NOT NULL,
    turn               BIGINT NOT NULL,
    trace_id           TEXT    NOT NULL DEFAULT '',
    stop_reason        TEXT    NOT NULL,
    iterations         BIGINT NOT NULL,
    tool_calls         BIGINT NOT NULL,
    memory_suggestions TEXT    NOT NULL DEFAULT '[]',  -- JSON array of strings
    created_at_ms      BIGINT NOT NULL,
    PRIMARY KEY (conversation_id, turn)
);

-- An agent's model calls are metered one record each: the conversation
-- and the iteration (1-based) say which turn and which call.
ALTER TABLE usage_records ADD COLUMN conversation_id TEXT NOT NULL DEFAULT '';
ALTER TABLE usage_records ADD COLUMN iteration BIGINT NOT NULL DEFAULT 0;
