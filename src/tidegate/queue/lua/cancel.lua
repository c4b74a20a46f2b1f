-- Cancel a job that has not finished; a leased job's lease becomes stale.
-- KEYS: the queue's key set (see _common.lua).
-- ARGV[4] job id.
-- Returns 1 when cancelled, 0 when the job is unknown or already final.
local job = load(ARGV[4])
if not job then return 0 end
local s = job.state
if s ~= 'queued' and s ~= 'delayed' and s ~= 'failed' and s ~= 'leased' then return 0 end
finish(job, 'cancelled', now_ms())
announce()
return 1
