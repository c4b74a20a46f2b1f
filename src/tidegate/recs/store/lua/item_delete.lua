-- Remove an item and log the change under a new catalogue version (nothing when absent).
-- KEYS: as item_put.lua (data, log, version).
-- ARGV[1] item id.
-- Returns the item that was stored, or "" when there was none (the version does not move).
local held = redis.call('HGET', KEYS[1], ARGV[1])
if not held then return '' end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[3]), ARGV[1])
return held
