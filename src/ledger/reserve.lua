-- Report one key's quota charges on this replica and reserve requests that wait for the
-- fleet's word (tollgate_core::metering::fleet): the field takes the charges (ARGV[2], negative
-- after give-backs) and is at least this replica's view of it (ARGV[5]: a field the store lost
-- is put back as restore.lua would), then as many of the ARGV[3] requests wanted as the quota
-- (ARGV[4]) has room for, in one step: two replicas never reserve the same room. Nothing is
-- reserved where the replica's own mark (ARGV[6]) is not in the hash: a hash lost since the
-- replica's last round, or one it has not marked yet; the round's mark, after, says which.
-- A call is applied once, as report.lua's are (its number ARGV[8] in the replica's field
-- ARGV[7]): one sent again adds nothing and reserves nothing.
-- KEYS: the period's hash. ARGV: the key's name, the charges, the requests wanted, the quota,
-- the replica's view of the count (charges included), the replica's mark, the replica's
-- field, the call's number.
-- Answers {the count, the requests reserved}.
if tonumber(redis.call('HGET', KEYS[1], ARGV[7]) or '0') >= tonumber(ARGV[8]) then
  return {tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0'), 0}
end
redis.call('HSET', KEYS[1], ARGV[7], ARGV[8])
local t = redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
local view = tonumber(ARGV[5])
if t < view then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[5])
  t = view
end
local g = 0
if redis.call('HEXISTS', KEYS[1], ARGV[6]) == 1 then
  g = math.min(tonumber(ARGV[3]), math.max(0, tonumber(ARGV[4]) - t))
end
if g > 0 then
  t = redis.call('HINCRBY', KEYS[1], ARGV[1], g)
end
return {t, g}
