-- Apply users' interactions, each user's in order: decayed profile, co-occurrence pairs, recent
-- items, purchased items and their buy-again counts. Several users go in one call on one server
-- (their keys then live in several slots: a Redis Cluster gets one user a call), because the
-- client's cost per reply, not the server's, was most of a batch's time. The plain-Python
-- statement of the same rules is UserRecord in store/memory.py; see also tidegate.recs.store.
-- KEYS, three a user, the first user's:
-- KEYS[1] state   string, packed: the profile's time (float64), a layout word (uint32: 2^31 + 2^16 *
--                 (the profile's exponent + 2048) + its length), its components in fixed point,
--                 floor(component * 2^(14 - exponent) + 0.5) as int16 each (see
--                 tidegate.recs.store.profile), then
--                 msgpack [recent items [id, time, weight, ...] newest first, purchases [id, time
--                 of the last purchase, ...], buy-again counts [id, log2 of the forward-decayed
--                 count, ...]]. One string per user: a key's overhead is a large part of a user's
--                 few hundred bytes. Earlier layouts are read and replaced: a string whose layout
--                 word is below 2^31 (float32 components, msgpack recent items only, purchases
--                 and counts in KEYS[2] and KEYS[3]), and a hash ("p": msgpack [time, component,
--                 ...], "r": the recent items).
-- KEYS[2] bought  zset  (earlier layouts) item id -> time of its last purchase; deleted once read
-- KEYS[3] again   zset  (earlier layouts) item id -> log2 of its forward-decayed purchase count
-- ARGV[1] profile half-life s, ARGV[2] session window s, ARGV[3] recent items kept, ARGV[4]
-- purchases kept, ARGV[5] co-occurrence half-life s, ARGV[6] buy-again half-life s, ARGV[7]
-- buy-again counts kept, ARGV[8] and on: one a user, in the order of KEYS, the user's
-- interactions packed in one msgpack array, five entries each:
-- item id, time s (float64), kind weight (float64), true for a purchase, the item's unit vector
-- as little-endian float32 bytes ("" when the item is not in the catalogue).
-- Returns per user {1 when the user was new else 0, then per co-occurrence pair: item id, other
-- item id, log2 weight (a string: Lua numbers reach Redis as integers)}.
local half_life, window = tonumber(ARGV[1]), tonumber(ARGV[2])
local recent_cap, bought_cap = tonumber(ARGV[3]), tonumber(ARGV[4])
local pair_half_life, again_half_life, again_cap = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local LN2 = math.log(2)
local MAX_EXPONENT = 1000

local function decay(elapsed)
  return 2 ^ math.min(MAX_EXPONENT, -elapsed / half_life)
end

local LAYOUT = 2 ^ 31  -- the layout word of the current layout starts here
local EXPONENT_BIAS = 2048  -- the profile's exponent is kept as exponent + bias
local FRACTION_BITS = 14  -- the largest component is below 2^14 once scaled

local formats = {}  -- code .. count -> the struct format of count values of that code

local function format_of(code, count)
  local format = formats[code .. count]
  if not format then
    format = '<' .. string.rep(code, count)
    formats[code .. count] = format
  end
  return format
end

local function values(blob, count, from, code)
  -- struct.unpack returns its values and then the next position; 64 at a time keeps the
  -- returned values well inside Lua's stack. The usual single step (a vector, a profile) is
  -- returned as unpacked, without a copy.
  local got_values, position = nil, from
  local done = 0
  while done < count do
    local take = math.min(64, count - done)
    local got = {struct.unpack(format_of(code, take), blob, position)}
    position = got[take + 1]
    got[take + 1] = nil
    if got_values == nil then
      got_values = got
    else
      for k = 1, take do got_values[done + k] = got[k] end
    end
    done = done + take
  end
  return got_values or {}, position
end

local function floats(blob, count, from) return values(blob, count, from, 'f') end

-- One user's events (see the top of this file).
local function record_user(state_key, bought_key, again_key, events_blob)
  local profile, flat = {}, nil  -- profile: {time, component 1, ...}
  local bought, again = {}, {}  -- item id -> time of its last purchase; item id -> log2 count
  local earlier = false  -- an earlier layout: its sorted sets are read, then deleted
  local packed = redis.pcall('GET', state_key)
  if type(packed) == 'table' and packed.err then  -- the earliest layout: a hash
    local held = redis.call('HMGET', state_key, 'p', 'r')
    profile = held[1] and cmsgpack.unpack(held[1]) or {}
    flat = held[2] and cmsgpack.unpack(held[2])
    redis.call('DEL', state_key)
    earlier = true
  elseif packed then
    local at, word, position = struct.unpack('<dI4', packed)
    local size, exponent = word, 0
    if word >= LAYOUT then
      size, exponent = word % 65536, math.floor((word - LAYOUT) / 65536) - EXPONENT_BIAS
    else
      earlier = true
    end
    if size > 0 then
      local components, scale
      if earlier then
        components, position = floats(packed, size, position)
        scale = 1
      else
        components, position = values(packed, size, position, 'h')
        scale = 2 ^ (exponent - FRACTION_BITS)
      end
      profile[1] = at
      for k = 1, size do profile[k + 1] = components[k] * scale end
    end
    local rest = cmsgpack.unpack(string.sub(packed, position))
    if earlier then
      flat = rest
    else
      flat = rest[1]
      for i = 1, #rest[2], 2 do bought[rest[2][i]] = tonumber(rest[2][i + 1]) end
      for i = 1, #rest[3], 2 do again[rest[3][i]] = tonumber(rest[3][i + 1]) end
    end
  end
  if earlier then
    local held = redis.call('ZRANGE', bought_key, 0, -1, 'WITHSCORES')
    for i = 1, #held, 2 do bought[held[i]] = tonumber(held[i + 1]) end
    held = redis.call('ZRANGE', again_key, 0, -1, 'WITHSCORES')
    for i = 1, #held, 2 do again[held[i]] = tonumber(held[i + 1]) end
    redis.call('DEL', bought_key, again_key)
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

  local events = cmsgpack.unpack(events_blob)
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
      if not bought[item] or bought[item] < at then bought[item] = at end
      -- log2(2^a + 2^b), as score.log_add: one purchase of weight 1, forward-decayed
      local value = at / again_half_life
      local count = again[item]
      if count then
        local a, b = count, value
        if a < b then a, b = b, a end
        value = a + math.log(1 + 2 ^ (b - a)) / LN2
      end
      again[item] = value
    end
  end

  -- Keep the `cap` entries of the largest values (ties: the smallest id goes first), as a flat
  -- [id, value, ...] list.
  local function bounded(entries, cap)
    local list = {}
    for id, value in pairs(entries) do list[#list + 1] = {id, value} end
    if #list > cap then
      table.sort(list, function(x, y)
        if x[2] ~= y[2] then return x[2] < y[2] end
        return x[1] < y[1]
      end)
      local kept = {}
      for k = #list - cap + 1, #list do kept[#kept + 1] = list[k] end
      list = kept
    end
    local out_flat = {}
    for _, entry in ipairs(list) do
      out_flat[#out_flat + 1] = entry[1]
      out_flat[#out_flat + 1] = entry[2]
    end
    return out_flat
  end

  -- The profile is kept in 16-bit fixed point, rounded as the memory store rounds it.
  local size = math.max(#profile - 1, 0)
  local largest = 0
  for k = 2, #profile do
    local magnitude = math.abs(profile[k])
    if magnitude > largest then largest = magnitude end
  end
  local exponent = 0
  if largest > 0 then
    local _
    _, exponent = math.frexp(largest)
  end
  local parts = {struct.pack('<dI4', profile[1] or 0, LAYOUT + (exponent + EXPONENT_BIAS) * 65536 + size)}
  local fixed, scale, floor = {}, 2 ^ (FRACTION_BITS - exponent), math.floor
  -- floor(x + 0.5) in doubles, as tidegate.recs.store.profile computes it: the same integers
  for k = 2, #profile do fixed[k - 1] = floor(profile[k] * scale + 0.5) end
  for k = 1, #fixed, 64 do
    local take = math.min(64, #fixed - k + 1)
    parts[#parts + 1] = struct.pack(format_of('h', take), unpack(fixed, k, k + take - 1))
  end
  flat = {}
  for _, entry in ipairs(recent) do
    flat[#flat + 1] = entry[1]
    flat[#flat + 1] = entry[2]
    flat[#flat + 1] = entry[3]
  end
  parts[#parts + 1] = cmsgpack.pack({flat, bounded(bought, bought_cap), bounded(again, again_cap)})
  redis.call('SET', state_key, table.concat(parts))
  return out
end

local replies = {}
for i = 8, #ARGV do
  local first = 3 * (i - 8)
  replies[#replies + 1] = record_user(KEYS[first + 1], KEYS[first + 2], KEYS[first + 3], ARGV[i])
end
return replies
