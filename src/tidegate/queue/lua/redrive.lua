-- Put dead jobs back in the queue at their own priority with fresh attempts.
-- KEYS: the queue's key set (see _common.lua).
-- ARGV[4] "all" or "ids"; ARGV[5] batch size for "all"; ARGV[5..] job ids for "ids".
-- Returns how many jobs were redriven.
local ids
if ARGV[4] == 'all' then
  ids = redis.call('ZRANGE', K_DEAD, 0, tonumber(ARGV[5]) - 1)
else
  ids = {}
  for i = 5, #ARGV do ids[#ids + 1] = ARGV[i] end
end
local now, wake, count = now_ms(), {}, 0
for _, id in ipairs(ids) do
  local job = load(id)
  if job and job.state == 'dead' then
    redis.call('ZREM', K_DEAD, id)
    detach(job)
    job.attempts = 0
    job.finished_ms = nil
    job.failure = nil
    requeue(job, now, wake)
    count = count + 1
  end
end
ring(wake)
return count
