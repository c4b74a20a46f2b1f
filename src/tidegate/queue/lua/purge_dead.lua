-- Delete dead letters with their payloads, results and idempotency keys.
-- KEYS: the queue's key set (see _common.lua).
-- ARGV[4] finished at or before this epoch ms ('' = any age); ARGV[5] "all" or "ids";
-- ARGV[6] batch size for "all"; ARGV[6..] job ids for "ids".
-- Returns how many were deleted.
local cutoff = ARGV[4] == '' and '+inf' or ARGV[4]
local ids
if ARGV[5] == 'all' then
  ids = redis.call('ZRANGEBYSCORE', K_DEAD, '-inf', cutoff, 'LIMIT', 0, tonumber(ARGV[6]))
else
  ids = {}
  for i = 6, #ARGV do ids[#ids + 1] = ARGV[i] end
end
local limit = tonumber(cutoff) or math.huge
local count = 0
for _, id in ipairs(ids) do
  local score = redis.call('ZSCORE', K_DEAD, id)
  if score and tonumber(score) <= limit then
    erase(id, K_DEAD)
    count = count + 1
  end
end
return count
