-- Admit one request under both limits of a key (requests and tokens per period), or nothing.
--
-- Each limit is a GCRA (generic cell rate algorithm): `tat`, the theoretical arrival time, is
-- when the limit's bucket will be full again. A request costing `units` of a limit with
-- `interval` = period / limit per unit and a burst of `capacity` units may pass once
-- tat + (units - capacity) * interval <= now, and then moves tat to max(tat, now) + units * interval.
-- So requests are spread at the limit's rate, with at most `capacity` units at once; a request
-- larger than the burst passes only into a full bucket and is then paid back before the next.
--
-- KEYS[1] the key's state hash, tidegate:{name}:rate:<provider/model>. Fields, integers in
--         microseconds of this server's clock (TIME, so worker clocks never matter):
--         rt requests tat, tt tokens tat, pu paused until; and the limits last used, read
--         back by state.lua: rpm, tpm, per (period us), rc, tc (burst capacities).
-- ARGV[1] tokens the request costs, [2] requests per period ('' = no limit), [3] tokens per
--         period ('' = no limit), [4] period us, [5] request burst capacity, [6] token burst
--         capacity, [7] ms to keep the state after it has nothing left to remember
-- Returns 0 when admitted (both limits charged), else the us to wait (nothing charged).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cost, rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local period, req_cap, tok_cap = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local state = redis.call('HMGET', KEYS[1], 'rt', 'tt', 'pu')
local paused = tonumber(state[3]) or 0

-- The tat after admitting `units`, and how long until that is allowed (<= 0: now).
local function gcra(tat, units, limit, capacity)
  local interval = period / limit
  local start = math.max(tat or 0, now)
  local allow_at = start
  if units <= capacity then allow_at = start + (units - capacity) * interval end
  return start + units * interval, allow_at - now
end

local wait = paused - now
-- A limit this call does not use keeps its tat (a caller may pass it again later).
local new_rt, new_tt, w = tonumber(state[1]) or 0, tonumber(state[2]) or 0, 0
if rpm then
  new_rt, w = gcra(tonumber(state[1]), 1, rpm, req_cap)
  wait = math.max(wait, w)
end
if tpm then
  new_tt, w = gcra(tonumber(state[2]), cost, tpm, tok_cap)
  wait = math.max(wait, w)
end
if wait > 0 then return math.ceil(wait) end

-- Whole microseconds, rounded up (later is the safe side); '%.0f' because tostring() of a
-- double keeps only 14 digits and epoch microseconds have 16.
local function int(x) return string.format('%.0f', math.ceil(x)) end
redis.call('HSET', KEYS[1], 'rpm', ARGV[2], 'tpm', ARGV[3], 'per', ARGV[4], 'rc', ARGV[5], 'tc', ARGV[6])
if rpm then redis.call('HSET', KEYS[1], 'rt', int(new_rt)) end
if tpm then redis.call('HSET', KEYS[1], 'tt', int(new_tt)) end
-- Once every tat and the pause are past, the state equals no state: let it expire then.
local horizon = math.max(new_rt, new_tt, paused, now)
redis.call('PEXPIRE', KEYS[1], math.ceil((horizon - now) / 1000) + tonumber(ARGV[7]))
return 0
