-- One rate-limit decision, atomic on the server: GCRA (the generic cell rate algorithm, as in
-- redis-cell and Envoy's limiter), equivalent to a token bucket of `burst` tokens refilled at
-- `rate` per second. Every replica runs this same script against the same key, so there is
-- no read-modify-write race between them.
-- KEYS[1] = the agent's key
-- ARGV[1] = rate, requests per second (a number > 0)
-- ARGV[2] = burst, requests allowed at once (an integer >= 1)
-- Returns {allowed (1|0), retry_after_ms (0 when allowed), remaining}.
-- Time is the server's (TIME), so the replicas' clocks do not matter. A write after TIME needs
-- effects replication: the default since Redis 5, the only mode since 7.
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
if not rate or rate <= 0 or not burst or burst < 1 then
  return redis.error_reply('ERR gcra: bad rate or burst')
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])          -- microseconds
local interval = math.max(1, math.floor(1000000 / rate + 0.5)) -- emission interval, us
local tat = tonumber(redis.call('GET', KEYS[1]))               -- theoretical arrival time
if not tat or tat < now then tat = now end
local new_tat = tat + interval
local allow_at = new_tat - interval * burst
if now < allow_at then
  return {0, math.ceil((allow_at - now) / 1000), 0}
end
-- %d: tostring() would print 1.7e+15 and lose precision. The key expires once the bucket is
-- full again, so idle agents cost Redis nothing.
redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX', math.ceil((new_tat - now) / 1000))
return {1, 0, math.floor((now - allow_at) / interval)}
