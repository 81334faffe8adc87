-- KEYS[1] claim_key: must hold ARGV[1], or its at-most-once record within its deadline
-- KEYS[2] checkpoint_key: receives the progress, for the next owner's claim (claim.lua)
-- KEYS[3] fence_key (optional): the counter claim.lua numbers the owners with
-- ARGV[1] token: the owner's token
-- ARGV[2] value: the progress to keep
-- ARGV[3] ttl: seconds it is kept, a positive integer (the record's retention)
-- ARGV[4] fence (with KEYS[3]): the fence this owner was given; "" when unknown
-- returns 1 when it is stored; 0 when this token does not hold the claim (its lease
--   lapsed, it was taken over, released, forgotten or completed) or the counter
--   numbered an owner after this one. Nothing is written unless the reply is 1, so a
--   stale owner never overwrites a later owner's progress. Safe to send twice.
local held = redis.call("get", KEYS[1])
if held ~= ARGV[1] then
  if not held or string.sub(held, 1, 5) ~= "held " then
    return 0
  end
  local deadline, token = string.match(held, "^held (%d+) %d+ (.+)$")
  local clock = redis.call("time")
  if token ~= ARGV[1] or tonumber(deadline) <= clock[1] * 1000 + math.floor(clock[2] / 1000) then
    return 0
  end
end
if KEYS[3] then
  local counter = tonumber(redis.call("get", KEYS[3]))
  local fence = tonumber(ARGV[4])
  if counter and fence and counter ~= fence then
    return 0
  end
end
redis.call("set", KEYS[2], ARGV[2], "EX", ARGV[3])
return 1
