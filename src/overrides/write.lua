-- Write parts of overrides, each later than the copy it replaces, and bump the version: all of
-- them or none. A part taken out is written too, as a tombstone (a record holding no part),
-- so that the removal outranks the change wherever copies meet (tollgate_core::policy::
-- versions). A revocation kept stays: it is never replaced.
-- A set this write creates is marked with an epoch (ARGV[2]; restore.lua says what it is for):
-- a replica that knew another finds it, and puts back what it holds.
-- KEYS: the set, the version. ARGV: the expiry (ms), an epoch, then per part: the field (a
-- hash of the key's digest and the part's suffix), its version (16 digits), its JSON.
-- Answers each field's text as kept (`<version>|<JSON>`). Both keys expire ARGV[1] ms after
-- the last replica touched them.
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
for i = 3, #ARGV, 3 do
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
  end
end
redis.call('HSETNX', KEYS[1], '~epoch', ARGV[2])
redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return out
