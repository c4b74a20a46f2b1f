-- Give a leased job back untouched, the attempt uncounted: queued again at its own priority, or
-- parked as a delayed job when a delay is given; a reason, when given, becomes its last error.
-- KEYS: the queue's key set (see _common.lua).
-- ARGV[4] job id, ARGV[5] lease token, ARGV[6] delay ms (0 = at once), ARGV[7] reason ("" = none).
-- Returns 1, or the error "LEASE_LOST ..." with nothing changed.
local job, err = leased_job(ARGV[4], ARGV[5])
if not job then return redis.error_reply(err) end
local wake = {}
detach(job)
job.attempts = job.attempts - 1
job.level = job.priority
if ARGV[7] and ARGV[7] ~= '' then job.last_error = ARGV[7] end
local delay = tonumber(ARGV[6])
if delay > 0 then
  park(job, 'delayed', now_ms() + delay)
  wake[job.level] = 1  -- blocked claimers re-read the next due time
else
  make_ready(job, now_ms(), wake)
end
save(job)
ring(wake)
return 1
