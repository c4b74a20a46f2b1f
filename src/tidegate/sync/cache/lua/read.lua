-- Read one entry and the type's truncate floor; writes nothing.
-- KEYS: the type's key set (see _common.lua).
-- ARGV[1] entity id.
-- Returns {entry or "" (none or expired), floor version key or "" (never truncated)}.
local blob = redis.call('HGET', K_ROWS, ARGV[1])
if blob and expired(decode(blob), now_ms()) then blob = false end
return {blob or '', redis.call('GET', K_FLOOR) or ''}
