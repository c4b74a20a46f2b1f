-- Read a page of catalogue changes after a version, oldest first; writes nothing.
-- KEYS: as item_put.lua (data, log, version).
-- ARGV[1] the reader's version, ARGV[2] page size.
-- Returns {current version, then per change: item id, its version, the item or "" (removed)}.
local current = tonumber(redis.call('GET', KEYS[3]) or '0')
local page = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. ARGV[1], '+inf', 'WITHSCORES',
                        'LIMIT', 0, tonumber(ARGV[2]))
local out = {current}
if #page == 0 then return out end
local ids = {}
for i = 1, #page, 2 do ids[#ids + 1] = page[i] end
local items = redis.call('HMGET', KEYS[1], unpack(ids))
for i = 1, #ids do
  out[#out + 1] = ids[i]
  out[#out + 1] = page[2 * i]
  out[#out + 1] = items[i] or ''
end
return out
