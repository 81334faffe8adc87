-- KEYS[1] claim_key: deleted only while it holds ARGV[1] (the scripted GOBLIN.CAD)
-- ARGV[1] token: the owner's token
-- ARGV[2] wake (optional): "publish" or "spublish": announce the free claim on the
--   channel named claim_key, so waiters take it over at once
-- returns 1 when the claim was deleted; 0 otherwise
if redis.call("get", KEYS[1]) == ARGV[1] then
  redis.call("del", KEYS[1])
  if ARGV[2] == "publish" or ARGV[2] == "spublish" then
    redis.pcall(ARGV[2], KEYS[1], "free")  -- refused (ACL): waiters poll
  end
  return 1
end
return 0
