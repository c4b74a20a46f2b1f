-- Apply one user's interactions in order: decayed profile, co-occurrence pairs, recent items,
-- purchased items and their buy-again counts. The plain-Python statement of the same rules is UserRecord in
-- store/memory.py; see also tidegate.recs.store.
-- KEYS[1] state   string, packed: the profile's time (float64) and length (uint32), its components
--                 (float32 each), then the recent items, msgpack [id, time, weight, ...], newest
--                 first (one string rather than a hash of two: a key's overhead is a large part of
--                 a user's few hundred bytes). A hash of the earlier layout ("p": msgpack [time,
--                 component, ...], "r": the recent items) is read and replaced.
-- KEYS[2] bought  zset  item id -> time of its last purchase
-- KEYS[3] again   zset  item id -> log2 of its forward-decayed purchase count
-- ARGV[1] profile half-life s, ARGV[2] session window s, ARGV[3] recent items kept, ARGV[4]
-- purchases kept, ARGV[5] co-occurrence half-life s, ARGV[6] buy-again half-life s, ARGV[7]
-- buy-again counts kept, ARGV[8] the interactions packed in one msgpack array, five entries each:
-- item id, time s (float64), kind weight (float64), true for a purchase, the item's unit vector
-- as little-endian float32 bytes ("" when the item is not in the catalogue).
-- Returns {1 when the user was new else 0, then per co-occurrence pair: item id, other item id,
-- log2 weight (a string: Lua numbers reach Redis as integers)}.
local half_life, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local recent_cap, bought_cap = tonumber(ARGV[3]), tonumber(ARGV[4])
local pair_half_life, again_half_life, again_cap = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local LN2 = math.log(2)
local MAX_EXPONENT = 1000

local function decay(elapsed)
  return 2 ^ math.min(MAX_EXPONENT, -elapsed / half_life)
end

local function floats(blob, count, from)
  -- struct.unpack returns its values and then the next position; 64 at a time keeps the
  -- returned values well inside Lua's stack
  local values, position = {}, from
  while #values < count do
    local take = math.min(64, count - #values)
    local got = {struct.unpack('<' .. string.rep('f', take), blob, position)}
    position = got[take + 1]
    for k = 1, take do values[#values + 1] = got[k] end
  end
  return values, position
end

local profile, flat = {}, nil  -- profile: {time, component 1, ...}
local packed = redis.pcall('GET', KEYS[1])
if type(packed) == 'table' and packed.err then  -- the earlier layout: a hash
  local held = redis.call('HMGET', KEYS[1], 'p', 'r')
  profile = held[1] and cmsgpack.unpack(held[1]) or {}
  flat = held[2] and cmsgpack.unpack(held[2])
  redis.call('DEL', KEYS[1])
elseif packed then
  local at, size, position = struct.unpack('<dI4', packed)
  if size > 0 then
    local components
    components, position = floats(packed, size, position)
    profile[1] = at
    for k = 1, size do profile[k + 1] = components[k] end
  end
  flat = cmsgpack.unpack(string.sub(packed, position))
end
local recent = {}
if flat then
  for i = 1, #flat, 3 do recent[#recent + 1] = {flat[i], tonumber(flat[i + 1]), tonumber(flat[i + 2])} end
end
local out = {flat and 0 or 1}

local function add_to_profile(at, weight, vector)
  if vector == '' then return end
  local v = floats(vector, #vector / 4, 1)
  if #profile == 0 then
    profile[1] = at
    for k = 1, #v do profile[k + 1] = weight * v[k] end
  elseif at >= profile[1] then
    local factor = decay(at - profile[1])
    for k = 1, #v do profile[k + 1] = profile[k + 1] * factor + weight * v[k] end
    profile[1] = at
  else
    local scaled = weight * decay(profile[1] - at)
    for k = 1, #v do profile[k + 1] = profile[k + 1] + scaled * v[k] end
  end
end

-- The list stays newest first; among equal times the entry updated last comes first.
local function touch(item, at, weight)
  for index, entry in ipairs(recent) do
    if entry[1] == item then
      if at < entry[2] then return end
      if at == entry[2] then weight = math.max(weight, entry[3]) end
      table.remove(recent, index)
      break
    end
  end
  local position = 1
  while position <= #recent and recent[position][2] > at do position = position + 1 end
  table.insert(recent, position, {item, at, weight})
  while #recent > recent_cap do table.remove(recent) end
end

local events = cmsgpack.unpack(ARGV[8])
for i = 1, #events, 5 do
  local item, at, weight = events[i], events[i + 1], events[i + 2]
  add_to_profile(at, weight, events[i + 4])
  for _, entry in ipairs(recent) do
    if entry[1] ~= item and math.abs(at - entry[2]) <= window then
      local pair_weight = math.min(weight, entry[3])
      if pair_weight > 0 then
        out[#out + 1] = item
        out[#out + 1] = entry[1]
        out[#out + 1] = string.format('%.17g', math.log(pair_weight) / LN2 + math.max(at, entry[2]) / pair_half_life)
      end
    end
  end
  touch(item, at, weight)
  if events[i + 3] then
    local last = redis.call('ZSCORE', KEYS[2], item)
    if not last or tonumber(last) < at then
      redis.call('ZADD', KEYS[2], string.format('%.17g', at), item)
    end
    -- log2(2^a + 2^b), as score.log_add: one purchase of weight 1, forward-decayed
    local value = at / again_half_life
    local count = redis.call('ZSCORE', KEYS[3], item)
    if count then
      local a, b = tonumber(count), value
      if a < b then a, b = b, a end
      value = a + math.log(1 + 2 ^ (b - a)) / LN2
    end
    redis.call('ZADD', KEYS[3], string.format('%.17g', value), item)
  end
end

local bought = redis.call('ZCARD', KEYS[2])
if bought > bought_cap then redis.call('ZREMRANGEBYRANK', KEYS[2], 0, bought - bought_cap - 1) end
local again = redis.call('ZCARD', KEYS[3])
if again > again_cap then redis.call('ZREMRANGEBYRANK', KEYS[3], 0, again - again_cap - 1) end
-- The profile is kept in float32 (struct rounds each component to nearest), as the memory store does.
local parts = {struct.pack('<dI4', profile[1] or 0, math.max(#profile - 1, 0))}
for k = 2, #profile, 64 do
  parts[#parts + 1] = struct.pack('<' .. string.rep('f', math.min(64, #profile - k + 1)),
    unpack(profile, k, math.min(k + 63, #profile)))
end
flat = {}
for _, entry in ipairs(recent) do
  flat[#flat + 1] = entry[1]
  flat[#flat + 1] = entry[2]
  flat[#flat + 1] = entry[3]
end
parts[#parts + 1] = cmsgpack.pack(flat)
redis.call('SET', KEYS[1], table.concat(parts))
return out
