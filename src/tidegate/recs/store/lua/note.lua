-- Record that interactions were applied.
-- KEYS[1] meta  hash  "users": users seen, "updated": time s of the last recording,
--                     "newest": time s of the newest interaction recorded
-- ARGV[1] time of this recording s, ARGV[2] its newest interaction's time s, ARGV[3] new users.
-- Returns nothing.
redis.call('HINCRBY', KEYS[1], 'users', ARGV[3])
for field, index in pairs({updated = 1, newest = 2}) do
  local held = redis.call('HGET', KEYS[1], field)
  if not held or tonumber(held) < tonumber(ARGV[index]) then redis.call('HSET', KEYS[1], field, ARGV[index]) end
end
