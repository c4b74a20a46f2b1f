-- Give a leased job back untouched: queued again at its own priority, the attempt uncounted.
-- KEYS: the queue's key set (see _common.lua).
-- ARGV[4] job id, ARGV[5] lease token.
-- Returns 1, or the error "LEASE_LOST ..." with nothing changed.
local job, err = leased_job(ARGV[4], ARGV[5])
if not job then return redis.error_reply(err) end
local wake = {}
detach(job)
job.attempts = job.attempts - 1
job.level = job.priority
make_ready(job, now_ms(), wake)
save(job)
ring(wake)
return 1
