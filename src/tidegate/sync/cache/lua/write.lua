-- An application write: store a merged row if the entry's revision is still the one the writer
-- read, keeping the entry's source version (version zero when nothing is held).
-- KEYS: the type's key set (see _common.lua).
-- ARGV[1] entity id, ARGV[2] expected revision (0: nothing held), ARGV[3] live-entry TTL ms
-- (0: none), ARGV[4] checksum of the row, ARGV[5] row JSON.
-- Returns {1, new revision}, or {0, current revision} with nothing written.
local now = now_ms()
prune(now, PRUNE_MIN)
local entry = held(ARGV[1], now)
local revision, version = 0, ZERO_VERSION
if entry then revision, version = entry.revision, entry.version end
if revision ~= tonumber(ARGV[2]) then return {0, revision} end
put(ARGV[1], version, expiry(now, tonumber(ARGV[3])), revision + 1, ARGV[4], ARGV[5])
return {1, revision + 1}
