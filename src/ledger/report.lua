-- Report one period's quota charges on this replica, for many keys at once: each field takes
-- what its key was charged here since its last report (negative after give-backs).
-- KEYS: the period's hash. ARGV: pairs of a key's name and its charges.
-- Answers each field's count, in order.
local out = {}
for i = 1, #ARGV, 2 do
  out[#out + 1] = redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1])
end
return out
