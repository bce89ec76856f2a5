-- Write parts of overrides, each later than the copy it replaces, and bump the version: all of
-- them or none. A part taken out is written too, as a tombstone (a record holding no part),
-- so that the removal outranks the change wherever copies meet (tollgate_core::policy::
-- versions). A revocation kept stays: it is never replaced.
-- A set this write creates is marked with an epoch (restore.lua says what it is for): a
-- replica that knew another finds it, and puts back what it holds. Each field written is
-- logged at the set's new version (kept.lua, sent before this text, says how).
-- First, conditions: each replica decides a change to an issued key on its own copy, which
-- another replica's change reaches only at its next poll; a condition that fails refuses the
-- whole write, before anything is written (redis_set.rs, `Condition`).
-- KEYS: the set, the version, the log, the logged version, then the claims' keys. ARGV: the
-- expiry (ms), an epoch, the log's length, a claim's life (ms), the number of conditions,
-- then per condition its kind and two words:
--   k FIELD DIGEST   the issued part FIELD is absent (DIGEST empty: a new key), or holds a
--                    key whose digest in force is DIGEST (hex)
--   n KEY OWNER      the name claimed at KEYS[KEY] by OWNER (a field): unclaimed, claimed by
--                    OWNER, or by a field that holds no key now (deleted)
--   d KEY OWNER      the digest claimed at KEYS[KEY] by OWNER: unclaimed or OWNER's
--   f KEY OWNER      the claim at KEYS[KEY], let go if OWNER's (a deleted key's name)
--   u FIELD -        the revocation part FIELD is absent or revokes nothing (a key rotated
--                    must not have been revoked meanwhile)
-- then per part: the field (a hash of the key's digest and the part's suffix), its version
-- (16 digits), its JSON. Answers each field's text as kept (`<version>|<JSON>`), or, when a
-- condition failed, `~clash`, its index (from 0) and `name`, `sha256` or `changed`. The keys
-- expire ARGV[1] ms after the last replica touched them.

-- The issued key a kept text holds (nil: none, or a tombstone).
local function issued(raw)
  if not raw then
    return nil
  end
  local ok, o = pcall(cjson.decode, (string.gsub(raw, '^%d+|', '', 1)))
  if ok and type(o) == 'table' and type(o.issued) == 'table' then
    return o.issued
  end
  return nil
end

local n = tonumber(ARGV[5])
local first = 6 + 3 * n
for c = 0, n - 1 do
  local kind, a, b = ARGV[6 + 3 * c], ARGV[7 + 3 * c], ARGV[8 + 3 * c]
  local clash = nil
  if kind == 'k' then
    local cur = redis.call('HGET', KEYS[1], a)
    if b == '' then
      if cur then
        clash = 'sha256'
      end
    else
      local i = issued(cur)
      if not i or i.digest ~= b then
        clash = 'changed'
      end
    end
  elseif kind == 'u' then
    local cur = redis.call('HGET', KEYS[1], a)
    if cur and revokes(cur) then
      clash = 'changed'
    end
  elseif kind == 'n' or kind == 'd' then
    local owner = redis.call('GET', KEYS[tonumber(a)])
    if owner and owner ~= b then
      if kind == 'd' then
        clash = 'sha256'
      elseif issued(redis.call('HGET', KEYS[1], owner)) then
        clash = 'name'
      end
    end
  end
  if clash then
    return { '~clash', tostring(c), clash }
  end
end
for c = 0, n - 1 do
  local kind, a, b = ARGV[6 + 3 * c], ARGV[7 + 3 * c], ARGV[8 + 3 * c]
  if kind == 'n' or kind == 'd' then
    redis.call('SET', KEYS[tonumber(a)], b, 'PX', ARGV[4])
  elseif kind == 'f' and redis.call('GET', KEYS[tonumber(a)]) == b then
    redis.call('DEL', KEYS[tonumber(a)])
  end
end

local out = {}
local written = {}
for i = first, #ARGV, 3 do
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
