-- No query reads audit events by trace ID alone: ListAuditEvents names the
-- team and filters its events by trace (the team/time index serves it). The
-- index cost every audit row a random B-tree insert on the ledger's one
-- writer thread, the largest part of what auditing every call costs
-- (ADR 0031, docs/benchmarks.md).
DROP INDEX audit_events_trace;
