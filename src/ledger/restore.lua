-- Put back one period's quota counts as a replica holds them (at its start, and after it found
-- the period's hash missing: a Redis restarted empty, flushed or failed over to a replica
-- without the data): each field takes the larger of what it holds and the replica's count.
-- KEYS: the period's hash. ARGV: pairs of a key's name and its count.
-- Answers each field's count, in order, then how many fields it raised.
local out, raised = {}, 0
for i = 1, #ARGV, 2 do
  local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  local held = tonumber(ARGV[i + 1])
  if held > cur then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    cur = held
    raised = raised + 1
  end
  out[#out + 1] = cur
end
out[#out + 1] = raised
return out
