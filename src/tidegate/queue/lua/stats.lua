-- A consistent snapshot for stats() and for blocked claimers.
-- KEYS: the queue's key set (see _common.lua).
-- Returns {now_ms, next_due_ms or -1, delayed, dead, then per level 0..4: depth, ready_ms of
-- the job at the head (-1 when empty), leased}.
local now = now_ms()
local due = redis.call('ZRANGE', K_DELAYED, 0, 0, 'WITHSCORES')
local out = {now, due[2] and tonumber(due[2]) or -1, redis.call('ZCARD', K_DELAYED),
             redis.call('ZCARD', K_DEAD)}
for level = 0, 4 do
  local head = redis.call('ZRANGE', ready_key(level), 0, 0)
  local ready_ms = -1
  if head[1] then
    local job = load(id_of(head[1]))
    if job and job.ready_ms then ready_ms = job.ready_ms end
  end
  out[#out + 1] = redis.call('ZCARD', ready_key(level))
  out[#out + 1] = ready_ms
  out[#out + 1] = redis.call('ZCARD', leased_key(level))
end
return out
