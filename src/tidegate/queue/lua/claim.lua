-- Lease up to `limit` jobs: expired leases are recovered (a bounded batch: recovery must not
-- wait for a maintenance pass), due delayed jobs promoted and overdue ones expired first, then
-- levels are served in the given order, each by turn and FIFO. Those scans run only once the
-- stored `due` has come (see lua/_common.lua): before it, none of them would find anything.
-- KEYS: jobs payloads deadlines aging turns finished answered dead due ready:0..4 leased:0..4 signal:0..4
-- waiting:0..4 delayed:0..4
-- ARGV[1] worker id, ARGV[2] lease ms, ARGV[3] limit, ARGV[4..] levels to serve, ascending.
-- Returns a flat array: job record, payload, job record, payload, ...; or, when nothing was
-- claimed, {now ms, next due ms or -1}: when claimable work may next appear without a push (a
-- delayed job comes due or a lease expires), so a claimer knows how long it may block.
local worker, lease_ms, limit = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local wake = {}
local RECOVER_PER_CLAIM = 100  -- per priority; maintain takes the rest of a large backlog
local scan = now >= tonumber(redis.call('GET', K.due) or '0')
if scan then
  recover_expired(K, now, RECOVER_PER_CLAIM, wake)
  expire_overdue(K, now, 1000)
end

local out, claimed = {}, 0
for i = 4, #ARGV do
  local level = tonumber(ARGV[i])
  -- Due work of this level joins its line before the line is served, so strict priority holds
  -- however many jobs of lower levels came due at once.
  if scan then promote_due(K, level, now, math.max(limit, 1000), wake) end
  while claimed < limit do
    local popped = redis.call('ZPOPMIN', K.ready[level], limit - claimed)
    if #popped == 0 then break end
    local ids = {}
    for j = 1, #popped, 2 do ids[#ids + 1] = id_of(popped[j]) end
    local records = redis.call('HMGET', K.jobs, unpack(ids))
    local payloads = redis.call('HMGET', K.payloads, unpack(ids))
    local batch, top_turn = Batch.new(), nil
    for n, id in ipairs(ids) do
      local member = popped[2 * n - 1]
      local job = records[n] and cmsgpack.unpack(records[n])
      -- A member whose record moved on (cancelled, re-queued under a new member) is dropped.
      if job and job.state == 'queued' and job.member == member then
        job.member = nil
        if job.deadline_ms and job.deadline_ms <= now then
          job.last_error = 'deadline passed'
          finish(K, job, 'expired', now)
        else
          batch:add('ZREM', K.waiting[level], id)
          if AGING_MS > 0 then batch:add('ZREM', K.aging, id) end
          if job.deadline_ms then batch:add('ZREM', K.deadlines, id) end
          job.state = 'leased'
          job.attempts = job.attempts + 1
          job.lease_token = job.lease_token + 1
          job.worker_id = worker
          job.lease_expires_ms = now + lease_ms
          batch:add('ZADD', K.leased[job.priority], job.lease_expires_ms, id)
          due_at(job.lease_expires_ms)
          local record = cmsgpack.pack(job)
          batch:add('HSET', K.jobs, id, record)
          out[#out + 1] = record
          out[#out + 1] = payloads[n]
          claimed = claimed + 1
          top_turn = turn_of(member)
          forget_turn(K, level, job.tenant, top_turn)
        end
      end
    end
    batch:flush()
    if ROUND_ROBIN and top_turn then
      local current = tonumber(redis.call('HGET', K.turns, tostring(level)) or '0')
      if top_turn > current then redis.call('HSET', K.turns, tostring(level), top_turn) end
    end
  end
  if claimed >= limit then break end
end
-- After a scan the stored due is the earliest score left: what the batches above could not take
-- (and the levels this claim did not reach) keeps it due, so the next claim scans again.
if scan then reset_due(K) else settle_due(K) end
ring(K, wake)
announce()
if claimed == 0 then return {now, next_due(K)} end
return out
