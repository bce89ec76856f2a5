-- The fleet's quota and ledger counts of one tick, many in one call (src/ledger/fleet.rs).
-- KEYS: the hashes written (quota hashes, day ledger hashes: all in the `{meters}` slot).
-- ARGV: operations of four values each: a letter, a key's index in KEYS (1-based), a field,
-- a value:
--   q  HINCRBY key field value, and its total is answered
--   l  HINCRBY key field value
--   s  HSET key field value
--   x  PEXPIREAT key value (the field is empty)
-- Each runs by itself (`pcall`), as a pipeline's commands would: one that fails does not stop
-- the others. Answers one value per `q`, in order: the field's total, or false (a nil in the
-- reply) where that count was not applied (it is sent again).
local out = {}
for i = 1, #ARGV, 4 do
  local op, key, field, v = ARGV[i], KEYS[tonumber(ARGV[i + 1])], ARGV[i + 2], ARGV[i + 3]
  if op == 'q' then
    local r = redis.pcall('HINCRBY', key, field, v)
    if type(r) == 'number' then out[#out + 1] = r else out[#out + 1] = false end
  elseif op == 'l' then
    redis.pcall('HINCRBY', key, field, v)
  elseif op == 's' then
    redis.pcall('HSET', key, field, v)
  else
    redis.pcall('PEXPIREAT', key, v)
  end
end
return out
