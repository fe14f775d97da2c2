-- Who changed which prompt version, and when.
CREATE TABLE ai_prompt_audit (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    at_ms         INTEGER NOT NULL,
    actor         TEXT    NOT NULL,
    action        TEXT    NOT NULL,   -- create | activate
    team_id       TEXT    NOT NULL,
    prompt_key    TEXT    NOT NULL,
    version       INTEGER NOT NULL
);
CREATE INDEX ai_prompt_audit_key ON ai_prompt_audit (team_id, prompt_key, at_ms);
