-- What write.lua and restore.lua share: each is sent with this text before its own.
-- KEYS: the set, the version, the log, the logged version. ARGV[1]: the expiry (ms); ARGV[2]:
-- an epoch for a set without one; ARGV[3]: the log's length.

-- A kept text's version (16 digits; a text from before versions is at version 0).
local function version(raw)
  return string.match(raw, '^(%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)|') or '0000000000000000'
end

-- Whether a kept text holds a revocation.
local function revokes(raw)
  local ok, o = pcall(cjson.decode, (string.gsub(raw, '^%d+|', '', 1)))
  return ok and type(o) == 'table' and o.revoked ~= nil
end

-- Mark the set with its epoch (one already there stays). When `bump`, a field was written or
-- the epoch is new: bump the version and log each of `fields` at it (a sorted set, one member
-- a field, its score the version that last wrote it), keep the log's newest ARGV[3] entries,
-- and mark the log as up to the version, so that a poll reads only the fields changed since
-- the version it has (poll.lua). An entry trimmed is no newer than any kept: a replica that
-- would need it finds at least ARGV[3] changed, more than a delta holds, and reads the set
-- whole. Then keep the four keys alive ARGV[1] ms more.
local function logged(fields, bump)
  local marked = redis.call('HSETNX', KEYS[1], '~epoch', ARGV[2])
  if bump or #fields > 0 or marked == 1 then
    local now = redis.call('INCR', KEYS[2])
    for _, f in ipairs(fields) do
      redis.call('ZADD', KEYS[3], now, f)
    end
    local over = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[3])
    if over > 0 then
      redis.call('ZREMRANGEBYRANK', KEYS[3], 0, over - 1)
    end
    redis.call('SET', KEYS[4], now)
  end
  for k = 1, 4 do
    redis.call('PEXPIRE', KEYS[k], ARGV[1])
  end
end
