-- Give a leased job back untouched, the attempt uncounted: queued again at its own priority, or
-- parked as a delayed job when a delay is given; a reason, when given, becomes its last error.
-- KEYS: jobs deadlines aging turns due ready:0..4 waiting:0..4 delayed:0..4 leased:0..4 signal:0..4
-- ARGV[1] job id, ARGV[2] lease token, ARGV[3] delay ms (0 = at once), ARGV[4] reason ("" = none).
-- Returns 1, or the error "LEASE_LOST ..." with nothing changed.
local job, err = leased_job(K, ARGV[1], ARGV[2])
if not job then return redis.error_reply(err) end
local wake = {}
detach(K, job)
job.attempts = job.attempts - 1
job.level = job.priority
if ARGV[4] and ARGV[4] ~= '' then job.last_error = ARGV[4] end
local delay = tonumber(ARGV[3])
if delay > 0 then
  park(K, job, 'delayed', now_ms() + delay)
  wake[job.level] = 1  -- blocked claimers re-read the next due time
else
  make_ready(K, job, now_ms(), wake)
end
save(K, job)
settle_due(K)
ring(K, wake)
return 1
