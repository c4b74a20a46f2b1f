-- Record results of leased jobs: each becomes succeeded, unless its lease is stale.
-- KEYS: jobs results finished answered leased:0..4
-- ARGV, three per job: id, lease token, result JSON.
-- Returns one entry per job, in order: '' when it was completed, else why its lease is stale (a
-- job with a stale lease is left unchanged).
local now = now_ms()
local outcomes, ids, seen = {}, {}, {}
for o = 1, #ARGV, 3 do ids[#ids + 1] = ARGV[o] end
local records = redis.call('HMGET', K.jobs, unpack(ids))
local batch = Batch.new()
for n, id in ipairs(ids) do
  local token = ARGV[3 * n - 1]
  local job = records[n] and cmsgpack.unpack(records[n])
  if seen[id] then
    outcomes[n] = 'LEASE_LOST job ' .. id .. ' appears twice in one call'
  elseif not job or job.state ~= 'leased' or tonumber(job.lease_token) ~= tonumber(token) then
    local _, err = leased_job(K, id, token)
    outcomes[n] = err
  else
    outcomes[n] = ''
    seen[id] = true
    -- A leased job sits only in its leased index (claim took it out of the others).
    local result = ARGV[3 * n]
    batch:add('ZREM', K.leased[job.priority], id)
    batch:add('HSET', K.results, id, result)
    job.state = 'succeeded'
    job.finished_ms = now
    job.worker_id = nil
    job.lease_expires_ms = nil
    local record = cmsgpack.pack(job)
    batch:add('HSET', K.jobs, id, record)
    batch:add('ZADD', kept_in(K, job), now, id)
    FINISHED[#FINISHED + 1] = #result <= HAND_RESULT_BYTES and {id, record, result} or id
  end
end
batch:flush()
announce()
return outcomes
