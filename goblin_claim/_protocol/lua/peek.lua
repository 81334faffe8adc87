-- KEYS[1] claim_key, KEYS[2] result_key: read only (one key, the record, as in claim.lua)
-- ARGV none
-- returns what claim.lua answers when it does not claim: the stored value
--   (WRONGTYPE if result_key is not a string), or, while there is none,
--   {holder, pttl}: what claim_key holds (the holder's token, or the done marker
--   of completed work whose result is gone) and the milliseconds it has left;
--   for an at-most-once record {token, deadline - now (ms), false, claimed_ms};
--   {} when claim_key is free or not a string (as GOBLIN.CLAIM, which only tests
--   the claim's existence). Read after GOBLIN.CLAIM's nil, it also sees work
--   completed in between, as completed and not as a lost result.
local result = redis.call("get", KEYS[2])
if result and KEYS[1] == KEYS[2] and string.sub(result, 1, 5) ~= "done " then
  result = false  -- the one-key record in flight (claim.lua): its holder's token
end
if result then
  return result
end
local holder = redis.pcall("get", KEYS[1])
if type(holder) ~= "string" then
  return {}
end
local deadline, claimed, token = string.match(holder, "^held (%d+) (%d+) (.+)$")
if deadline then
  local clock = redis.call("time")
  return {token, tonumber(deadline) - (clock[1] * 1000 + math.floor(clock[2] / 1000)), false, tonumber(claimed)}
end
-- The lease left is a hint: a user without PTTL still reads.
local left = redis.pcall("pttl", KEYS[1])
if type(left) ~= "number" then
  left = false
end
return {holder, left}
