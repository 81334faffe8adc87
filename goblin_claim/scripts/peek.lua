-- KEYS[1] claim_key: read only
-- ARGV none
-- returns {holder, pttl}: what claim_key holds (the holder's token, or the done
--   marker) and the milliseconds it has left; {} when free or not a string (as
--   GOBLIN.CLAIM, which only tests the claim's existence)
local holder = redis.pcall("get", KEYS[1])
if type(holder) ~= "string" then
  return {}
end
return {holder, redis.call("pttl", KEYS[1])}
