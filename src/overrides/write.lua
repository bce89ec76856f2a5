-- Write parts of overrides (`put` with its JSON, or `del`) and bump the version, in one step:
-- all of them or none. Both keys expire ARGV[1] ms after the last replica touched them.
-- KEYS: the set, the version. ARGV: the expiry (ms), then per part: put|del, the field (a hash
-- of the key's digest, and the part's suffix), the JSON.
for i = 2, #ARGV, 3 do
  if ARGV[i] == 'put' then
    redis.call('HSET', KEYS[1], ARGV[i + 1], ARGV[i + 2])
  else
    redis.call('HDEL', KEYS[1], ARGV[i + 1])
  end
end
local v = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return v
