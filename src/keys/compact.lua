-- The compact copy of the set (src/keys/redis_set/compact.rs): the set's fields and texts as
-- of one version, in a few large values (chunks) that a starting replica reads instead of
-- walking the set. KEYS: the set, the version, the log, the logged version (poll.lua), the
-- copy's header (a hash), then, for 'finish', the new chunks and the chunks they replace.
--
-- ARGV[1] 'status': answers {the set's epoch or '', how many fields it holds, its version, the
-- header's epoch, version, generation, chunks, fields and format (each '' when there is no
-- header), how many fields the log names since the header's version ('' when the log cannot
-- say: no header, or a write by a version without the log)}.
--
-- ARGV[1] 'drop', ARGV[2] a generation: a copy found damaged (a chunk gone, or not one, or
-- fewer fields than its header says) is taken out when the header still names that
-- generation, so that the next look writes another; its chunks (the keys after the header)
-- expire a minute later. Answers 1, or 0 when another copy is in place.
--
-- ARGV[1] 'finish', then the epoch, the version, the generation, how many chunks it has, how
-- many fields they hold, the expiry (ms), the generation it replaces ('' for none) and the
-- format: puts the new header in place when the set still has that epoch and the header
-- still names the generation replaced (another replica's copy written meanwhile stays), keeps
-- the new chunks for the expiry and the old ones a minute more (a replica reading them now
-- finishes; one that finds one gone reads the set instead). Answers 1, or 0 when not put.
local epoch = redis.call('HGET', KEYS[1], '~epoch') or ''
if ARGV[1] == 'status' then
  local h = redis.call('HMGET', KEYS[5], 'epoch', 'version', 'gen', 'chunks', 'fields', 'format')
  local since = ''
  local v = redis.call('GET', KEYS[2]) or '0'
  if h[2] and tonumber(h[2]) and redis.call('GET', KEYS[4]) == v then
    since = tostring(redis.call('ZCOUNT', KEYS[3], '(' .. h[2], '+inf'))
  end
  return {epoch, redis.call('HLEN', KEYS[1]), v, h[1] or '', h[2] or '', h[3] or '', h[4] or '',
    h[5] or '', h[6] or '', since}
end
if ARGV[1] == 'drop' then
  if redis.call('HGET', KEYS[5], 'gen') ~= ARGV[2] then
    return 0
  end
  redis.call('DEL', KEYS[5])
  for k = 6, #KEYS do
    redis.call('PEXPIRE', KEYS[k], 60000)
  end
  return 1
end
local chunks = tonumber(ARGV[5])
if epoch ~= ARGV[2] or (redis.call('HGET', KEYS[5], 'gen') or '') ~= ARGV[8] then
  return 0
end
redis.call('DEL', KEYS[5])
redis.call('HSET', KEYS[5], 'epoch', ARGV[2], 'version', ARGV[3], 'gen', ARGV[4],
  'chunks', ARGV[5], 'fields', ARGV[6], 'format', ARGV[9])
redis.call('PEXPIRE', KEYS[5], ARGV[7])
for k = 6, 5 + chunks do
  redis.call('PEXPIRE', KEYS[k], ARGV[7])
end
for k = 6 + chunks, #KEYS do
  redis.call('PEXPIRE', KEYS[k], 60000)
end
return 1
