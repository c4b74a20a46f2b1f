-- Read the entries of several ids of one entity type; writes nothing.
-- KEYS: the type's key set (see _common.lua).
-- ARGV: the entity ids (at most a thousand: the caller pages).
-- Returns one field per id: its entry, or "" (none or expired).
local now = now_ms()
local blobs = redis.call('HMGET', K_ROWS, unpack(ARGV))
local out = {}
for i = 1, #ARGV do
  local blob = blobs[i]
  if blob and not expired(decode(blob), now) then out[i] = blob else out[i] = '' end
end
return out
