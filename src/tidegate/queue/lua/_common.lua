-- Shared by every tidegate queue script: loaded between the settings and the script's own keys.
--
-- The queue's keys, each carrying the queue's {hash tag} so that a script runs within one Redis
-- Cluster slot. A script receives only the keys it touches, named on its `-- KEYS:` line, which
-- is read when the queue opens to build the KEYS it sends and the table `K` the script reads
-- them from (K.jobs, K.ready[level], ...; a key the script did not name is an error, not nil).
-- Helpers take `K` as their first argument and say which of its keys they touch.
--   jobs        hash    id -> job record (MessagePack map; payload and result live beside it)
--   payloads    hash    id -> payload (JSON, never decoded here)
--   results     hash    id -> result (JSON, never decoded here)
--   idem        hash    idempotency key -> id
--   seq         string  FIFO sequence counter, assigned here, never a float timestamp
--   deadlines   zset    id by deadline (jobs waiting, not leased and not final)
--   aging       zset    id by next promotion time (queued jobs above level 0, aging on)
--   turns       hash    "level:tenant" -> tenant's last turn, "level" -> level's current turn
--   finished    zset    id by finish time (succeeded, cancelled, expired)
--   answered    zset    id by finish time, for those of them kept only the answered ttl: their
--                       record says `brief` (a caller waited and was answered; queue format 2)
--   dead        zset    id by finish time
--   ready:0..4   zset  member "<turn:12 hex><seq:16 hex><id>", every score 0, so ZPOPMIN serves
--                      by turn, then FIFO by sequence
--   leased:0..4  zset  id by lease expiry, under the job's own priority
--   signal:0..4  list  wake-up tokens for claimers blocked in BLPOP
--   waiting:0..4 zset  id by the time it became claimable, for the oldest wait per level
--   delayed:0..4 zset  id by due time (states delayed and failed), under its own priority, so a
--                      claim promotes due work level by level in priority order
--   due         string  a time (ms) no later than any score in leased:0..4, delayed:0..4 and
--                      deadlines: before it, nothing needs recovering, promoting or expiring, so
--                      a claim skips those scans (see due_at and settle_due); missing = scan now
-- The queue's settings come before this file as constants (ROUND_ROBIN, AGING_MS, DONE_CHANNEL,
-- DONE_PUBLISH, MAX_DEPTH), fixed when the queue opens, so no script call carries them in ARGV.
-- DONE_PUBLISH is SPUBLISH on a Redis Cluster: the channel carries the queue's hash tag, so the
-- message stays within the shard that serves the queue instead of reaching every node.

local MAX_ERRORS = 20
local MAX_TOKENS = 64

-- The table a script reads its keys from: reading a key it did not name raises, so a missing
-- name on a script's KEYS line fails loudly instead of writing to a nil key.
local function strict(keys, what)
  return setmetatable(keys, {__index = function(_, name)
    error('tidegate queue script: ' .. what .. ' ' .. tostring(name) .. ' is not among its KEYS')
  end})
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- The earliest lease expiry, due time or deadline this script call indexed (nil: none). Every
-- ZADD to leased:0..4, delayed:0..4 or deadlines passes its score here, and the script ends with
-- settle_due(K), which lowers the stored `due` to it: so `due` never passes a score in those
-- indexes, and a claim before it may skip the scans that look for one.
local DUE = nil
local function due_at(ms)
  if DUE == nil or ms < DUE then DUE = ms end
end

-- Keys: due.
local function settle_due(K)
  if DUE == nil then return end
  local stored = redis.call('GET', K.due)
  -- Missing already means "scan now": it stays missing.
  if stored and tonumber(stored) > DUE then redis.call('SET', K.due, string.format('%d', DUE)) end
end

-- After a full scan: the stored `due` becomes the earliest score left in the indexes (far in the
-- future when they are empty), or what this call indexed if earlier.
-- Keys: due, leased and delayed of every priority, deadlines.
local DUE_NEVER = 2 ^ 52
local function reset_due(K)
  local due = DUE_NEVER
  for priority = 0, 4 do
    for _, index in ipairs({K.delayed[priority], K.leased[priority]}) do
      local head = redis.call('ZRANGE', index, 0, 0, 'WITHSCORES')
      if head[2] and tonumber(head[2]) < due then due = tonumber(head[2]) end
    end
  end
  local head = redis.call('ZRANGE', K.deadlines, 0, 0, 'WITHSCORES')
  if head[2] and tonumber(head[2]) < due then due = tonumber(head[2]) end
  if DUE ~= nil and DUE < due then due = DUE end
  redis.call('SET', K.due, string.format('%d', due))
end

-- Writes grouped by command and key and sent in large chunks: the hot scripts (enqueue, claim,
-- complete) touch hundreds of jobs per call, and a Redis call per job costs more than the work.
-- Groups are sent in the order they were first used, so a batch must never both add and remove
-- the same member; flush() before reading anything written through it.
local Batch = {}
Batch.__index = Batch

function Batch.new() return setmetatable({groups = {}, order = {}}, Batch) end

function Batch:add(command, key, a, b)
  local name = command .. ' ' .. key
  local group = self.groups[name]
  if not group then
    group = {command, key, {}}
    self.groups[name] = group
    self.order[#self.order + 1] = name
  end
  local args = group[3]
  args[#args + 1] = a
  if b ~= nil then args[#args + 1] = b end
end

function Batch:flush()
  local chunk = 2000  -- even, so field/value and score/member pairs are never split
  for _, name in ipairs(self.order) do
    local command, key, args = self.groups[name][1], self.groups[name][2], self.groups[name][3]
    for i = 1, #args, chunk do
      redis.call(command, key, unpack(args, i, math.min(i + chunk - 1, #args)))
    end
  end
  self.groups, self.order = {}, {}
end

-- Records are MessagePack rather than JSON: cmsgpack is about twice as fast as cjson here, and
-- every state change reads and writes one record. Keys: jobs.
local function load(K, id)
  local raw = redis.call('HGET', K.jobs, id)
  if not raw then return nil end
  return cmsgpack.unpack(raw)
end

-- Keys: jobs.
local function save(K, job)
  local record = cmsgpack.pack(job)
  redis.call('HSET', K.jobs, job.id, record)
  return record
end

-- The tenant's next turn at its level: one past its last, never behind the level's current turn.
-- Keys: turns (round-robin on).
local function give_turn(K, job)
  if not ROUND_ROBIN then return 0 end
  local current = tonumber(redis.call('HGET', K.turns, tostring(job.level)) or '0')
  local field = job.level .. ':' .. job.tenant
  local last = redis.call('HGET', K.turns, field)
  local turn = current
  if last then turn = math.max(current, tonumber(last) + 1) end
  redis.call('HSET', K.turns, field, turn)
  return turn
end

-- Called when a job leaves the line at `level` by claim: if it held its tenant's newest turn,
-- the tenant has nothing left waiting there and its entry is dropped, so the hash holds only
-- tenants with waiting work. Keys: turns (round-robin on).
local function forget_turn(K, level, tenant, turn)
  if not ROUND_ROBIN then return end
  local field = level .. ':' .. tenant
  if tonumber(redis.call('HGET', K.turns, field)) == turn then redis.call('HDEL', K.turns, field) end
end

local function member_of(job, turn)
  return string.format('%012x%016x', turn, job.seq) .. job.id
end

local function id_of(member) return string.sub(member, 29) end
local function turn_of(member) return tonumber(string.sub(member, 1, 12), 16) end

-- Wake blocked claimers: a few tokens per level that gained work (bounded; extra tokens only
-- cost an empty claim). Keys: signal of each level in `wake`.
local function ring(K, wake)
  for level, count in pairs(wake) do
    local tokens = {}
    for i = 1, math.min(count, MAX_TOKENS) do tokens[i] = '1' end
    redis.call('LPUSH', K.signal[level], unpack(tokens))
    redis.call('LTRIM', K.signal[level], 0, MAX_TOKENS - 1)
  end
end

-- Writes straight away; what make_ready and park use when no batch is given.
local DIRECT = {add = function(_, command, key, a, b) redis.call(command, key, a, b) end}

-- Make a job claimable at its current level (callers reset job.level to the priority first).
-- Its index writes go through `batch` when one is given.
-- Keys: ready and waiting of the level, aging (aging on), deadlines, turns (round-robin on).
local function make_ready(K, job, now, wake, batch)
  batch = batch or DIRECT
  job.state = 'queued'
  job.ready_ms = now
  job.not_before_ms = nil
  job.worker_id = nil
  job.lease_expires_ms = nil
  job.member = member_of(job, give_turn(K, job))
  batch:add('ZADD', K.ready[job.level], 0, job.member)
  batch:add('ZADD', K.waiting[job.level], now, job.id)
  if AGING_MS > 0 and job.level > 0 then batch:add('ZADD', K.aging, now + AGING_MS, job.id) end
  if job.deadline_ms then
    batch:add('ZADD', K.deadlines, job.deadline_ms, job.id)
    due_at(job.deadline_ms)
  end
  wake[job.level] = (wake[job.level] or 0) + 1
end

-- Park a job until `due` (a new delayed job, or a failed one awaiting its retry).
-- Keys: delayed of its priority, deadlines.
local function park(K, job, state, due, batch)
  batch = batch or DIRECT
  job.state = state
  job.not_before_ms = due
  job.worker_id = nil
  job.lease_expires_ms = nil
  job.member = nil
  batch:add('ZADD', K.delayed[job.priority], due, job.id)
  due_at(due)
  if job.deadline_ms then
    batch:add('ZADD', K.deadlines, job.deadline_ms, job.id)
    due_at(job.deadline_ms)
  end
end

-- Take a job out of the indexes its state puts it in. Keys: a queued job's ready and waiting of
-- its level and aging (aging on); a delayed or failed job's delayed, a leased job's leased, of
-- its priority; deadlines.
local function detach(K, job)
  local state = job.state
  if state == 'queued' then
    if job.member then redis.call('ZREM', K.ready[job.level], job.member) end
    redis.call('ZREM', K.waiting[job.level], job.id)
    if AGING_MS > 0 then redis.call('ZREM', K.aging, job.id) end
  elseif state == 'delayed' or state == 'failed' then
    redis.call('ZREM', K.delayed[job.priority], job.id)
  elseif state == 'leased' then
    redis.call('ZREM', K.leased[job.priority], job.id)
  end
  if job.deadline_ms then redis.call('ZREM', K.deadlines, job.id) end
  job.member = nil
end

-- Ids finished by this script call, announced together by announce().
local FINISHED = {}

-- The retention index of a job that finishes other than dead: answered for a brief job (its caller
-- has the answer), else finished. Keys: answered (brief jobs) or finished.
local function kept_in(K, job)
  if job.brief then return K.answered end
  return K.finished
end

-- Move a job to a final state and index it for retention.
-- Keys: detach's, jobs, and dead (state dead) or kept_in's (any other).
local function finish(K, job, state, now)
  detach(K, job)
  job.state = state
  job.finished_ms = now
  job.worker_id = nil
  job.lease_expires_ms = nil
  save(K, job)
  redis.call('ZADD', state == 'dead' and K.dead or kept_in(K, job), now, job.id)
  FINISHED[#FINISHED + 1] = job.id
end

-- One message per script call: a MessagePack array with an entry per finished job, its id (its
-- waiters in wait() read it), or {id, record, result} when the script has both in hand and the
-- result is small enough to send to every listener (its waiters need no read).
local HAND_RESULT_BYTES = 16384
local function announce()
  if #FINISHED > 0 then redis.call(DONE_PUBLISH, DONE_CHANNEL, cmsgpack.pack(FINISHED)) end
end

-- Delete a finished job for good: its record, payload, result, idempotency key and its entry in
-- `index` (the finished, answered or dead set it was kept in). Keys: jobs, payloads, results, idem.
local function erase(K, id, index)
  local job = load(K, id)
  if job and job.idempotency_key then redis.call('HDEL', K.idem, job.idempotency_key) end
  redis.call('ZREM', index, id)
  redis.call('HDEL', K.jobs, id)
  redis.call('HDEL', K.payloads, id)
  redis.call('HDEL', K.results, id)
end

local function add_error(job, err)
  if type(job.errors) ~= 'table' then job.errors = {} end
  table.insert(job.errors, err)
  while #job.errors > MAX_ERRORS do table.remove(job.errors, 1) end
  job.last_error = err
end

-- The job under a current lease, or nil and the reason the caller's lease is stale. Keys: jobs.
local function leased_job(K, id, token)
  local job = load(K, id)
  if not job then return nil, 'LEASE_LOST job ' .. id .. ' no longer exists' end
  if job.state ~= 'leased' or tonumber(job.lease_token) ~= tonumber(token) then
    return nil, 'LEASE_LOST lease ' .. token .. ' on job ' .. id .. ' is stale: the job is '
      .. job.state .. ' with lease ' .. tostring(job.lease_token)
  end
  return job
end

-- A job back in line, claimable at its own priority (whatever aging raised it to before).
-- Keys: make_ready's, jobs.
local function requeue(K, job, now, wake)
  job.level = job.priority
  make_ready(K, job, now, wake)
  save(K, job)
end

-- Delayed and failed jobs of one priority whose time has come become claimable.
-- Keys: delayed of that priority, requeue's.
local function promote_due(K, level, now, batch, wake)
  local key = K.delayed[level]
  local ids = redis.call('ZRANGEBYSCORE', key, '-inf', now, 'LIMIT', 0, batch)
  for _, id in ipairs(ids) do
    redis.call('ZREM', key, id)
    local job = load(K, id)
    if job and (job.state == 'delayed' or job.state == 'failed') then
      requeue(K, job, now, wake)
    end
  end
  return #ids
end

-- Waiting jobs past their deadline are never handed out: they expire.
-- Keys: deadlines, jobs, finished, and detach's for queued, delayed and failed jobs.
local function expire_overdue(K, now, batch)
  local ids = redis.call('ZRANGEBYSCORE', K.deadlines, '-inf', now, 'LIMIT', 0, batch)
  local expired = 0
  for _, id in ipairs(ids) do
    local job = load(K, id)
    if job and (job.state == 'queued' or job.state == 'delayed' or job.state == 'failed') then
      job.last_error = 'deadline passed'
      finish(K, job, 'expired', now)
      expired = expired + 1
    else
      redis.call('ZREM', K.deadlines, id)
    end
  end
  return expired
end

-- Expired leases (their worker stopped renewing them: killed, stuck, cut off) go back to their
-- line at the job's own priority, or end dead when no attempt is left. Up to `batch` per
-- priority. The lease token is left as it is: the next claim raises it, so the old holder's
-- complete or fail is refused (fencing). Run by maintain and at the start of every claim, so
-- recovery needs no long-lived process. Returns recovered, dead.
-- Keys: leased of every priority, jobs, deadlines, dead, requeue's.
local function recover_expired(K, now, batch, wake)
  local recovered, dead = 0, 0
  for priority = 0, 4 do
    local ids = redis.call('ZRANGEBYSCORE', K.leased[priority], '-inf', now, 'LIMIT', 0, batch)
    for _, id in ipairs(ids) do
      redis.call('ZREM', K.leased[priority], id)
      local job = load(K, id)
      if job and job.state == 'leased' then
        detach(K, job)
        add_error(job, 'lease expired: worker ' .. tostring(job.worker_id) .. ' stopped renewing it')
        if job.attempts >= job.max_attempts then
          finish(K, job, 'dead', now)
          dead = dead + 1
        else
          requeue(K, job, now, wake)
          recovered = recovered + 1
        end
      end
    end
  end
  return recovered, dead
end

-- When claimable work may next appear without a push: the earliest delayed job coming due or
-- lease expiring (a claim recovers it), in ms; -1 when neither is waiting.
-- Keys: delayed and leased of every priority.
local function next_due(K)
  local due = -1
  for priority = 0, 4 do
    for _, index in ipairs({K.delayed[priority], K.leased[priority]}) do
      local head = redis.call('ZRANGE', index, 0, 0, 'WITHSCORES')
      if head[2] and (due < 0 or tonumber(head[2]) < due) then due = tonumber(head[2]) end
    end
  end
  return due
end
