-- The runtime tool registry (SPEC §16): http and task tools registered over
-- ToolAdmin, each (name, version) once. `config` is the tool's config shape
-- as JSON (the `[tools."<name>"]` keys); its secrets are environment
-- variable names, read by each replica. Every replica reloads the table
-- every `[tool_registry] refresh_interval`; `updated_at_ms` tells it which
-- rows changed. Flags are 0/1 integers on both backends.
CREATE TABLE tool_registry (
    name            TEXT    NOT NULL,
    version         TEXT    NOT NULL,             -- semantic version
    config          TEXT    NOT NULL,             -- JSON
    config_sha256   TEXT    NOT NULL,             -- of `config`: a repeated registration matches it
    enabled         INTEGER NOT NULL DEFAULT 1,
    disabled_reason TEXT    NOT NULL DEFAULT '',
    deprecated      INTEGER NOT NULL DEFAULT 0,
    replacement     TEXT    NOT NULL DEFAULT '',  -- `name@version` to use instead
    registered_by   TEXT    NOT NULL,             -- the principal
    changed_by      TEXT    NOT NULL,             -- the principal of the last change
    created_at_ms   INTEGER NOT NULL,
    updated_at_ms   INTEGER NOT NULL,
    PRIMARY KEY (name, version)
);
