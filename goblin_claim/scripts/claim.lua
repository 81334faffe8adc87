-- KEYS[1] claim_key: the lock; holds the owner's token while the work runs
-- KEYS[2] result_key: where the winner publishes the outcome of the work
-- KEYS[3] fence_key (optional): a counter that numbers the owners of this key
-- ARGV[1] token: stored verbatim in claim_key (the owner's identity)
-- ARGV[2] seconds: the lease, a positive integer
-- ARGV[3] fence_ttl (with KEYS[3]): seconds the counter is kept
-- returns "CLAIMED" when this token holds the claim: taken now, or already held
--   (a re-sent call); {"CLAIMED", fence} with KEYS[3];
--   otherwise GET result_key: the stored value (WRONGTYPE if not a string),
--   or, while there is none, {holder, pttl}: what claim_key holds (the owner's
--   token, or the done marker of completed work whose result is gone) and the
--   milliseconds its lease has left; {} if claim_key is not a string
local function claimed()
  if not KEYS[3] then
    return "CLAIMED"
  end
  return {"CLAIMED", tonumber(redis.call("get", KEYS[3]))}
end
if redis.call("set", KEYS[1], ARGV[1], "NX", "EX", ARGV[2]) then
  if KEYS[3] then
    -- Strictly increasing per key: the next number, or (a new or expired counter)
    -- the server clock in microseconds, which is past any number handed out before.
    local fence = tonumber(redis.call("get", KEYS[3]))
    if fence then
      fence = fence + 1
    else
      local now = redis.call("time")
      fence = now[1] * 1000000 + now[2]
    end
    redis.call("set", KEYS[3], string.format("%.0f", fence), "EX", ARGV[3])
  end
  return claimed()
end
local result = redis.call("get", KEYS[2])
if result then
  return result
end
local holder = redis.pcall("get", KEYS[1])
if holder == ARGV[1] then
  return claimed()
end
if type(holder) ~= "string" then
  return {}
end
return {holder, redis.call("pttl", KEYS[1])}
