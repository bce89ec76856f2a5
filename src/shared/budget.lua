-- The budget script of shared budgets (src/shared/script.rs has its contract; it mirrors
-- tollgate_core::limit::shared::model::Model::budget). One key, or a batch of keys in one slot.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local horizon = tonumber(ARGV[1])
local packed = ARGV[2]
local at_arg = 1
local out = {}
for k = 1, #KEYS do
  local key = KEYS[k]
  local want, give, debt, interval, limit, floor, early
  want, give, debt, interval, limit, floor, early, at_arg =
    struct.unpack('<I8I8I8I8I8I8I8', packed, at_arg)
  if interval < 1 then interval = 1 end
  local tat = tonumber(redis.call('HGET', key, 't') or '0')
  if tat < now then tat = now end
  if tat < now + floor then tat = now + floor end
  tat = tat + debt * interval
  tat = tat - give * interval
  if tat < now then tat = now end
  local room = math.floor((now + early + limit * interval - tat) / interval)
  if room < 0 then room = 0 end
  local granted = want
  if granted > room then granted = room end
  tat = tat + granted * interval
  -- `tat` is a whole number of µs (every term is), below 2^53: '%d' writes the digits '%.0f'
  -- did, for less of Redis's CPU.
  redis.call('HSET', key, 't', string.format('%d', tat))
  local ahead = tat - now
  redis.call('PEXPIRE', key, math.floor((ahead + 999) / 1000) + horizon)
  out[2 * k - 1] = granted
  out[2 * k] = ahead
end
return struct.pack('<' .. string.rep('I8', #out), unpack(out))
