-- Apply one user's interactions in order: decayed profile, co-occurrence pairs, recent items,
-- purchased items and their buy-again counts. The plain-Python statement of the same rules is UserRecord in
-- store_memory.py; see also tidegate.recs.store.
-- KEYS[1] state   hash  "p": profile, msgpack [time of last update, component 1, ...];
--                       "r": recent items, msgpack [id, time, weight, id, time, weight, ...],
--                       newest first
-- KEYS[2] bought  zset  item id -> time of its last purchase
-- KEYS[3] again   zset  item id -> log2 of its forward-decayed purchase count
-- ARGV[1] profile half-life s, ARGV[2] session window s, ARGV[3] recent items kept, ARGV[4]
-- purchases kept, ARGV[5] co-occurrence half-life s, ARGV[6] buy-again half-life s, ARGV[7]
-- buy-again counts kept, then five fields per interaction: item id, time s, kind weight, "1" for a purchase else
-- "0", the item's unit vector (msgpack array) or "" when the item is not in the catalogue.
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

local held = redis.call('HMGET', KEYS[1], 'p', 'r')
local profile = held[1] and cmsgpack.unpack(held[1]) or {}
local recent = {}
if held[2] then
  local flat = cmsgpack.unpack(held[2])
  for i = 1, #flat, 3 do recent[#recent + 1] = {flat[i], tonumber(flat[i + 1]), tonumber(flat[i + 2])} end
end
local out = {held[2] and 0 or 1}

local function add_to_profile(at, weight, packed)
  if packed == '' then return end
  local v = cmsgpack.unpack(packed)
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

for i = 8, #ARGV, 5 do
  local item, at, weight = ARGV[i], tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  add_to_profile(at, weight, ARGV[i + 4])
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
  if ARGV[i + 3] == '1' then
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
if #profile > 0 then redis.call('HSET', KEYS[1], 'p', cmsgpack.pack(profile)) end
local flat = {}
for _, entry in ipairs(recent) do
  flat[#flat + 1] = entry[1]
  flat[#flat + 1] = entry[2]
  flat[#flat + 1] = entry[3]
end
redis.call('HSET', KEYS[1], 'r', cmsgpack.pack(flat))
return out
