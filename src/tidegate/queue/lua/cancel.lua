-- Cancel a job that has not finished; a leased job's lease becomes stale.
-- KEYS: jobs deadlines aging finished answered ready:0..4 waiting:0..4 delayed:0..4 leased:0..4
-- ARGV[1] job id.
-- Returns 1 when cancelled, 0 when the job is unknown or already final.
local job = load(K, ARGV[1])
if not job then return 0 end
local s = job.state
if s ~= 'queued' and s ~= 'delayed' and s ~= 'failed' and s ~= 'leased' then return 0 end
finish(K, job, 'cancelled', now_ms())
announce()
return 1
