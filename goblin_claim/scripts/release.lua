-- KEYS[1] claim_key: deleted only while it holds ARGV[1] (the scripted GOBLIN.CAD)
-- ARGV[1] token: the owner's token
-- returns 1 when the claim was deleted; 0 otherwise
if redis.call("get", KEYS[1]) == ARGV[1] then
  return redis.call("del", KEYS[1])
end
return 0
