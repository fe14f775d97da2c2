-- Amounts can never be negative (docs/metering.md). The service validates
-- every amount before it is written (plausible token counts, bounded
-- prices, saturating sums); these constraints make a bug fail its own
-- statement instead of corrupting a team's month, and a batch that fails
-- one is retried operation by operation, so only the bad one fails.
-- PostgreSQL already refuses a BIGINT overflow. Rows that broke the rule
-- before (the overflow this fixes) are clamped to 0 first.
UPDATE usage_ledger SET
    spent_tokens = GREATEST(spent_tokens, 0), spent_requests = GREATEST(spent_requests, 0),
    spent_cost_micros = GREATEST(spent_cost_micros, 0), reserved_tokens = GREATEST(reserved_tokens, 0),
    reserved_requests = GREATEST(reserved_requests, 0), reserved_cost_micros = GREATEST(reserved_cost_micros, 0)
WHERE LEAST(spent_tokens, spent_requests, spent_cost_micros, reserved_tokens, reserved_requests, reserved_cost_micros) < 0;
ALTER TABLE usage_ledger ADD CONSTRAINT usage_ledger_amounts_non_negative CHECK (
    spent_tokens >= 0 AND spent_requests >= 0 AND spent_cost_micros >= 0
    AND reserved_tokens >= 0 AND reserved_requests >= 0 AND reserved_cost_micros >= 0);

UPDATE usage_reservations SET
    input_tokens = GREATEST(input_tokens, 0), output_tokens = GREATEST(output_tokens, 0),
    requests = GREATEST(requests, 0), cost_micros = GREATEST(cost_micros, 0)
WHERE LEAST(input_tokens, output_tokens, requests, cost_micros) < 0;
ALTER TABLE usage_reservations ADD CONSTRAINT usage_reservations_amounts_non_negative CHECK (
    input_tokens >= 0 AND output_tokens >= 0 AND requests >= 0 AND cost_micros >= 0);

UPDATE usage_records SET
    input_tokens = GREATEST(input_tokens, 0), output_tokens = GREATEST(output_tokens, 0),
    cost_micros = GREATEST(cost_micros, 0), latency_ms = GREATEST(latency_ms, 0)
WHERE LEAST(input_tokens, output_tokens, COALESCE(cost_micros, 0), latency_ms) < 0;
ALTER TABLE usage_records ADD CONSTRAINT usage_records_amounts_non_negative CHECK (
    input_tokens >= 0 AND output_tokens >= 0 AND (cost_micros IS NULL OR cost_micros >= 0)
    AND latency_ms >= 0);

UPDATE tenant_limits SET
    max_tokens = GREATEST(max_tokens, 0), max_requests = GREATEST(max_requests, 0),
    max_cost_micros = GREATEST(max_cost_micros, 0)
WHERE LEAST(max_tokens, max_requests, max_cost_micros) < 0;
ALTER TABLE tenant_limits ADD CONSTRAINT tenant_limits_caps_non_negative CHECK (
    (max_tokens IS NULL OR max_tokens >= 0) AND (max_requests IS NULL OR max_requests >= 0)
    AND (max_cost_micros IS NULL OR max_cost_micros >= 0));
