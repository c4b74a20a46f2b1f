-- Shared by every entity cache script: prepended to each script when it is loaded.
--
-- KEYS, the same list for every script; all keys of one entity type carry its {hash tag}, so a
-- script runs within one Redis Cluster slot:
--   1 rows   hash    entity id -> entry (below)
--   2 live   zset    entity id -> expiry of a live entry (ms since the epoch on the server's
--                    clock; inf without a TTL): counts and prunes live entries
--   3 dead   zset    entity id -> expiry of a tombstone: prunes tombstones
--   4 floor  string  version key of the newest applied truncate of the type (absent: none)
-- An entry is "<version key>:<expires ms, 0 never>:<revision>:<checksum length>:<checksum><row>",
-- the row being its JSON, empty for a tombstone. The row JSON is never decoded here.
--
-- Versions are compared as their fixed-width hex keys (24 digits), six digits at a time: Lua
-- numbers are doubles and would lose LSN bits above 2**53, and Lua's string `<` follows the
-- server's collation locale.

local K_ROWS, K_LIVE, K_DEAD, K_FLOOR = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local ZERO_VERSION = '000000000000000000000000'
local PRUNE_MIN = 100

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Is version key `a` newer than `b` ("" is older than every version)?
local function newer(a, b)
  if b == '' then return true end
  for i = 1, 24, 6 do
    local x, y = tonumber(string.sub(a, i, i + 5), 16), tonumber(string.sub(b, i, i + 5), 16)
    if x ~= y then return x > y end
  end
  return false
end

local function decode(blob)
  local a = string.find(blob, ':', 26, true)
  local b = string.find(blob, ':', a + 1, true)
  local c = string.find(blob, ':', b + 1, true)
  local sum_end = c + tonumber(string.sub(blob, b + 1, c - 1))
  return {
    version = string.sub(blob, 1, 24),
    expires = tonumber(string.sub(blob, 26, a - 1)),
    revision = tonumber(string.sub(blob, a + 1, b - 1)),
    checksum = string.sub(blob, c + 1, sum_end),
    row = string.sub(blob, sum_end + 1),
  }
end

local function expired(entry, now)
  return entry.expires ~= 0 and entry.expires <= now
end

local function expiry(now, ttl_ms)
  if ttl_ms > 0 then return now + ttl_ms end
  return 0
end

local function remove(id)
  redis.call('HDEL', K_ROWS, id)
  redis.call('ZREM', K_LIVE, id)
  redis.call('ZREM', K_DEAD, id)
end

-- The entry held for `id`, nil if none or expired (an expired one is removed).
local function held(id, now)
  local blob = redis.call('HGET', K_ROWS, id)
  if not blob then return nil end
  local entry = decode(blob)
  if expired(entry, now) then
    remove(id)
    return nil
  end
  return entry
end

-- Write an entry (row "" for a tombstone) and index it as live or dead.
local function put(id, version, expires, revision, sum, row)
  redis.call('HSET', K_ROWS, id,
    version .. ':' .. expires .. ':' .. revision .. ':' .. #sum .. ':' .. sum .. row)
  local score = expires
  if expires == 0 then score = 'inf' end
  if row == '' then
    redis.call('ZREM', K_LIVE, id)
    redis.call('ZADD', K_DEAD, score, id)
  else
    redis.call('ZREM', K_DEAD, id)
    redis.call('ZADD', K_LIVE, score, id)
  end
end

-- Remove up to `limit` expired entries of each kind, so expired rows never pile up.
local function prune(now, limit)
  for _, index in ipairs({K_LIVE, K_DEAD}) do
    local ids = redis.call('ZRANGEBYSCORE', index, '-inf', now, 'LIMIT', 0, limit)
    for _, id in ipairs(ids) do remove(id) end
  end
end
