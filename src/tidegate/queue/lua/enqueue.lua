-- Add a batch of jobs atomically: all or none.
-- KEYS: the queue's key set (see _common.lua).
-- ARGV[4] number of jobs n; ARGV[5..9] max depth of levels 0..4 (-1 = no limit);
-- then 10 fields per job from ARGV[10]: id, priority, tenant, created_ms, not_before_ms ('' = now),
-- deadline_ms (''), max_attempts, idempotency_key (''), callback_url (''), payload.
-- Returns the id of every job in order (a known idempotency key returns the first job's id), or
-- the error "QUEUE_FULL <level> <depth> <limit>" with nothing written.
local n = tonumber(ARGV[4])
local FIRST, FIELDS = 10, 10
local ids, fresh, seen, adding = {}, {}, {}, {}

for i = 0, n - 1 do
  local o = FIRST + i * FIELDS
  local key = ARGV[o + 7]
  local existing = nil
  if key ~= '' then existing = seen[key] or redis.call('HGET', K_IDEM, key) end
  if existing then
    ids[#ids + 1] = existing
  else
    if key ~= '' then seen[key] = ARGV[o] end
    ids[#ids + 1] = ARGV[o]
    fresh[#fresh + 1] = o
    local level = tonumber(ARGV[o + 1])
    adding[level] = (adding[level] or 0) + 1
  end
end

for level = 0, 4 do
  local limit = tonumber(ARGV[5 + level])
  if adding[level] and limit >= 0 then
    local depth = redis.call('ZCARD', ready_key(level))
    if depth + adding[level] > limit then
      return redis.error_reply('QUEUE_FULL ' .. level .. ' ' .. depth .. ' ' .. limit)
    end
  end
end

local now = now_ms()
local wake = {}
for _, o in ipairs(fresh) do
  local job = {
    id = ARGV[o], priority = tonumber(ARGV[o + 1]), tenant = ARGV[o + 2],
    created_ms = tonumber(ARGV[o + 3]), max_attempts = tonumber(ARGV[o + 6]),
    attempts = 0, lease_token = 0, seq = redis.call('INCR', K_SEQ),
  }
  job.level = job.priority
  if ARGV[o + 5] ~= '' then job.deadline_ms = tonumber(ARGV[o + 5]) end
  if ARGV[o + 7] ~= '' then
    job.idempotency_key = ARGV[o + 7]
    redis.call('HSET', K_IDEM, ARGV[o + 7], job.id)
  end
  if ARGV[o + 8] ~= '' then job.callback_url = ARGV[o + 8] end
  redis.call('HSET', K_PAYLOADS, job.id, ARGV[o + 9])
  if ARGV[o + 4] ~= '' then
    park(job, 'delayed', tonumber(ARGV[o + 4]))
  else
    make_ready(job, now, wake)
  end
  save(job)
end
ring(wake)
return ids
