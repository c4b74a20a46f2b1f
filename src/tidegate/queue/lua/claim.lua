-- Lease up to `limit` jobs: due delayed jobs are promoted and overdue ones expired first, then
-- levels are served in the given order, each by turn and FIFO.
-- KEYS: the queue's key set (see _common.lua).
-- ARGV[4] worker id, ARGV[5] lease ms, ARGV[6] limit, ARGV[7..] levels to serve, ascending.
-- Returns a flat array: job record, payload, job record, payload, ...
local worker, lease_ms, limit = ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local now = now_ms()
local wake = {}
promote_due(now, 1000, wake)
expire_overdue(now, 1000)

local out, claimed = {}, 0
for i = 7, #ARGV do
  local level = tonumber(ARGV[i])
  while claimed < limit do
    local popped = redis.call('ZPOPMIN', ready_key(level), limit - claimed)
    if #popped == 0 then break end
    local top_turn = nil
    for j = 1, #popped, 2 do
      local member = popped[j]
      local job = load(id_of(member))
      if job and job.state == 'queued' and job.member == member then
        job.member = nil
        if job.deadline_ms and job.deadline_ms <= now then
          job.last_error = 'deadline passed'
          finish(job, 'expired', now)
        else
          detach(job)
          job.state = 'leased'
          job.attempts = job.attempts + 1
          job.lease_token = job.lease_token + 1
          job.worker_id = worker
          job.lease_expires_ms = now + lease_ms
          redis.call('ZADD', leased_key(job.priority), job.lease_expires_ms, job.id)
          out[#out + 1] = save(job)
          out[#out + 1] = redis.call('HGET', K_PAYLOADS, job.id)
          claimed = claimed + 1
          top_turn = turn_of(member)
        end
      end
    end
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
