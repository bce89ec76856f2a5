-- The heartbeat script of shared budgets: KEYS[1] the fleet; ARGV: replica id, fleet horizon
-- (ms). Answers how many replicas are alive. Mirrors Model::heartbeat.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local horizon = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now_ms, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%.0f', now_ms - horizon))
redis.call('PEXPIRE', KEYS[1], 2 * horizon)
return redis.call('ZCARD', KEYS[1])
