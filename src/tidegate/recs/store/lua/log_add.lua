-- Add forward-decayed weights to sorted sets of log2 weights (log2(2^a + 2^b) per member), then
-- drop each set's weakest members past the bound (equal scores: the smallest member first).
-- KEYS: the sorted sets (one item's neighbours, or the trending lists, which share a hash tag).
-- ARGV[1] the bound; ARGV[2] the additions packed in one msgpack array, three entries each:
-- index into KEYS (1-based), member, log2 weight (a float64), each key's additions together and
-- each member at most once per key (the callers sum a batch's additions per key and member).
-- One packed argument rather than three per addition: the client's command encoding was most of
-- the caller's time. ARGV[3] "all": trim every key, not only those this call added members to
-- (the last of several calls over the same keys, the earlier ones unbounded).
-- Returns nothing.
--
-- Per key one ZMSCORE, one variadic ZADD and, only when a member is new (a list grows only
-- then), one ZREMRANGEBYRANK from the weakest to the bound's rank: a call into Redis costs about
-- as much as the work it does on a list of 50. Numbers go to redis.call as they are: Redis
-- converts a Lua number argument with 17 significant digits ("%.17g"), which reads back as the
-- same double.
local bound = tonumber(ARGV[1])
local adds = cmsgpack.unpack(ARGV[2])
local trim_all = ARGV[3] == 'all'
local LN2 = math.log(2)
local log = math.log
local MEMBERS_PER_CALL = 1000  -- unpack() passes a bounded number of values (Lua's C stack)
local trimmed = {}

-- The additions adds[first], adds[first + 3], ... adds[last] (all to one key) in one ZMSCORE
-- and one ZADD; whether a member was new.
local function add(key, first, last)
  local members = {}
  for i = first, last, 3 do members[#members + 1] = adds[i + 1] end
  local held = redis.call('ZMSCORE', key, unpack(members))
  local args, grew = {}, false
  for n = 1, #members do
    local value, old = adds[first + 3 * n - 1], held[n]
    if old then
      local a, b = tonumber(old), value
      if a < b then a, b = b, a end
      value = a + log(1 + 2 ^ (b - a)) / LN2
    else
      grew = true
    end
    args[2 * n - 1], args[2 * n] = value, members[n]
  end
  redis.call('ZADD', key, unpack(args))
  return grew
end

local function trim(index)
  redis.call('ZREMRANGEBYRANK', KEYS[index], 0, -bound - 1)
  trimmed[index] = true
end

local first, step = 1, 3 * MEMBERS_PER_CALL
for i = 1, #adds, 3 do
  if adds[i + 3] ~= adds[i] then  -- the last addition to this key
    local grew = false
    for from = first, i, step do
      grew = add(KEYS[adds[i]], from, math.min(from + step - 3, i)) or grew
    end
    if grew or trim_all then trim(adds[i]) end
    first = i + 3
  end
end
if trim_all then
  for index = 1, #KEYS do
    if not trimmed[index] then trim(index) end
  end
end
