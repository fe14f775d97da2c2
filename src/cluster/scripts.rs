//! The store's Lua scripts: atomic, on the store's `TIME` (effect replication: Redis 7, or
//! `replicate_commands()` on 6.2), expiring every key they write; µs printed with `%.0f`.

use redis::Script;
use std::sync::LazyLock;

/// Lease, GCRA rate, token bucket, committed only if all pass. Returns `{verdict, µs}`.
pub static ADMIT: LazyLock<Script> = LazyLock::new(|| Script::new(ADMIT_LUA));

const ADMIT_LUA: &str = r#"
if redis.replicate_commands then pcall(redis.replicate_commands) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local minute = 60000000
local rpm, tpm, estimate = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local max_slots, lease = tonumber(ARGV[4]), tonumber(ARGV[5])
if max_slots > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', string.format('%.0f', now))
  if redis.call('ZCARD', KEYS[3]) >= max_slots then
    local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
    return {1, math.max(1, tonumber(first[2]) - now)}
  end
end
local tat
if rpm > 0 then
  local interval = minute / rpm
  tat = math.max(tonumber(redis.call('GET', KEYS[1]) or now), now) + interval
  if tat - now > minute then
    return {2, math.ceil(tat - now - minute)}
  end
end
local level
if tpm > 0 then
  local h = redis.call('HMGET', KEYS[2], 'level', 'at')
  level = tonumber(h[1] or '0')
  local at = tonumber(h[2] or now)
  level = math.max(0, level - (now - at) * tpm / minute)
  if level > 0 and level + estimate > tpm then
    -- A call larger than tpm goes alone, once the bucket is empty.
    local excess = math.min(level, level + estimate - tpm)
    return {3, math.ceil(excess * minute / tpm)}
  end
end
if max_slots > 0 then
  redis.call('ZADD', KEYS[3], string.format('%.0f', now + lease), ARGV[6])
  local ttl = math.ceil(lease / 1000)
  if redis.call('PTTL', KEYS[3]) < ttl then redis.call('PEXPIRE', KEYS[3], ttl) end
end
if rpm > 0 then
  redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
end
if tpm > 0 then
  level = level + estimate
  redis.call('HSET', KEYS[2], 'level', string.format('%.0f', level), 'at', string.format('%.0f', now))
  redis.call('PEXPIRE', KEYS[2], math.ceil(level * 60000 / tpm) + 1)
end
return {0, now}
"#;

/// Releases the lease and corrects the tokens; a give-back is capped as ADR 0025 says.
pub static SETTLE: LazyLock<Script> = LazyLock::new(|| Script::new(SETTLE_LUA));

const SETTLE_LUA: &str = r#"
if redis.replicate_commands then pcall(redis.replicate_commands) end
if ARGV[3] ~= '' then redis.call('ZREM', KEYS[2], ARGV[3]) end
local tpm, delta = tonumber(ARGV[1]), tonumber(ARGV[2])
if tpm > 0 and delta ~= 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local h = redis.call('HMGET', KEYS[1], 'level', 'at')
  local level = tonumber(h[1] or '0')
  local at = tonumber(h[2] or now)
  if delta < 0 then
    local undrained = tonumber(ARGV[5]) - (now - tonumber(ARGV[4])) * tpm / 60000000
    delta = math.max(delta, -math.max(0, undrained))
  end
  level = math.max(0, level - (now - at) * tpm / 60000000 + delta)
  redis.call('HSET', KEYS[1], 'level', string.format('%.0f', level), 'at', string.format('%.0f', now))
  redis.call('PEXPIRE', KEYS[1], math.ceil(level * 60000 / tpm) + 1)
end
return 1
"#;

/// A tool's hour count and/or running slot, both or neither. Returns 0, 1 hour full, 2 slots full.
pub static TOOL_ADMIT: LazyLock<Script> = LazyLock::new(|| Script::new(TOOL_ADMIT_LUA));

const TOOL_ADMIT_LUA: &str = r#"
if redis.replicate_commands then pcall(redis.replicate_commands) end
local per_hour, max_running, lease = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if max_running > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', string.format('%.0f', now))
  if redis.call('ZCARD', KEYS[2]) >= max_running then return 2 end
end
if per_hour > 0 and tonumber(redis.call('GET', KEYS[1]) or '0') >= per_hour then return 1 end
if per_hour > 0 then
  redis.call('INCR', KEYS[1])
  redis.call('PEXPIRE', KEYS[1], 7200000)
end
if max_running > 0 then
  redis.call('ZADD', KEYS[2], string.format('%.0f', now + lease), ARGV[4])
  local ttl = math.ceil(lease / 1000)
  if redis.call('PTTL', KEYS[2]) < ttl then redis.call('PEXPIRE', KEYS[2], ttl) end
end
return 0
"#;
