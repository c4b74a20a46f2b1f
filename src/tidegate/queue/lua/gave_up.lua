-- The caller that waited for a job stopped waiting before it had the answer: the job becomes one
-- nobody waits for (a spent budget defers it) and is kept the finished ttl once it finishes; if
-- it has finished already, it moves from the answered index to the finished one, its score kept.
-- KEYS: jobs finished answered
-- ARGV[1] job id.
-- Returns 1 when a caller waited for the job, 0 when none did or the job is unknown.
local job = load(K, ARGV[1])
if not job or not job.caller_waits then return 0 end
job.caller_waits = nil
if job.brief then
  job.brief = nil
  local score = redis.call('ZSCORE', K.answered, job.id)
  if score then
    redis.call('ZREM', K.answered, job.id)
    redis.call('ZADD', K.finished, score, job.id)
  end
end
save(K, job)
return 1
