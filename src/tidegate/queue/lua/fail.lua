-- Record a failed attempt: the job waits for its retry at its own priority, or is dead when it has
-- used its attempts.
-- KEYS: the queue's key set (see _common.lua).
-- ARGV[4] job id, ARGV[5] lease token, ARGV[6] error, ARGV[7] retry delay ms (-1: dead now,
-- whatever attempts are left), ARGV[8] the failure as JSON, kept only if the job dies ('' = none;
-- stored as a string, never decoded here).
-- Returns the new state ("failed" or "dead"), or the error "LEASE_LOST ..." with nothing changed.
local job, err = leased_job(ARGV[4], ARGV[5])
if not job then return redis.error_reply(err) end
local now = now_ms()
detach(job)
add_error(job, ARGV[6])
local delay = tonumber(ARGV[7])
if delay < 0 or job.attempts >= job.max_attempts then
  if ARGV[8] ~= '' then job.failure = ARGV[8] end
  finish(job, 'dead', now)
  announce()
  return 'dead'
end
job.level = job.priority
park(job, 'failed', now + delay)
save(job)
-- Blocked claimers wake to re-read the next due time.
ring({[job.level] = 1})
return 'failed'
