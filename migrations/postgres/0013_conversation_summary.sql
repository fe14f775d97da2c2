-- History summarization (SPEC §15, `history_overflow = "summarize"`): the
-- summary of a conversation's oldest messages, and the last message (seq)
-- it covers. Messages stay stored; the prompt reads those after it.
ALTER TABLE conversations ADD COLUMN summary TEXT NOT NULL DEFAULT '';
ALTER TABLE conversations ADD COLUMN summary_through BIGINT NOT NULL DEFAULT 0;
