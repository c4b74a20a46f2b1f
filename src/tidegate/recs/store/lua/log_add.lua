-- Add forward-decayed weights to sorted sets of log2 weights (log2(2^a + 2^b) per member), then
-- drop each set's weakest members past the bound (equal scores: the smallest member first).
-- KEYS: the sorted sets (one item's neighbours, or the trending lists, which share a hash tag).
-- ARGV[1] the bound; ARGV[2] the additions packed in one msgpack array, three entries each:
-- index into KEYS (1-based), member, log2 weight (a float64). One packed argument rather than
-- three per addition: the client's command encoding was most of the caller's time.
-- Returns nothing.
local bound = tonumber(ARGV[1])
local adds = cmsgpack.unpack(ARGV[2])
local LN2 = math.log(2)
for i = 1, #adds, 3 do
  local key, member, value = KEYS[adds[i]], adds[i + 1], adds[i + 2]
  local held = redis.call('ZSCORE', key, member)
  if held then
    local a, b = tonumber(held), value
    if a < b then a, b = b, a end
    value = a + math.log(1 + 2 ^ (b - a)) / LN2
  end
  redis.call('ZADD', key, string.format('%.17g', value), member)
end
for _, key in ipairs(KEYS) do
  local size = redis.call('ZCARD', key)
  if size > bound then redis.call('ZREMRANGEBYRANK', key, 0, size - bound - 1) end
end
