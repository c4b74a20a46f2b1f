-- Record results of leased jobs: each becomes succeeded, unless its lease is stale.
-- KEYS: the queue's key set (see _common.lua).
-- ARGV from [4], three per job: id, lease token, result JSON.
-- Returns the reasons of the stale leases (empty when every job was completed); a job with a
-- stale lease is left unchanged.
local now = now_ms()
local lost = {}
for o = 4, #ARGV, 3 do
  local job, err = leased_job(ARGV[o], ARGV[o + 1])
  if job then
    redis.call('HSET', K_RESULTS, job.id, ARGV[o + 2])
    finish(job, 'succeeded', now)
  else
    lost[#lost + 1] = err
  end
end
announce()
return lost
