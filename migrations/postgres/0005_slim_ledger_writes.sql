-- Reservations hold only calls in flight, yet every metered call inserts and
-- deletes one inside the ledger commits it waits for; the created_at_ms
-- index was maintained on both for the sweeper alone, whose scan by age
-- reads what is in flight anyway (as in SQLite's 0005).
DROP INDEX IF EXISTS usage_reservations_created;
