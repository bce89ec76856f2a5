-- Write one override (`put` with its JSON, or `del`) and bump the version; both keys expire
-- ARGV[4] ms after the last replica touched them. KEYS: the set, the version. ARGV: put|del,
-- the field (a hash of the key's digest), the JSON, the expiry (ms).
if ARGV[1] == 'put' then
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
else
  redis.call('HDEL', KEYS[1], ARGV[2])
end
local v = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return v
