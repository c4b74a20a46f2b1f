-- Shared by every tidegate queue script: prepended to each script when it is loaded.
--
-- KEYS, the same list for every script; each key carries the queue's {hash tag}, so every script
-- runs within one Redis Cluster slot:
--   1 jobs        hash    id -> job record (MessagePack map; payload and result live beside it)
--   2 payloads    hash    id -> payload (JSON, never decoded here)
--   3 results     hash    id -> result (JSON, never decoded here)
--   4 idem        hash    idempotency key -> id
--   5 seq         string  FIFO sequence counter, assigned here, never a float timestamp
--   6 deadlines   zset    id by deadline (jobs waiting, not leased and not final)
--   7 aging       zset    id by next promotion time (queued jobs above level 0, aging on)
--   8 turns       hash    "level:tenant" -> tenant's last turn, "level" -> level's current turn
--   9 finished    zset    id by finish time (succeeded, cancelled, expired)
--  10 dead        zset    id by finish time
--  11..15 ready:0..4   zset  member "<turn:12 hex><seq:16 hex><id>", every score 0, so
--                            ZPOPMIN serves by turn, then FIFO by sequence
--  16..20 leased:0..4  zset  id by lease expiry, under the job's own priority
--  21..25 signal:0..4  list  wake-up tokens for claimers blocked in BLPOP
--  26..30 waiting:0..4 zset  id by the time it became claimable, for the oldest wait per level
--  31..35 delayed:0..4 zset  id by due time (states delayed and failed), under its own priority,
--                            so a claim promotes due work level by level in priority order
-- ARGV, common part: [1] tenant round-robin "1"/"0", [2] aging interval ms (0 = off),
-- [3] pub/sub channel announcing finished job ids. Each script's own arguments start at ARGV[4].

local ROUND_ROBIN = ARGV[1] == '1'
local AGING_MS = tonumber(ARGV[2])
local DONE_CHANNEL = ARGV[3]
local MAX_ERRORS = 20
local MAX_TOKENS = 64
local K_JOBS, K_PAYLOADS, K_RESULTS, K_IDEM, K_SEQ = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local K_DEADLINES, K_AGING, K_TURNS, K_FINISHED, K_DEAD = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]

local function ready_key(level) return KEYS[11 + level] end
local function leased_key(priority) return KEYS[16 + priority] end
local function signal_key(level) return KEYS[21 + level] end
local function waiting_key(level) return KEYS[26 + level] end
local function delayed_key(priority) return KEYS[31 + priority] end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
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
-- every state change reads and writes one record.
local function load(id)
  local raw = redis.call('HGET', K_JOBS, id)
  if not raw then return nil end
  return cmsgpack.unpack(raw)
end

local function save(job)
  local record = cmsgpack.pack(job)
  redis.call('HSET', K_JOBS, job.id, record)
  return record
end

-- The tenant's next turn at its level: one past its last, never behind the level's current turn.
local function give_turn(job)
  if not ROUND_ROBIN then return 0 end
  local current = tonumber(redis.call('HGET', K_TURNS, tostring(job.level)) or '0')
  local field = job.level .. ':' .. job.tenant
  local last = redis.call('HGET', K_TURNS, field)
  local turn = current
  if last then turn = math.max(current, tonumber(last) + 1) end
  redis.call('HSET', K_TURNS, field, turn)
  return turn
end

-- Called when a job leaves the line at `level` by claim: if it held its tenant's newest turn,
-- the tenant has nothing left waiting there and its entry is dropped, so the hash holds only
-- tenants with waiting work.
local function forget_turn(level, tenant, turn)
  if not ROUND_ROBIN then return end
  local field = level .. ':' .. tenant
  if tonumber(redis.call('HGET', K_TURNS, field)) == turn then redis.call('HDEL', K_TURNS, field) end
end

local function member_of(job, turn)
  return string.format('%012x%016x', turn, job.seq) .. job.id
end

local function id_of(member) return string.sub(member, 29) end
local function turn_of(member) return tonumber(string.sub(member, 1, 12), 16) end

-- Wake blocked claimers: a few tokens per level that gained work (bounded; extra tokens only
-- cost an empty claim).
local function ring(wake)
  for level, count in pairs(wake) do
    local tokens = {}
    for i = 1, math.min(count, MAX_TOKENS) do tokens[i] = '1' end
    redis.call('LPUSH', signal_key(level), unpack(tokens))
    redis.call('LTRIM', signal_key(level), 0, MAX_TOKENS - 1)
  end
end

-- Writes straight away; what make_ready and park use when no batch is given.
local DIRECT = {add = function(_, command, key, a, b) redis.call(command, key, a, b) end}

-- Make a job claimable at its current level (callers reset job.level to the priority first).
-- Its index writes go through `batch` when one is given.
local function make_ready(job, now, wake, batch)
  batch = batch or DIRECT
  job.state = 'queued'
  job.ready_ms = now
  job.not_before_ms = nil
  job.worker_id = nil
  job.lease_expires_ms = nil
  job.member = member_of(job, give_turn(job))
  batch:add('ZADD', ready_key(job.level), 0, job.member)
  batch:add('ZADD', waiting_key(job.level), now, job.id)
  if AGING_MS > 0 and job.level > 0 then batch:add('ZADD', K_AGING, now + AGING_MS, job.id) end
  if job.deadline_ms then batch:add('ZADD', K_DEADLINES, job.deadline_ms, job.id) end
  wake[job.level] = (wake[job.level] or 0) + 1
end

-- Park a job until `due` (a new delayed job, or a failed one awaiting its retry).
local function park(job, state, due, batch)
  batch = batch or DIRECT
  job.state = state
  job.not_before_ms = due
  job.worker_id = nil
  job.lease_expires_ms = nil
  job.member = nil
  batch:add('ZADD', delayed_key(job.priority), due, job.id)
  if job.deadline_ms then batch:add('ZADD', K_DEADLINES, job.deadline_ms, job.id) end
end

-- Take a job out of the indexes its state puts it in.
local function detach(job)
  local state = job.state
  if state == 'queued' then
    if job.member then redis.call('ZREM', ready_key(job.level), job.member) end
    redis.call('ZREM', waiting_key(job.level), job.id)
    if AGING_MS > 0 then redis.call('ZREM', K_AGING, job.id) end
  elseif state == 'delayed' or state == 'failed' then
    redis.call('ZREM', delayed_key(job.priority), job.id)
  elseif state == 'leased' then
    redis.call('ZREM', leased_key(job.priority), job.id)
  end
  if job.deadline_ms then redis.call('ZREM', K_DEADLINES, job.id) end
  job.member = nil
end

-- Ids finished by this script call, announced together by announce().
local FINISHED = {}

-- Move a job to a final state and index it for retention.
local function finish(job, state, now)
  detach(job)
  job.state = state
  job.finished_ms = now
  job.worker_id = nil
  job.lease_expires_ms = nil
  save(job)
  redis.call('ZADD', state == 'dead' and K_DEAD or K_FINISHED, now, job.id)
  FINISHED[#FINISHED + 1] = job.id
end

-- One message per script call, the finished ids comma-separated: waiters in wait() re-read them.
local function announce()
  if #FINISHED > 0 then redis.call('PUBLISH', DONE_CHANNEL, table.concat(FINISHED, ',')) end
end

-- Delete a finished job for good: its record, payload, result, idempotency key and its entry in
-- `index` (the finished or dead set it was kept in).
local function erase(id, index)
  local job = load(id)
  if job and job.idempotency_key then redis.call('HDEL', K_IDEM, job.idempotency_key) end
  redis.call('ZREM', index, id)
  redis.call('HDEL', K_JOBS, id)
  redis.call('HDEL', K_PAYLOADS, id)
  redis.call('HDEL', K_RESULTS, id)
end

local function add_error(job, err)
  if type(job.errors) ~= 'table' then job.errors = {} end
  table.insert(job.errors, err)
  while #job.errors > MAX_ERRORS do table.remove(job.errors, 1) end
  job.last_error = err
end

-- The job under a current lease, or nil and the reason the caller's lease is stale.
local function leased_job(id, token)
  local job = load(id)
  if not job then return nil, 'LEASE_LOST job ' .. id .. ' no longer exists' end
  if job.state ~= 'leased' or tonumber(job.lease_token) ~= tonumber(token) then
    return nil, 'LEASE_LOST lease ' .. token .. ' on job ' .. id .. ' is stale: the job is '
      .. job.state .. ' with lease ' .. tostring(job.lease_token)
  end
  return job
end

-- A job back in line, claimable at its own priority (whatever aging raised it to before).
local function requeue(job, now, wake)
  job.level = job.priority
  make_ready(job, now, wake)
  save(job)
end

-- Delayed and failed jobs of one priority whose time has come become claimable.
local function promote_due(level, now, batch, wake)
  local key = delayed_key(level)
  local ids = redis.call('ZRANGEBYSCORE', key, '-inf', now, 'LIMIT', 0, batch)
  for _, id in ipairs(ids) do
    redis.call('ZREM', key, id)
    local job = load(id)
    if job and (job.state == 'delayed' or job.state == 'failed') then
      requeue(job, now, wake)
    end
  end
  return #ids
end

-- Waiting jobs past their deadline are never handed out: they expire.
local function expire_overdue(now, batch)
  local ids = redis.call('ZRANGEBYSCORE', K_DEADLINES, '-inf', now, 'LIMIT', 0, batch)
  local expired = 0
  for _, id in ipairs(ids) do
    local job = load(id)
    if job and (job.state == 'queued' or job.state == 'delayed' or job.state == 'failed') then
      job.last_error = 'deadline passed'
      finish(job, 'expired', now)
      expired = expired + 1
    else
      redis.call('ZREM', K_DEADLINES, id)
    end
  end
  return expired
end

-- Expired leases (their worker stopped renewing them: killed, stuck, cut off) go back to their
-- line at the job's own priority, or end dead when no attempt is left. Up to `batch` per
-- priority. The lease token is left as it is: the next claim raises it, so the old holder's
-- complete or fail is refused (fencing). Run by maintain and at the start of every claim, so
-- recovery needs no long-lived process. Returns recovered, dead.
local function recover_expired(now, batch, wake)
  local recovered, dead = 0, 0
  for priority = 0, 4 do
    local ids = redis.call('ZRANGEBYSCORE', leased_key(priority), '-inf', now, 'LIMIT', 0, batch)
    for _, id in ipairs(ids) do
      redis.call('ZREM', leased_key(priority), id)
      local job = load(id)
      if job and job.state == 'leased' then
        detach(job)
        add_error(job, 'lease expired: worker ' .. tostring(job.worker_id) .. ' stopped renewing it')
        if job.attempts >= job.max_attempts then
          finish(job, 'dead', now)
          dead = dead + 1
        else
          requeue(job, now, wake)
          recovered = recovered + 1
        end
      end
    end
  end
  return recovered, dead
end
