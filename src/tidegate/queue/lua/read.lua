-- Read jobs consistently: records with payloads and results.
-- KEYS: the queue's key set (see _common.lua).
-- ARGV[4] "ids" with ids from ARGV[5], or "dead" with ARGV[5] offset and ARGV[6] limit (most
-- recent first). Returns a flat array: record, payload, result ('' when none) per job found.
local ids
if ARGV[4] == 'dead' then
  local offset, limit = tonumber(ARGV[5]), tonumber(ARGV[6])
  if limit <= 0 then return {} end
  ids = redis.call('ZREVRANGE', K_DEAD, offset, offset + limit - 1)
else
  ids = {}
  for i = 5, #ARGV do ids[#ids + 1] = ARGV[i] end
end
local out = {}
for _, id in ipairs(ids) do
  local raw = redis.call('HGET', K_JOBS, id)
  if raw then
    out[#out + 1] = raw
    out[#out + 1] = redis.call('HGET', K_PAYLOADS, id) or ''
    out[#out + 1] = redis.call('HGET', K_RESULTS, id) or ''
  end
end
return out
