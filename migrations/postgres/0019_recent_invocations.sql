-- The ops console lists a team's latest tool invocations (SPEC §17).
CREATE INDEX tool_invocations_recent ON tool_invocations (team_id, created_at_ms);
