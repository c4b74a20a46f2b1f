-- Store (or replace) an item and log the change under a new catalogue version.
-- KEYS[1] data     hash  item id -> item (msgpack, see store_redis.py)
-- KEYS[2] log      zset  item id -> catalogue version of its last change (put or delete)
-- KEYS[3] version  string  the catalogue version (changes so far)
-- ARGV[1] item id, ARGV[2] item.
-- Returns the new version.
local version = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], version, ARGV[1])
return version
