-- KEYS[1] claim_key: must hold ARGV[1] or this token's done marker
-- KEYS[2] result_key: receives the value
-- KEYS[3] fence_key (optional): the counter claim.lua numbers the owners with
-- KEYS[#KEYS] checkpoint_key (with ARGV[8]): deleted once the value is stored
-- ARGV[1] token: the owner's token
-- ARGV[2] value: the outcome to publish
-- ARGV[3] ttl: retention in seconds, a positive integer
-- ARGV[4] marker: what claim_key holds once the work is done (never equal to a token)
-- ARGV[5] wake: "publish" or "spublish" (a cluster's sharded channel) announces on
--   the channel named claim_key, so waiters learn of it at once; anything else does not.
--   A refused announcement (an ACL without it) is ignored: the reply is still 1
-- ARGV[6] fence (with KEYS[3]): the fence this owner was given; "" when unknown
-- ARGV[7] (optional) "wait": a WAIT follows on this connection (replicas=). A refusal
--   then writes too, changing nothing (claim_key rewritten unchanged, or set and
--   deleted when empty), so the WAIT counts the replicas that have this node's
--   latest state: behind a write-less reply it would count every replica still
--   linked, and a node cut off from them (or deposed) could not be told apart
-- ARGV[8] (optional) "checkpoint": the last key is the checkpoint key
-- returns 1 when the value is stored: written now, or already written by this
--   token (a re-sent call); {0, holder} when another owner holds or completed the
--   claim (holder: what claim_key holds, false when it is empty), or
--   (KEYS[3]) the counter numbered an owner after this one; 2 when this token
--   already completed it with another value; 3 when claim_key is empty (the lease
--   lapsed, or the claim was released or forgotten) and nothing proves that
--   nobody claimed it since: always without KEYS[3] (GOBLIN.CLAIM and release
--   leave no trace), and with it when the counter is gone or the fence unknown
-- Nothing is written unless the reply is 1. Safe to send twice. The claim is kept
-- for ttl too, so completed work stays completed while its result lives.
-- KEYS[1] == KEYS[2] is the one-key record (claim.lua): the token becomes
--   "<marker> <value>" for ttl, and the replies are the same. With KEYS[3] the
--   counter is deleted once the record is written: while the record lives nobody
--   can claim, and after it the clock numbers the next owner (claim.lua). An
--   at-most-once record of this token ("held <deadline> <claimed> <token>") is this
--   token's to complete, its deadline passed or not: nobody can have claimed it since.
local checkpoint_key = ARGV[8] == "checkpoint" and KEYS[#KEYS] or nil
local fence_key = KEYS[3] ~= checkpoint_key and KEYS[3] or nil
local wake = ARGV[5] == "publish" or ARGV[5] == "spublish"
-- A refusal (0, 2 or 3), made provable by a WAIT behind it (ARGV[7]); held: claim_key's value.
local function refuse(code, held)
  if ARGV[7] == "wait" then
    if held then
      redis.call("set", KEYS[1], held, "KEEPTTL")
    else
      redis.call("set", KEYS[1], "", "PX", 1)
      redis.call("del", KEYS[1])
    end
  end
  if code == 0 then
    return {0, held or false}
  end
  return code
end
-- For a claim held by this token, or empty: the fence (where there is one) decides
-- whose claim this was, and an empty claim with no fence to show for it is not ours.
-- Returns the refusal (0 or 3), or nil when the claim is this token's to complete.
local function refused(held)
  local counter = fence_key and tonumber(redis.call("get", fence_key))
  local fence = fence_key and tonumber(ARGV[6])
  if counter and fence and counter ~= fence then
    return 0
  end
  if not held and not (counter and fence) then
    return 3
  end
  return nil
end
if KEYS[1] == KEYS[2] then
  local raw = redis.call("get", KEYS[1])
  local held = raw
  local mine = ARGV[4] .. " "
  if held and string.match(held, "^held %d+ %d+ (.+)$") == ARGV[1] then
    held = ARGV[1]  -- this token's at-most-once attempt
  end
  if held and held ~= ARGV[1] then
    if string.sub(held, 1, #mine) ~= mine then
      return refuse(0, held)  -- another token holds it, or another owner's record
    end
    if string.sub(held, #mine + 1) == ARGV[2] then
      redis.call("set", KEYS[1], held, "KEEPTTL")  -- re-sent: rewritten unchanged for a WAIT
      return 1
    end
    return refuse(2, held)
  end
  local refusal = refused(held)
  if refusal then
    return refuse(refusal, raw)
  end
  redis.call("set", KEYS[1], mine .. ARGV[2], "EX", ARGV[3])
  if fence_key then
    redis.call("del", fence_key)
  end
  if checkpoint_key then
    redis.call("del", checkpoint_key)
  end
  if wake then
    redis.pcall(ARGV[5], KEYS[1], "done")
  end
  return 1
end
local holder = redis.call("get", KEYS[1])
if holder ~= ARGV[1] and holder ~= ARGV[4] and holder then
  return refuse(0, holder)
end
-- GET fails with WRONGTYPE, before any write, when result_key holds a non-string.
local stored = redis.call("get", KEYS[2])
if holder == ARGV[4] and stored then
  if stored == ARGV[2] then
    -- A re-sent complete, perhaps on a new connection: rewrite the marker unchanged
    -- so a WAIT behind this (replicas=) counts the replicas that have the result.
    redis.call("set", KEYS[1], holder, "KEEPTTL")
    return 1
  end
  return refuse(2, holder)
end
if not holder and stored then
  return refuse(0, holder)
end
if holder ~= ARGV[4] then
  local refusal = refused(holder)
  if refusal then
    return refuse(refusal, holder)
  end
end
redis.call("set", KEYS[2], ARGV[2], "EX", ARGV[3])
redis.call("set", KEYS[1], ARGV[4], "EX", ARGV[3])
if wake then
  -- pcall: the writes above are done and stay (scripts are not rolled back); a
  -- user without pub/sub must still be told so. Waiters then find it by polling.
  redis.pcall(ARGV[5], KEYS[1], "done")
end
return 1
