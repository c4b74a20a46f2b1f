-- One page of a listing, newest first: the records of up to ARGV[2] ids of an index, after the
-- id ARGV[1]. Within one second ids are in reverse byte order (ZREVRANGE), so the order is
-- total and a cursor never skips or repeats a record.
-- KEYS[1] the index: a sorted set of ids by created_at (epoch s), e.g.
--         tidegate:{name}:files_of:<tenant> or tidegate:{name}:batches_of:<tenant>
-- KEYS[2] the hash of the records (id -> JSON): tidegate:{name}:files or tidegate:{name}:batches
-- ARGV[1] the id the page follows ('' from the start), [2] the most ids to read
-- Returns the records found, in order (none when ARGV[1] is not in the index).
local start = 0
if ARGV[1] ~= '' then
  local rank = redis.call('ZREVRANK', KEYS[1], ARGV[1])
  if not rank then
    return {}
  end
  start = rank + 1
end
local ids = redis.call('ZREVRANGE', KEYS[1], start, start + tonumber(ARGV[2]) - 1)
if #ids == 0 then
  return {}
end
local records = {}
for first = 1, #ids, 1000 do  -- unpack's stack holds a few thousand values at most
  local chunk = {unpack(ids, first, math.min(first + 999, #ids))}
  for _, raw in ipairs(redis.call('HMGET', KEYS[2], unpack(chunk))) do
    if raw then
      records[#records + 1] = raw
    end
  end
end
return records
