-- Add a batch of jobs atomically: all or none.
-- KEYS: jobs payloads idem seq deadlines aging turns due ready:0..4 waiting:0..4 signal:0..4
-- delayed:0..4
-- ARGV[1] JSON array with one array per job: [id, priority, tenant, created_ms, not_before_ms
-- (0 = now), deadline_ms (0 = none), max_attempts, idempotency_key ('' = none), callback_url
-- ('' = none), caller_waits (0/1), brief (0/1)]; ARGV[2..] the payloads, in the same order. (One JSON argument instead of nine
-- per job keeps the client's packing cheap.) The levels' depth limits are MAX_DEPTH.
-- Returns the id of every job in order (a known idempotency key returns the first job's id), or
-- the error "QUEUE_FULL <level> <depth> <limit>" with nothing written.
local specs = cjson.decode(ARGV[1])
local ids, fresh, seen, adding = {}, {}, {}, {}

for i, spec in ipairs(specs) do
  local key = spec[8]
  local existing = nil
  if key ~= '' then existing = seen[key] or redis.call('HGET', K.idem, key) end
  if existing then
    ids[i] = existing
  else
    if key ~= '' then seen[key] = spec[1] end
    ids[i] = spec[1]
    fresh[#fresh + 1] = i
    local level = spec[2]
    adding[level] = (adding[level] or 0) + 1
  end
end

for level = 0, 4 do
  local limit = MAX_DEPTH[level]
  if adding[level] and limit >= 0 then
    local depth = redis.call('ZCARD', K.ready[level])
    if depth + adding[level] > limit then
      return redis.error_reply('QUEUE_FULL ' .. level .. ' ' .. depth .. ' ' .. limit)
    end
  end
end

local now = now_ms()
local wake, batch = {}, Batch.new()
local first_seq = redis.call('INCRBY', K.seq, #fresh) - #fresh
for n, i in ipairs(fresh) do
  local spec = specs[i]
  local job = {
    id = spec[1], priority = spec[2], level = spec[2], tenant = spec[3], created_ms = spec[4],
    max_attempts = spec[7], attempts = 0, lease_token = 0, seq = first_seq + n,
  }
  if spec[6] > 0 then job.deadline_ms = spec[6] end
  if spec[8] ~= '' then
    job.idempotency_key = spec[8]
    batch:add('HSET', K.idem, spec[8], job.id)
  end
  if spec[9] ~= '' then job.callback_url = spec[9] end
  -- Left out of the record when 0, so a job nobody waits for is stored as before format 2.
  if spec[10] == 1 then job.caller_waits = 1 end
  if spec[11] == 1 then job.brief = 1 end
  batch:add('HSET', K.payloads, job.id, ARGV[1 + i])
  if spec[5] > 0 then
    park(K, job, 'delayed', spec[5], batch)
  else
    make_ready(K, job, now, wake, batch)
  end
  batch:add('HSET', K.jobs, job.id, cmsgpack.pack(job))
end
batch:flush()
settle_due(K)
ring(K, wake)
return ids
