-- Put dead jobs back in the queue at their own priority with fresh attempts.
-- KEYS: jobs deadlines aging turns dead due ready:0..4 waiting:0..4 signal:0..4
-- ARGV[1] "all" or "ids"; ARGV[2] batch size for "all"; ARGV[2..] job ids for "ids".
-- Returns how many jobs were redriven.
local ids
if ARGV[1] == 'all' then
  ids = redis.call('ZRANGE', K.dead, 0, tonumber(ARGV[2]) - 1)
else
  ids = {}
  for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
end
local now, wake, count = now_ms(), {}, 0
for _, id in ipairs(ids) do
  local job = load(K, id)
  if job and job.state == 'dead' then
    redis.call('ZREM', K.dead, id)
    detach(K, job)  -- a dead job: deadlines only
    job.attempts = 0
    job.finished_ms = nil
    job.failure = nil
    -- Its caller, if one waited, was answered with the failure long ago.
    job.caller_waits = nil
    job.brief = nil
    requeue(K, job, now, wake)
    count = count + 1
  end
end
settle_due(K)
ring(K, wake)
return count
