-- Pause a key: every acquire returns the time left until the pause ends. A longer pause extends
-- the current one; a shorter one never shortens it.
-- KEYS[1] the key's state hash (fields: see acquire.lua)
-- ARGV[1] pause length in us, [2] ms to keep the state after it has nothing left to remember,
--         [3] the channel pauses are announced on, [4] the command that announces (PUBLISH, or
--         SPUBLISH on a cluster): the message is "<us paused from now> <KEYS[1]>", so processes
--         that skip this script for keys without limits learn of the pause at once
-- Returns the us the key stays paused from now.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local state = redis.call('HMGET', KEYS[1], 'rt', 'tt', 'pu')
local paused = math.max(tonumber(state[3]) or 0, now + tonumber(ARGV[1]))
redis.call('HSET', KEYS[1], 'pu', string.format('%.0f', math.ceil(paused)))
local horizon = math.max(tonumber(state[1]) or 0, tonumber(state[2]) or 0, paused)
redis.call('PEXPIRE', KEYS[1], math.ceil((horizon - now) / 1000) + tonumber(ARGV[2]))
local left = math.ceil(paused - now)
redis.call(ARGV[4], ARGV[3], string.format('%.0f', left) .. ' ' .. KEYS[1])
return left
