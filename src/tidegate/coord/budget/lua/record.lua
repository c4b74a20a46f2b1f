-- Add what calls cost, with no reservation before them (no limit is checked against them).
-- Not idempotent: sent once (sent twice, it would count twice).
-- KEYS[1] tidegate:{name}:budget:<day>:spend (see reserve.lua)
-- ARGV[1] seconds to keep the day's keys, then pairs: tenant, micros
local total = 0
for i = 2, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
  total = total + tonumber(ARGV[i + 1])
end
redis.call('HINCRBY', KEYS[1], '*', string.format('%.0f', total))
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
