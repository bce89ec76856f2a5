-- What a replica polls each interval. KEYS: the set, the version, the log, the logged version
-- (write.lua). ARGV: the version the replica has ('' for none), the expiry (ms; the keys are
-- kept alive), the set's epoch the replica knows, the most fields a delta may hold.
-- The set carries its epoch in the field `~epoch` (written by restore.lua): a set without it,
-- or with another, is not the data the replica last read (a Redis restarted empty, a failover
-- to a replica that lost it, eviction, or a replica that has read none yet).
-- Answers {'', epoch or '', fields}: not the epoch known (the replica puts back what it holds,
-- restore.lua); {version, epoch}: unchanged; {version, epoch, fields, 'delta'}: the fields
-- changed since the replica's version (each name and text), when every write since was logged
-- (the logged version is the version: a replica of a version without the log did not log)
-- and they are few; else {version, epoch, how many fields the set holds, 'whole'}: the
-- replica reads the set in pages (HSCAN), never the whole of it in one call, which would hold
-- Redis for seconds at a million fields and pass the replica's timeout.
-- The log is trimmed to its newest entries (kept.lua): a trimmed entry is older than every
-- one kept, so a replica that would need it finds more than the delta's most and reads whole.
local epoch = redis.call('HGET', KEYS[1], '~epoch')
for k = 1, 4 do
  redis.call('PEXPIRE', KEYS[k], ARGV[2])
end
if (not epoch) or epoch ~= ARGV[3] then
  return {'', epoch or '', redis.call('HLEN', KEYS[1])}
end
local v = redis.call('GET', KEYS[2]) or '0'
if v == ARGV[1] then
  return {v, epoch}
end
if ARGV[1] ~= '' and redis.call('GET', KEYS[4]) == v then
  local changed = redis.call('ZRANGEBYSCORE', KEYS[3], '(' .. ARGV[1], '+inf', 'LIMIT', 0, ARGV[4] + 1)
  if #changed <= tonumber(ARGV[4]) then
    local out = {}
    for _, f in ipairs(changed) do
      local raw = redis.call('HGET', KEYS[1], f)
      if raw then
        out[#out + 1] = f
        out[#out + 1] = raw
      end
    end
    return {v, epoch, out, 'delta'}
  end
end
return {v, epoch, redis.call('HLEN', KEYS[1]), 'whole'}
