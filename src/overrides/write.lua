-- Write parts of overrides, each later than the copy it replaces, and bump the version: all of
-- them or none. A part taken out is written too, as a tombstone (a record holding no part),
-- so that the removal outranks the change wherever copies meet (tollgate_core::policy::
-- versions). A revocation kept stays: it is never replaced.
-- A set this write creates is marked with an epoch (ARGV[2]; restore.lua says what it is for):
-- a replica that knew another finds it, and puts back what it holds.
-- Each field written is logged at the set's new version (the log: a sorted set, one member a
-- field, its score the version that last wrote it), and the logged version follows the
-- version, so that a poll reads only the fields changed since the version it has. The log
-- keeps its newest ARGV[3] entries (one more than the most a poll answers as a delta): an
-- entry trimmed is no newer than any kept, so a replica that would need it finds at least
-- ARGV[3] changed and reads the set whole (poll.lua); the log stays bounded however many
-- keys are issued.
-- KEYS: the set, the version, the log, the logged version. ARGV: the expiry (ms), an epoch,
-- the log's length, then per part: the field (a hash of the key's digest and the part's suffix), its version
-- (16 digits), its JSON. Answers each field's text as kept (`<version>|<JSON>`). The keys
-- expire ARGV[1] ms after the last replica touched them.
local function version(raw)
  return string.match(raw, '^(%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d%d)|') or '0000000000000000'
end
local function revocation_kept(field, raw)
  if string.sub(field, -2) ~= ':r' then
    return false
  end
  local ok, o = pcall(cjson.decode, (string.gsub(raw, '^%d+|', '', 1)))
  return ok and type(o) == 'table' and o.revoked ~= nil
end
local out = {}
local written = {}
for i = 4, #ARGV, 3 do
  local f, v, json = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local cur = redis.call('HGET', KEYS[1], f)
  if cur and revocation_kept(f, cur) then
    out[#out + 1] = cur
  else
    if cur and version(cur) >= v then
      v = string.format('%016d', tonumber(version(cur)) + 1)
    end
    local raw = v .. '|' .. json
    redis.call('HSET', KEYS[1], f, raw)
    out[#out + 1] = raw
    written[#written + 1] = f
  end
end
redis.call('HSETNX', KEYS[1], '~epoch', ARGV[2])
local now = redis.call('INCR', KEYS[2])
for _, f in ipairs(written) do
  redis.call('ZADD', KEYS[3], now, f)
end
local over = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[3])
if over > 0 then
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, over - 1)
end
redis.call('SET', KEYS[4], now)
for k = 1, 4 do
  redis.call('PEXPIRE', KEYS[k], ARGV[1])
end
return out
