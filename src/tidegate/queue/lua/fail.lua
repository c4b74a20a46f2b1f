-- Record a failed attempt: the job waits for its retry at its own priority, or is dead when it has
-- used its attempts.
-- KEYS: jobs deadlines dead due leased:0..4 delayed:0..4 signal:0..4
-- ARGV[1] job id, ARGV[2] lease token, ARGV[3] error, ARGV[4] retry delay ms (-1: dead now,
-- whatever attempts are left), ARGV[5] the failure as JSON, kept only if the job dies ('' = none;
-- stored as a string, never decoded here).
-- Returns the new state ("failed" or "dead"), or the error "LEASE_LOST ..." with nothing changed.
local job, err = leased_job(K, ARGV[1], ARGV[2])
if not job then return redis.error_reply(err) end
local now = now_ms()
detach(K, job)  -- a leased job: its leased index and deadlines
add_error(job, ARGV[3])
local delay = tonumber(ARGV[4])
if delay < 0 or job.attempts >= job.max_attempts then
  if ARGV[5] ~= '' then job.failure = ARGV[5] end
  finish(K, job, 'dead', now)
  announce()
  return 'dead'
end
job.level = job.priority
park(K, job, 'failed', now + delay)
save(K, job)
settle_due(K)
-- Blocked claimers wake to re-read the next due time.
ring(K, {[job.level] = 1})
return 'failed'
