-- Repair one entry (what `tidegate sync verify --repair` writes): store the database's row, or a
-- tombstone, only if the entry is still the one the caller read, keeping its source version
-- (ZERO_VERSION when nothing was held) so every later change from the source still wins.
-- KEYS: the type's key set (see _common.lua).
-- ARGV[1] entity id, ARGV[2] expected revision (0: nothing held), ARGV[3] expected version key
-- ("" when nothing held), ARGV[4] live-entry TTL ms (0: none), ARGV[5] tombstone TTL ms (0: none),
-- ARGV[6] checksum, ARGV[7] row JSON ("" for a tombstone).
-- Returns 1 when written, 0 when the entry changed since it was read (nothing written).
local now = now_ms()
prune(now, PRUNE_MIN)
local entry = held(ARGV[1], now)
local revision, version = 0, ''
if entry then revision, version = entry.revision, entry.version end
if revision ~= tonumber(ARGV[2]) or version ~= ARGV[3] then return 0 end
if version == '' then version = ZERO_VERSION end
local ttl = tonumber(ARGV[4])
if ARGV[7] == '' then ttl = tonumber(ARGV[5]) end
put(ARGV[1], version, expiry(now, ttl), revision + 1, ARGV[6], ARGV[7])
return 1
