-- One upkeep pass: recover expired leases, promote due jobs, expire overdue ones, age waiting
-- jobs, drop finished jobs and dead letters past retention. A script runs alone on its server,
-- so passes from different workers never interleave.
-- KEYS: jobs payloads results idem deadlines aging turns finished answered dead due ready:0..4 leased:0..4
-- signal:0..4 waiting:0..4 delayed:0..4
-- ARGV[1] finished ttl ms, ARGV[2] dead ttl ms, ARGV[3] batch size per step, ARGV[4] answered ttl
-- ms.
-- Returns {recovered, dead, expired, promoted, aged, purged}.
local finished_ttl, dead_ttl, batch = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local answered_ttl = tonumber(ARGV[4])
local now = now_ms()
local wake = {}
local aged, purged = 0, 0
local recovered, dead = recover_expired(K, now, batch, wake)

local promoted = 0
for level = 0, 4 do promoted = promoted + promote_due(K, level, now, batch, wake) end
local expired = expire_overdue(K, now, batch)

if AGING_MS > 0 then
  local ids = redis.call('ZRANGEBYSCORE', K.aging, '-inf', now, 'LIMIT', 0, batch)
  for _, id in ipairs(ids) do
    local job = load(K, id)
    if job and job.state == 'queued' and job.level > 0 then
      -- The level a job deserves follows from how long it has waited; never above CRITICAL.
      local target = math.max(0, job.priority - math.floor((now - job.ready_ms) / AGING_MS))
      if target < job.level then
        redis.call('ZREM', K.ready[job.level], job.member)
        redis.call('ZREM', K.waiting[job.level], id)
        job.level = target
        job.member = member_of(job, give_turn(K, job))
        redis.call('ZADD', K.ready[job.level], 0, job.member)
        redis.call('ZADD', K.waiting[job.level], job.ready_ms, id)
        wake[job.level] = (wake[job.level] or 0) + 1
        aged = aged + 1
        save(K, job)
      end
      if job.level > 0 then
        local waited_steps = job.priority - job.level + 1
        redis.call('ZADD', K.aging, job.ready_ms + waited_steps * AGING_MS, id)
      else
        redis.call('ZREM', K.aging, id)
      end
    else
      redis.call('ZREM', K.aging, id)
    end
  end
end

local function drop(index, cutoff)
  local ids = redis.call('ZRANGEBYSCORE', index, '-inf', cutoff, 'LIMIT', 0, batch)
  for _, id in ipairs(ids) do erase(K, id, index) end
  return #ids
end
purged = drop(K.finished, now - finished_ttl) + drop(K.answered, now - answered_ttl)
  + drop(K.dead, now - dead_ttl)

if ROUND_ROBIN then
  -- A tenant whose last turn is behind its level's current turn gains nothing from its entry,
  -- and on a level with nobody waiting no entry matters (cancelled or expired newest jobs).
  local turns = redis.call('HGETALL', K.turns)
  for i = 1, #turns, 2 do
    local level = string.match(turns[i], '^(%d):')
    if level then
      local current = tonumber(redis.call('HGET', K.turns, level) or '0')
      local idle = redis.call('ZCARD', K.ready[tonumber(level)]) == 0
      if idle or tonumber(turns[i + 1]) < current then redis.call('HDEL', K.turns, turns[i]) end
    end
  end
end

-- A full pass: the stored due becomes exact again (whatever wrote to the indexes without lowering
-- it, such as a script of an older version, is found here at the latest).
reset_due(K)
ring(K, wake)
announce()
return {recovered, dead, expired, promoted, aged, purged}
