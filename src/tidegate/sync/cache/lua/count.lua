-- Count the live entries of one entity type that have not expired; writes nothing.
-- KEYS: the type's key set (see _common.lua).
-- ARGV: none. Returns the count.
return redis.call('ZCOUNT', K_LIVE, '(' .. now_ms(), '+inf')
