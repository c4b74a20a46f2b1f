-- Apply a batch of changes of one entity type in order, each a compare-and-set on its version:
-- a change is written only if it is newer than the entry held (live or tombstone) and newer than
-- the type's truncate floor.
-- KEYS: the type's key set (see _common.lua).
-- ARGV[1] live-entry TTL ms (0: none), ARGV[2] tombstone TTL ms (0: none), then five fields per
-- change: op ("u" insert/update, "d" delete, "t" truncate), entity id, version key, checksum,
-- row JSON ("" for a delete or a truncate).
-- Returns two fields per change: "a" (applied) or "s" (stale), and the row held before it ("" for
-- none or a tombstone; "" for a truncate).
local now = now_ms()
local live_ttl, dead_ttl = tonumber(ARGV[1]), tonumber(ARGV[2])
-- Prune at least as many expired entries as this batch can add, so the hash stays bounded.
prune(now, PRUNE_MIN + 2 * math.floor((#ARGV - 2) / 5))
local floor = redis.call('GET', K_FLOOR) or ''

-- Remove every entry older than the truncate; newer ones came from changes after it.
local function truncate_below(version)
  local cursor = '0'
  repeat
    local page = redis.call('HSCAN', K_ROWS, cursor, 'COUNT', 1000)
    cursor = page[1]
    local fields = page[2]
    for i = 1, #fields, 2 do
      if newer(version, string.sub(fields[i + 1], 1, 24)) then remove(fields[i]) end
    end
  until cursor == '0'
end

local out = {}
for i = 3, #ARGV, 5 do
  local op, id, version, sum, row = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]
  local outcome, previous = 's', ''
  if op == 't' then
    if newer(version, floor) then
      floor = version
      redis.call('SET', K_FLOOR, version)
      truncate_below(version)
      outcome = 'a'
    end
  else
    local entry = held(id, now)
    if entry then previous = entry.row end
    if newer(version, floor) and (not entry or newer(version, entry.version)) then
      local revision = 1
      if entry then revision = entry.revision + 1 end
      if op == 'd' then
        put(id, version, expiry(now, dead_ttl), revision, sum, '')
      else
        put(id, version, expiry(now, live_ttl), revision, sum, row)
      end
      outcome = 'a'
    end
  end
  out[#out + 1] = outcome
  out[#out + 1] = previous
end
return out
