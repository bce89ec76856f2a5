-- Add this replica's ledger counts of one day, for many keys at once, and keep the day's hash
-- until its retention ends. Fields: `<name>:<column>` (a count), `<name>:plan`,
-- `<name>:partner` (empty for none).
-- A call is applied once: its number (ARGV[3]) goes into this replica's own field of the
-- hash (ARGV[2]), and a call whose number is not above that field's (sent again) adds
-- nothing.
-- KEYS: the day's hash. ARGV[1]: when the hash expires (ms since the Unix epoch); ARGV[2],
-- ARGV[3]: the replica's field and the call's number; then per key: its name, plan, partner
-- (an empty plan: both unchanged, not written), the number of its columns n, and n pairs of
-- a column and its count. Answers how many keys it took.
redis.call('PEXPIREAT', KEYS[1], ARGV[1])
if tonumber(redis.call('HGET', KEYS[1], ARGV[2]) or '0') >= tonumber(ARGV[3]) then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
local i, took = 4, 0
while i <= #ARGV do
  local name, n = ARGV[i], tonumber(ARGV[i + 3])
  if ARGV[i + 1] ~= '' then
    redis.call('HSET', KEYS[1], name .. ':plan', ARGV[i + 1], name .. ':partner', ARGV[i + 2])
  end
  for j = i + 4, i + 3 + 2 * n, 2 do
    redis.call('HINCRBY', KEYS[1], name .. ':' .. ARGV[j], ARGV[j + 1])
  end
  i = i + 4 + 2 * n
  took = took + 1
end
return took
