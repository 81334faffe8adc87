-- KEYS[1] claim_key: must still hold ARGV[1]
-- ARGV[1] token: the owner's token
-- ARGV[2] seconds: the new lease, a positive integer, counted from now
-- returns 1 when the lease was renewed; 0 when the claim is no longer ours
if redis.call("get", KEYS[1]) == ARGV[1] then
  return redis.call("expire", KEYS[1], ARGV[2])
end
return 0
