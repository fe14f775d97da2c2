//! The Lua scripts the store runs. Each reads the store's clock (`TIME`,
//! allowed before writes since Redis 7 replicates effects, and under 6.2
//! with `redis.replicate_commands()`), checks and commits in one atomic
//! step, and sets an expiry on every key it writes so nothing outlives
//! its use. Times are integer microseconds, written with `%.0f` so no
//! digit is lost to Lua's number printing.

use redis::Script;
use std::sync::LazyLock;

/// A provider call's admission: concurrency lease, then GCRA rate, then
/// token bucket; all three committed only when all three pass.
///
/// KEYS: 1 rate (GCRA theoretical arrival time), 2 tokens (hash level/at),
/// 3 slots (sorted set: lease id → expiry).
/// ARGV: 1 rpm (0 none), 2 tpm (0 none), 3 token estimate,
/// 4 max concurrency (0 none), 5 lease (µs), 6 lease id.
/// Returns `{verdict, n}`: 0 admitted (n: the store's time, µs), 1
/// saturated, 2 rate limited, 3 tokens exhausted (n: µs until it may fit).
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

/// A provider call's end: its lease released and its token estimate
/// corrected by what the provider reported.
///
/// KEYS: 1 tokens, 2 slots. ARGV: 1 tpm (0 none), 2 correction (signed
/// tokens), 3 lease id ('' none), 4 admission time (µs, the store's), 5
/// the estimate. A give-back is capped at what of the estimate has not
/// drained since admission: the rest already left the bucket, and taking
/// it again would erase other calls' tokens. Returns 1.
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

/// A tool invocation's place under a team's quota: an hour's count and/or
/// a concurrency lease, both or neither.
///
/// KEYS: 1 the clock hour's count, 2 running (sorted set: lease id →
/// expiry). ARGV: 1 max per hour (0: not counted), 2 max concurrent (0: no
/// slot taken), 3 lease (µs), 4 lease id. Returns 0 admitted, 1 the hour
/// is full, 2 every slot is taken.
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
