-- Cache a row loaded from the source of truth on a miss, at version zero (below every change
-- from the source), unless an entry was written or the type truncated while it loaded.
-- KEYS: the type's key set (see _common.lua).
-- ARGV[1] entity id, ARGV[2] the floor read before loading ("" none), ARGV[3] live-entry TTL ms
-- (0: none), ARGV[4] checksum, ARGV[5] row JSON.
-- Returns {"w", ""} when written, {"h", row held ("" for a tombstone)} when an entry is held, or
-- {"t", ""} when the type was truncated meanwhile (nothing written).
local now = now_ms()
prune(now, PRUNE_MIN)
if (redis.call('GET', K_FLOOR) or '') ~= ARGV[2] then return {'t', ''} end
local entry = held(ARGV[1], now)
if entry then return {'h', entry.row} end
put(ARGV[1], ZERO_VERSION, expiry(now, tonumber(ARGV[3])), 1, ARGV[4], ARGV[5])
return {'w', ''}
