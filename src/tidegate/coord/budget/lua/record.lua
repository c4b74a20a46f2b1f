-- Add what a call cost, with no reservation before it (no limit is checked against it).
-- Not idempotent: sent once (sent twice, it would count twice).
-- KEYS[1] tidegate:{name}:budget:<day>:spend (see reserve.lua)
-- ARGV[1] tenant, [2] micros, [3] seconds to keep the day's keys
redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[1], '*', ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
