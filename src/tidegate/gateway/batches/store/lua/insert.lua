-- Store a new batch, and index it by its creation time for listing, unless its id is taken.
-- Not sent twice: a second run would find its own batch and answer 0.
-- KEYS[1] tidegate:{name}:batches  hash  batch id -> BatchRecord JSON
-- KEYS[2] tidegate:{name}:batches_of:<tenant>  sorted set  the tenant's batch ids by created_at
-- KEYS[3] tidegate:{name}:batches_by_time  sorted set  every batch id by created_at
-- ARGV[1] batch id, [2] the record, [3] its created_at (epoch s)
-- Returns 1 when stored, 0 when the id was taken (nothing written).
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return 0
end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
return 1
