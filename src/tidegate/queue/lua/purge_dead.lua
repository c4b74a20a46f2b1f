-- Delete dead letters with their payloads, results and idempotency keys.
-- KEYS: jobs payloads results idem dead
-- ARGV[1] finished at or before this epoch ms ('' = any age); ARGV[2] "all" or "ids";
-- ARGV[3] batch size for "all"; ARGV[3..] job ids for "ids".
-- Returns how many were deleted.
local cutoff = ARGV[1] == '' and '+inf' or ARGV[1]
local ids
if ARGV[2] == 'all' then
  ids = redis.call('ZRANGEBYSCORE', K.dead, '-inf', cutoff, 'LIMIT', 0, tonumber(ARGV[3]))
else
  ids = {}
  for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
end
local limit = tonumber(cutoff) or math.huge
local count = 0
for _, id in ipairs(ids) do
  local score = redis.call('ZSCORE', K.dead, id)
  if score and tonumber(score) <= limit then
    erase(K, id, K.dead)
    count = count + 1
  end
end
return count
