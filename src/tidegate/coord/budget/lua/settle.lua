-- Settle a reservation to the actual amount on the reservation's own day (release = settle 0).
-- Idempotent: the first call removes the pending entry, and any later call finds none.
-- KEYS[1] tidegate:{name}:budget:<day>:spend, KEYS[2] tidegate:{name}:budget:<day>:pending
--         (see reserve.lua)
-- ARGV[1] tenant, [2] reservation id, [3] actual micros, [4] seconds to keep the day's keys
-- Returns 1 when settled now, 0 when it was settled before (or is unknown or expired).
local reserved = redis.call('HGET', KEYS[2], ARGV[2])
if not reserved then return 0 end
redis.call('HDEL', KEYS[2], ARGV[2])
local delta = tonumber(ARGV[3]) - tonumber(reserved)
if delta ~= 0 then
  -- '%.0f': tostring() of a number would switch to exponent notation above 14 digits.
  local text = string.format('%.0f', delta)
  redis.call('HINCRBY', KEYS[1], ARGV[1], text)
  redis.call('HINCRBY', KEYS[1], '*', text)
end
redis.call('EXPIRE', KEYS[1], ARGV[4])
return 1
