-- Delete a finished job now, as retention would later: its record, payload, result and
-- idempotency key.
-- KEYS: jobs payloads results idem finished answered dead
-- ARGV[1] job id.
-- Returns 1 when deleted, 0 when the job is unknown or has not finished.
local job = load(K, ARGV[1])
if not job then return 0 end
local s = job.state
if s == 'dead' then
  erase(K, job.id, K.dead)
  return 1
end
if s == 'succeeded' or s == 'cancelled' or s == 'expired' then
  -- Either index: a job a release before format 2 finished is in `finished` whatever it says.
  erase(K, job.id, K.finished)
  redis.call('ZREM', K.answered, job.id)
  return 1
end
return 0
