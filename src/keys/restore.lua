-- Put back what a replica holds of the overrides, merged field by field by the rule every copy
-- follows (tollgate_core::policy::versions): a revocation is never undone, and of two the
-- earlier stays; otherwise the later version wins, and on a tie the larger text. Then mark
-- the set with its epoch (one already there stays) and, when a field was put back or the
-- epoch is new, bump the version: each field put back is logged at it (kept.lua, sent before
-- this text), so every replica reads what changed. A call that changed nothing (a starting
-- replica with nothing to put back) makes no replica read.
-- KEYS: the set, the version, the log, the logged version. ARGV: the expiry (ms), an epoch for
-- a set without one, the log's length, then per field: its name, its text (`<version>|<JSON>`,
-- or plain JSON from before versions).
-- Answers {the set's epoch, how many fields this call changed}.
local changed = 0
local put_back = {}
for i = 4, #ARGV, 2 do
  local f, raw = ARGV[i], ARGV[i + 1]
  local cur = redis.call('HGET', KEYS[1], f)
  local put = false
  if not cur then
    put = true
  else
    local cv, iv = version(cur), version(raw)
    local later = iv > cv or (iv == cv and raw > cur)
    if string.sub(f, -2) == ':r' then
      local ir, cr = revokes(raw), revokes(cur)
      if ir and cr then
        -- Of two revocations, the earlier.
        put = iv < cv or (iv == cv and raw < cur)
      elseif ir or cr then
        put = ir
      else
        put = later
      end
    else
      put = later
    end
  end
  if put then
    redis.call('HSET', KEYS[1], f, raw)
    changed = changed + 1
    put_back[#put_back + 1] = f
  end
end
logged(put_back, false)
return {redis.call('HGET', KEYS[1], '~epoch'), changed}
