-- Read a key's limiter state together with the server clock it is measured against.
-- KEYS[1] the key's state hash (fields: see acquire.lua)
-- ARGV: none.
-- Returns {now us, rt, tt, pu, rpm, tpm, per, rc, tc}, each a string ('' when unset).
local t = redis.call('TIME')
local now = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
local state = redis.call('HMGET', KEYS[1], 'rt', 'tt', 'pu', 'rpm', 'tpm', 'per', 'rc', 'tc')
local out = {now}
for i = 1, 8 do out[i + 1] = state[i] or '' end
return out
