-- KEYS[1] claim_key: the lock; holds the owner's token while the work runs
-- KEYS[2] result_key: where the winner publishes the outcome of the work
-- ARGV[1] token: stored verbatim in claim_key (the owner's identity)
-- ARGV[2] seconds: the lease, a positive integer
-- returns "CLAIMED" when this call took the claim; otherwise GET result_key:
--   the stored value, or nil while the work is in flight (WRONGTYPE if not a string)
if redis.call("set", KEYS[1], ARGV[1], "NX", "EX", ARGV[2]) then
  return "CLAIMED"
end
return redis.call("get", KEYS[2])
