-- KEYS[1] claim_key: deleted only while it holds ARGV[1] (the scripted GOBLIN.CAD), or
--   the at-most-once record of ARGV[1] (claim.lua): its owner gives the attempt back
-- ARGV[1] token: the owner's token
-- ARGV[2] wake (optional): "publish" or "spublish": announce the free claim on the
--   channel named claim_key, so waiters take it over at once
-- returns 1 when the claim was deleted; 0 otherwise
local held = redis.call("get", KEYS[1])
if held ~= ARGV[1] and not (held and string.match(held, "^held %d+ %d+ (.+)$") == ARGV[1]) then
  return 0
end
redis.call("del", KEYS[1])
if ARGV[2] == "publish" or ARGV[2] == "spublish" then
  redis.pcall(ARGV[2], KEYS[1], "free")  -- refused (ACL): waiters poll
end
return 1
