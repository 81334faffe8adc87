-- KEYS[1] claim_key: the lock; holds the owner's token while the work runs
-- KEYS[2] result_key: where the winner publishes the outcome of the work
-- KEYS[3] fence_key (optional): a counter that numbers the owners of this key
-- KEYS[#KEYS] checkpoint_key (with ARGV[6]): the last progress an owner saved
--   (checkpoint.lua); a win answers it, so the next owner resumes from there
-- ARGV[1] token: stored verbatim in claim_key (the owner's identity)
-- ARGV[2] seconds: the lease, a positive integer
-- ARGV[3] fence_ttl (with KEYS[3]): seconds the counter is kept; without KEYS[3], unused
-- ARGV[4] (optional) "wait": a WAIT follows on this connection (replicas=). A reply
--   the caller takes as success without a write here (the stored value, or a claim
--   this token holds) then rewrites what it read, unchanged (SET ... KEEPTTL), so the
--   WAIT counts the replicas that have it: WAIT only covers a connection's own writes
-- ARGV[5] (optional) at most once: the record's retention in seconds (not less than the
--   lease). A win then writes "held <deadline_ms> <claimed_ms> <token>" for that long
--   instead of the token for the lease: the deadline (server clock, ms) is the lease,
--   and once it passes without a result the attempt stays known as interrupted, so
--   nobody claims the work again until the record ends or is forgotten
-- ARGV[6] (optional) "checkpoint": the last key is the checkpoint key
-- returns "CLAIMED" when this call took the claim; {"CLAIMED", fence} with KEYS[3];
--   with ARGV[6] always {"CLAIMED", fence or false, {checkpoint} or {}};
--   otherwise GET result_key: the stored value (WRONGTYPE if not a string),
--   or, while there is none, {holder, pttl}, and with KEYS[3] {holder, pttl, fence}:
--   what claim_key holds (a token, ARGV[1] included, or the done marker of
--   completed work whose result is gone), the milliseconds its lease has left,
--   and the counter (false when there is none); {} if claim_key is not a string;
--   for an at-most-once record {token, deadline - now (ms, <= 0 once it passed), counter
--   or false, claimed_ms}: four entries, whoever asks; with ARGV[6], a claim held by
--   ARGV[1] (its own, sent again) adds a fifth, the checkpoint as a win answers it:
--   {token, ms left, counter or false, claimed_ms or false, {checkpoint} or {}}
-- KEYS[1] == KEYS[2] is the one-key record (the SDK's default layout): the key holds
--   the owner's token while the work runs, then "done <token> <value>" (the marker
--   of complete.lua, a space and the value). A token read back is in flight, not
--   a result: answered {holder, pttl} as for two keys; a record is answered whole.
-- A holder equal to ARGV[1] is not answered CLAIMED here: this token's own
-- re-sent claim and another handle given the same token look alike on the
-- server, and only the client can know which one it sent.
local checkpoint_key = ARGV[6] == "checkpoint" and KEYS[#KEYS] or nil
local fence_key = KEYS[3] ~= checkpoint_key and KEYS[3] or nil
local keep = tonumber(ARGV[5] or "")
local function ms(clock)
  return clock[1] * 1000 + math.floor(clock[2] / 1000)
end
-- deadline, claimed_ms and token of an at-most-once record; nil for anything else
local function held_parts(value)
  if string.sub(value, 1, 5) ~= "held " then
    return nil
  end
  local deadline, claimed, token = string.match(value, "^held (%d+) (%d+) (.+)$")
  return tonumber(deadline), tonumber(claimed), token
end
-- With a fence key, the counter (and the clock, for a new one) is read before anything
-- is written: a refusal there (a user without TIME) leaves no claim behind an error.
local counter, now = false, nil
if fence_key then
  counter = tonumber(redis.call("get", fence_key)) or false
  if not counter then
    now = redis.call("time")
  end
end
-- The checkpoint too: a non-string there (WRONGTYPE) fails the claim before it is written.
local saved = checkpoint_key and redis.call("get", checkpoint_key) or false
local record, expiry = ARGV[1], ARGV[2]
if keep then
  now = now or redis.call("time")
  local at = ms(now)
  record = string.format("held %.0f %.0f %s", at + tonumber(ARGV[2]) * 1000, at, ARGV[1])
  expiry = ARGV[5]
end
if redis.call("set", KEYS[1], record, "NX", "EX", expiry) then
  -- Strictly increasing per key: the next number, or (a new or expired counter)
  -- the server clock in microseconds, which is past any number handed out before.
  local fence = false
  if fence_key then
    if counter then
      fence = counter + 1
    else
      fence = now[1] * 1000000 + now[2]
    end
    redis.call("set", fence_key, string.format("%.0f", fence), "EX", ARGV[3])
  end
  if checkpoint_key then
    return {"CLAIMED", fence, saved and {saved} or {}}
  end
  if not fence_key then
    return "CLAIMED"
  end
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
local deadline, claimed, token = held_parts(holder)
if (token or holder) == ARGV[1] and ARGV[4] == "wait" then
  redis.call("set", KEYS[1], holder, "KEEPTTL")
end
if checkpoint_key and (token or holder) == ARGV[1] then
  -- This token's claim: if it is this handle's own, sent again after a lost reply, the
  -- handle resumes from the checkpoint, so the reply carries it as a win's does.
  local left = deadline and deadline - ms(now or redis.call("time")) or redis.pcall("pttl", KEYS[1])
  if type(left) ~= "number" then
    left = false
  end
  return {token or holder, left, counter, claimed or false, saved and {saved} or {}}
end
if deadline then
  return {token, deadline - ms(now or redis.call("time")), counter, claimed}
end
-- The lease left is a hint (InFlight.retry_after): a user without PTTL still claims.
local left = redis.pcall("pttl", KEYS[1])
if type(left) ~= "number" then
  left = false
end
if not fence_key then
  return {holder, left}
end
-- Three entries, so a holder that reads "CLAIMED" (a raw writer's) is never a win.
return {holder, left, counter}
