-- Extend a lease.
-- KEYS: the queue's key set (see _common.lua).
-- ARGV[4] job id, ARGV[5] lease token, ARGV[6] lease ms.
-- Returns the new lease expiry (epoch ms), or the error "LEASE_LOST ..." with nothing changed.
local job, err = leased_job(ARGV[4], ARGV[5])
if not job then return redis.error_reply(err) end
job.lease_expires_ms = now_ms() + tonumber(ARGV[6])
redis.call('ZADD', leased_key(job.priority), job.lease_expires_ms, job.id)
save(job)
return job.lease_expires_ms
