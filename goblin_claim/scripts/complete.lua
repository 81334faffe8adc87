-- KEYS[1] claim_key: must still hold ARGV[1]
-- KEYS[2] result_key: receives the value
-- ARGV[1] token: the owner's token
-- ARGV[2] value: the outcome to publish
-- ARGV[3] ttl: retention in seconds, a positive integer
-- ARGV[4] marker: what claim_key holds once the work is done (never equal to a token)
-- returns 1 when the value was stored; 0 when the claim is no longer ours (nothing written)
-- The claim is kept for ttl as well, so completed work stays completed while its result lives.
if redis.call("get", KEYS[1]) ~= ARGV[1] then
  return 0
end
-- Fail with WRONGTYPE before any write when result_key holds a non-string.
redis.call("strlen", KEYS[2])
redis.call("set", KEYS[2], ARGV[2], "EX", ARGV[3])
redis.call("set", KEYS[1], ARGV[4], "EX", ARGV[3])
return 1
