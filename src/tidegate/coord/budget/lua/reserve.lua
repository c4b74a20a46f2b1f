-- Reserve an amount against a tenant's and the global daily budget: both checked, both charged,
-- or nothing changes.
-- KEYS[1] tidegate:{name}:budget:<day>:spend    hash  tenant -> micros spent or reserved that
--                                                      day; field '*' -> the global total
-- KEYS[2] tidegate:{name}:budget:<day>:pending  hash  reservation id -> micros reserved and not
--                                                      yet settled (settle deletes the field, so
--                                                      its absence is the "settled" marker)
-- ARGV[1] tenant, [2] amount micros, [3] tenant limit micros ('' = none), [4] global limit
--         micros ('' = none), [5] '1' to enforce the limits, '0' to record only, [6] reservation
--         id, [7] seconds to keep the day's keys
-- Returns {} when reserved, else {scope, spent micros of that scope} ('tenant' checked first).
local tenant, amount = ARGV[1], tonumber(ARGV[2])
local tenant_limit, global_limit = tonumber(ARGV[3]), tonumber(ARGV[4])
if ARGV[5] == '1' then
  local spent = redis.call('HMGET', KEYS[1], tenant, '*')
  local tenant_spent, global_spent = tonumber(spent[1]) or 0, tonumber(spent[2]) or 0
  if tenant_limit and tenant_spent + amount > tenant_limit then
    return {'tenant', string.format('%.0f', tenant_spent)}
  end
  if global_limit and global_spent + amount > global_limit then
    return {'global', string.format('%.0f', global_spent)}
  end
end
redis.call('HINCRBY', KEYS[1], tenant, ARGV[2])
redis.call('HINCRBY', KEYS[1], '*', ARGV[2])
redis.call('HSET', KEYS[2], ARGV[6], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[7])
redis.call('EXPIRE', KEYS[2], ARGV[7])
return {}
