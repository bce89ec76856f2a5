-- Report one period's quota charges on this replica, for many keys at once: each field takes
-- what its key was charged here since its last report (negative after give-backs).
-- A call is applied once: its number (ARGV[2]) goes into this replica's own field of the
-- hash (ARGV[1]), and a call whose number is not above that field's, one sent again because
-- its answer did not come or no replica confirmed it, adds nothing.
-- KEYS: the period's hash. ARGV: the replica's field, the call's number, then pairs of a
-- key's name and its charges.
-- Answers each field's count, in order.
local again = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0') >= tonumber(ARGV[2])
if not again then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
local out = {}
for i = 3, #ARGV, 2 do
  if again then
    out[#out + 1] = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  else
    out[#out + 1] = redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
return out
