-- The version, and the whole set when it is not the one the replica has (ARGV[1]); keeps
-- both alive for ARGV[2] ms. KEYS: the set, the version.
local v = redis.call('GET', KEYS[2]) or '0'
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
if v == ARGV[1] then
  return {v}
end
return {v, redis.call('HGETALL', KEYS[1])}
