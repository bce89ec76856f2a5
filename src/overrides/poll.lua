-- What a replica polls each interval. KEYS: the set, the version. ARGV: the version the replica
-- has, the expiry (ms; both keys are kept alive), the set's epoch the replica knows.
-- The set carries its epoch in the field `~epoch` (written by restore.lua): a set without it,
-- or with another, is not the data the replica last read (a Redis restarted empty, a failover
-- to a replica that lost it, eviction, or a replica that has read none yet).
-- Answers {'', epoch or '', fields}: not the epoch known (the replica puts back what it holds,
-- restore.lua); {version, epoch}: unchanged; {version, epoch, the whole set}: it moved.
local epoch = redis.call('HGET', KEYS[1], '~epoch')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
if (not epoch) or epoch ~= ARGV[3] then
  return {'', epoch or '', redis.call('HLEN', KEYS[1])}
end
local v = redis.call('GET', KEYS[2]) or '0'
if v == ARGV[1] then
  return {v, epoch}
end
return {v, epoch, redis.call('HGETALL', KEYS[1])}
