-- Lease up to `limit` jobs: expired leases are recovered (a bounded batch: recovery must not
-- wait for a maintenance pass), due delayed jobs promoted and overdue ones expired first, then
-- levels are served in the given order, each by turn and FIFO.
-- KEYS: the queue's key set (see _common.lua).
-- ARGV[4] worker id, ARGV[5] lease ms, ARGV[6] limit, ARGV[7..] levels to serve, ascending.
-- Returns a flat array: job record, payload, job record, payload, ...
local worker, lease_ms, limit = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local now = now_ms()
local wake = {}
local RECOVER_PER_CLAIM = 100  -- per priority; maintain takes the rest of a large backlog
recover_expired(now, RECOVER_PER_CLAIM, wake)
expire_overdue(now, 1000)

local out, claimed = {}, 0
for i = 7, #ARGV do
  local level = tonumber(ARGV[i])
  -- Due work of this level joins its line before the line is served, so strict priority holds
  -- however many jobs of lower levels came due at once.
  promote_due(level, now, math.max(limit, 1000), wake)
  while claimed < limit do
    local popped = redis.call('ZPOPMIN', ready_key(level), limit - claimed)
    if #popped == 0 then break end
    local ids = {}
    for j = 1, #popped, 2 do ids[#ids + 1] = id_of(popped[j]) end
    local records = redis.call('HMGET', K_JOBS, unpack(ids))
    local payloads = redis.call('HMGET', K_PAYLOADS, unpack(ids))
    local batch, top_turn = Batch.new(), nil
    for n, id in ipairs(ids) do
      local member = popped[2 * n - 1]
      local job = records[n] and cmsgpack.unpack(records[n])
      -- A member whose record moved on (cancelled, re-queued under a new member) is dropped.
      if job and job.state == 'queued' and job.member == member then
        job.member = nil
        if job.deadline_ms and job.deadline_ms <= now then
          job.last_error = 'deadline passed'
          finish(job, 'expired', now)
        else
          batch:add('ZREM', waiting_key(level), id)
          if AGING_MS > 0 then batch:add('ZREM', K_AGING, id) end
          if job.deadline_ms then batch:add('ZREM', K_DEADLINES, id) end
          job.state = 'leased'
          job.attempts = job.attempts + 1
          job.lease_token = job.lease_token + 1
          job.worker_id = worker
          job.lease_expires_ms = now + lease_ms
          batch:add('ZADD', leased_key(job.priority), job.lease_expires_ms, id)
          local record = cmsgpack.pack(job)
          batch:add('HSET', K_JOBS, id, record)
          out[#out + 1] = record
          out[#out + 1] = payloads[n]
          claimed = claimed + 1
          top_turn = turn_of(member)
          forget_turn(level, job.tenant, top_turn)
        end
      end
    end
    batch:flush()
    if ROUND_ROBIN and top_turn then
      local current = tonumber(redis.call('HGET', K_TURNS, tostring(level)) or '0')
      if top_turn > current then redis.call('HSET', K_TURNS, tostring(level), top_turn) end
    end
  end
  if claimed >= limit then break end
end
ring(wake)
announce()
return out
