-- Extend a lease.
-- KEYS: jobs due leased:0..4
-- ARGV[1] job id, ARGV[2] lease token, ARGV[3] lease ms.
-- Returns the new lease expiry (epoch ms), or the error "LEASE_LOST ..." with nothing changed.
local job, err = leased_job(K, ARGV[1], ARGV[2])
if not job then return redis.error_reply(err) end
job.lease_expires_ms = now_ms() + tonumber(ARGV[3])
redis.call('ZADD', K.leased[job.priority], job.lease_expires_ms, job.id)
due_at(job.lease_expires_ms)  -- a shorter lease than before comes due sooner
settle_due(K)
save(K, job)
return job.lease_expires_ms
