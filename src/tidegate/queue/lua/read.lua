-- Read jobs consistently: records with payloads and results.
-- KEYS: jobs payloads results dead
-- ARGV[1] "ids" with ids from ARGV[2], or "dead" with ARGV[2] offset and ARGV[3] limit (most
-- recent first). Returns a flat array: record, payload, result ('' when none) per job found.
local ids
if ARGV[1] == 'dead' then
  local offset, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
  if limit <= 0 then return {} end
  ids = redis.call('ZREVRANGE', K.dead, offset, offset + limit - 1)
else
  ids = {}
  for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
end
local out = {}
for _, id in ipairs(ids) do
  local raw = redis.call('HGET', K.jobs, id)
  if raw then
    out[#out + 1] = raw
    out[#out + 1] = redis.call('HGET', K.payloads, id) or ''
    out[#out + 1] = redis.call('HGET', K.results, id) or ''
  end
end
return out
