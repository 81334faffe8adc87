-- KEYS[1] claim_key: must hold ARGV[1], this token's done marker, or nothing
-- KEYS[2] result_key: receives the value
-- ARGV[1] token: the owner's token
-- ARGV[2] value: the outcome to publish
-- ARGV[3] ttl: retention in seconds, a positive integer
-- ARGV[4] marker: what claim_key holds once the work is done (never equal to a token)
-- ARGV[5] wake (optional): "publish" or "spublish" (a cluster's sharded channel):
--   announce on the channel named claim_key, so waiters learn of it at once
-- returns 1 when the value is stored: written now, or already written by this
--   token (a re-sent call); 0 when another token holds or completed the claim;
--   2 when this token already completed it with another value (nothing written)
-- Safe to send twice. A lapsed lease that nobody claimed since is still this
-- token's to complete. The claim is kept for ttl too, so completed work stays
-- completed while its result lives.
local holder = redis.call("get", KEYS[1])
if holder ~= ARGV[1] and holder ~= ARGV[4] and holder then
  return 0
end
-- GET fails with WRONGTYPE, before any write, when result_key holds a non-string.
local stored = redis.call("get", KEYS[2])
if holder == ARGV[4] and stored then
  if stored == ARGV[2] then
    return 1
  end
  return 2
end
if not holder and stored then
  return 0
end
redis.call("set", KEYS[2], ARGV[2], "EX", ARGV[3])
redis.call("set", KEYS[1], ARGV[4], "EX", ARGV[3])
if ARGV[5] == "publish" or ARGV[5] == "spublish" then
  redis.call(ARGV[5], KEYS[1], "done")
end
return 1
