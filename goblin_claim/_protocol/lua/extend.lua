-- KEYS[1] claim_key: must still hold ARGV[1], or its at-most-once record (claim.lua)
-- ARGV[1] token: the owner's token
-- ARGV[2] seconds: the new lease, a positive integer, counted from now
-- returns 1 when the lease was renewed; 0 when the claim is no longer ours
-- An at-most-once record "held <deadline_ms> <claimed_ms> <token>" is renewed by
-- moving its deadline, while the deadline has not passed: once it has, the attempt
-- counts as interrupted (others were told so) and stays so. The key is kept at
-- least as long as the new lease.
local held = redis.call("get", KEYS[1])
if held == ARGV[1] then
  return redis.call("expire", KEYS[1], ARGV[2])
end
if not held or string.sub(held, 1, 5) ~= "held " then
  return 0
end
local deadline, claimed, token = string.match(held, "^held (%d+) (%d+) (.+)$")
local clock = redis.call("time")
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
if token ~= ARGV[1] or tonumber(deadline) <= now then
  return 0
end
local lease = tonumber(ARGV[2]) * 1000
local record = string.format("held %.0f %s %s", now + lease, claimed, token)
if redis.call("pttl", KEYS[1]) < lease then
  redis.call("set", KEYS[1], record, "PX", lease)
else
  redis.call("set", KEYS[1], record, "KEEPTTL")
end
return 1
