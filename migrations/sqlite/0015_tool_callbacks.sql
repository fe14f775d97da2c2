-- Workflows that call back (SPEC §16): an invocation whose webhook accepted
-- the work waits as AWAITING_CALLBACK, `lease_until_ms` holding when it ends
-- TIMED_OUT without one. `callback_sha256` is the digest of the callback's
-- raw body that ended it: the same body again is answered 200, another 409.
ALTER TABLE tool_invocations ADD COLUMN callback_sha256 TEXT;
