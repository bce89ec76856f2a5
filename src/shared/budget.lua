-- The budget script of shared budgets (src/shared/script.rs has its contract; it mirrors
-- tollgate_core::limit::shared::model::Model::budget). One key, or a batch of keys in one slot.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now / 1000)
local me = 'r' .. ARGV[1]
local horizon = tonumber(ARGV[2])
local recent = tonumber(ARGV[3])
local packed = ARGV[4]
local at_arg = 1
local out = {}
for k = 1, #KEYS do
  local key = KEYS[k]
  local hits, interval, floor
  hits, interval, floor, at_arg = struct.unpack('<I8I8I8', packed, at_arg)
  local all = redis.call('HGETALL', key)
  local tat = 0
  local n = 1
  local others = 0
  for i = 1, #all, 2 do
    local f = all[i]
    if f == 't' then
      tat = tonumber(all[i + 1])
    elseif f ~= me and string.byte(f, 1) == 114 then
      local v = all[i + 1]
      local sep = string.find(v, ':', 1, true)
      local at = tonumber(sep and string.sub(v, 1, sep - 1) or v)
      if at + horizon >= now_ms then
        n = n + 1
        if sep and at + recent >= now_ms then
          others = others + tonumber(string.sub(v, sep + 1))
        end
      else
        redis.call('HDEL', key, f)
      end
    end
  end
  if tat < now then tat = now end
  if tat < now + floor then tat = now + floor end
  tat = tat + hits * interval
  redis.call('HSET', key, 't', string.format('%.0f', tat), me, string.format('%.0f', now_ms) .. ':' .. hits)
  local ahead = tat - now
  redis.call('PEXPIRE', key, math.floor((ahead + 999) / 1000) + horizon)
  out[#out + 1] = ahead
  out[#out + 1] = n
  out[#out + 1] = others
end
return struct.pack('<' .. string.rep('I8', #out), unpack(out))
