-- A consistent snapshot for stats() and for blocked claimers.
-- KEYS: dead results ready:0..4 waiting:0..4 delayed:0..4 leased:0..4
-- ARGV: none.
-- Returns {now_ms, next_due_ms or -1, delayed, dead, then per level 0..4: depth, the earliest
-- time a waiting job became claimable (-1 when none), leased; then succeeded}. next_due_ms is when
-- claimable work may next appear without a push: a delayed job comes due or a lease expires (a
-- claim recovers it). succeeded counts the succeeded jobs still kept: only they have a result.
local now = now_ms()
local delayed = 0
for priority = 0, 4 do delayed = delayed + redis.call('ZCARD', K.delayed[priority]) end
local out = {now, next_due(K), delayed, redis.call('ZCARD', K.dead)}
for level = 0, 4 do
  local oldest = redis.call('ZRANGE', K.waiting[level], 0, 0, 'WITHSCORES')
  out[#out + 1] = redis.call('ZCARD', K.ready[level])
  out[#out + 1] = oldest[2] and tonumber(oldest[2]) or -1
  out[#out + 1] = redis.call('ZCARD', K.leased[level])
end
out[#out + 1] = redis.call('HLEN', K.results)
return out
