-- API keys created with `ai-orchestrator keys create`. Only the SHA-256 of a
-- key is stored; the key itself is shown once, at creation.
CREATE TABLE api_keys (
    name           TEXT    PRIMARY KEY,
    key_sha256     TEXT    NOT NULL UNIQUE,  -- lowercase hex
    teams          TEXT    NOT NULL,         -- comma-separated team IDs, or *
    role           TEXT    NOT NULL,         -- caller | admin
    created_at_ms  INTEGER  NOT NULL,
    revoked_at_ms  INTEGER                        -- NULL while the key is valid
);
