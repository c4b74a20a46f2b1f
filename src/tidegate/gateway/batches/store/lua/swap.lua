-- Replace a batch's record if its status is still the expected one: a compare-and-set, so two
-- gateways finalizing one batch, or a cancel meeting a finalization, never undo each other.
-- Not sent twice: a second run would find the new status and answer 0.
-- KEYS[1] tidegate:{name}:batches  hash  batch id -> BatchRecord JSON (its "status" compared)
-- KEYS[2] tidegate:{name}:batches_active  sorted set  ids of the batches still followed, by
--         when they were last checked (epoch ms)
-- ARGV[1] batch id, [2] expected status, [3] the new record, [4] its checked_ms when it is
--         still followed, '' when it has ended
-- Returns 1 when replaced, 0 when there is no such batch or its status is another.
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then
  return 0
end
if cjson.decode(raw)['status'] ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
if ARGV[4] == '' then
  redis.call('ZREM', KEYS[2], ARGV[1])
else
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
end
return 1
