-- KEYS[1] claim_key: the lock; holds the owner's token while the work runs
-- KEYS[2] result_key: where the winner publishes the outcome of the work
-- KEYS[3] fence_key (optional): a counter that numbers the owners of this key
-- ARGV[1] token: stored verbatim in claim_key (the owner's identity)
-- ARGV[2] seconds: the lease, a positive integer
-- ARGV[3] fence_ttl (with KEYS[3]): seconds the counter is kept; without KEYS[3], unused
-- ARGV[4] (optional) "wait": a WAIT follows on this connection (replicas=). A reply
--   the caller takes as success without a write here (the stored value, or a claim
--   this token holds) then rewrites what it read, unchanged (SET ... KEEPTTL), so the
--   WAIT counts the replicas that have it: WAIT only covers a connection's own writes
-- returns "CLAIMED" when this call took the claim; {"CLAIMED", fence} with KEYS[3];
--   otherwise GET result_key: the stored value (WRONGTYPE if not a string),
--   or, while there is none, {holder, pttl}, and with KEYS[3] {holder, pttl, fence}:
--   what claim_key holds (a token, ARGV[1] included, or the done marker of
--   completed work whose result is gone), the milliseconds its lease has left,
--   and the counter (false when there is none); {} if claim_key is not a string
-- KEYS[1] == KEYS[2] is the one-key record (the SDK's default layout): the key holds
--   the owner's token while the work runs, then "done <token> <value>" (the marker
--   of complete.lua, a space and the value). A token read back is in flight, not
--   a result: answered {holder, pttl} as for two keys; a record is answered whole.
-- A holder equal to ARGV[1] is not answered CLAIMED here: this token's own
-- re-sent claim and another handle given the same token look alike on the
-- server, and only the client can know which one it sent.
-- With KEYS[3], the counter (and the clock, for a new one) is read before anything
-- is written: a refusal there (a user without TIME) leaves no claim behind an error.
local counter, now = false, nil
if KEYS[3] then
  counter = tonumber(redis.call("get", KEYS[3])) or false
  if not counter then
    now = redis.call("time")
  end
end
if redis.call("set", KEYS[1], ARGV[1], "NX", "EX", ARGV[2]) then
  if not KEYS[3] then
    return "CLAIMED"
  end
  -- Strictly increasing per key: the next number, or (a new or expired counter)
  -- the server clock in microseconds, which is past any number handed out before.
  local fence
  if counter then
    fence = counter + 1
  else
    fence = now[1] * 1000000 + now[2]
  end
  redis.call("set", KEYS[3], string.format("%.0f", fence), "EX", ARGV[3])
  return {"CLAIMED", fence}
end
local result = redis.call("get", KEYS[2])
if result and KEYS[1] == KEYS[2] and string.sub(result, 1, 5) ~= "done " then
  result = false  -- the one-key record in flight: its holder's token
end
if result then
  if ARGV[4] == "wait" then
    -- The claim key is small; a result without one (a raw writer's) is rewritten itself.
    local done = redis.pcall("get", KEYS[1])
    if type(done) == "string" then
      redis.call("set", KEYS[1], done, "KEEPTTL")
    else
      redis.call("set", KEYS[2], result, "KEEPTTL")
    end
  end
  return result
end
local holder = redis.pcall("get", KEYS[1])
if type(holder) ~= "string" then
  return {}
end
if holder == ARGV[1] and ARGV[4] == "wait" then
  redis.call("set", KEYS[1], holder, "KEEPTTL")
end
-- The lease left is a hint (InFlight.retry_after): a user without PTTL still claims.
local left = redis.pcall("pttl", KEYS[1])
if type(left) ~= "number" then
  left = false
end
if not KEYS[3] then
  return {holder, left}
end
-- Three entries, so a holder that reads "CLAIMED" (a raw writer's) is never a win.
return {holder, left, counter}
