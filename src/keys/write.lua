-- Write parts of overrides, each later than the copy it replaces, and bump the version: all of
-- them or none. A part taken out is written too, as a tombstone (a record holding no part),
-- so that the removal outranks the change wherever copies meet (tollgate_core::policy::
-- versions). A revocation kept stays: it is never replaced.
-- A set this write creates is marked with an epoch (restore.lua says what it is for): a
-- replica that knew another finds it, and puts back what it holds. Each field written is
-- logged at the set's new version (kept.lua, sent before this text, says how).
-- KEYS: the set, the version, the log, the logged version. ARGV: the expiry (ms), an epoch,
-- the log's length, then per part: the field (a hash of the key's digest and the part's
-- suffix), its version (16 digits), its JSON. Answers each field's text as kept
-- (`<version>|<JSON>`). The keys expire ARGV[1] ms after the last replica touched them.
local out = {}
local written = {}
for i = 4, #ARGV, 3 do
  local f, v, json = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local cur = redis.call('HGET', KEYS[1], f)
  if cur and string.sub(f, -2) == ':r' and revokes(cur) then
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
logged(written, true)
return out
