-- KEYS[1] claim_key: deleted, whoever holds it
-- KEYS[2] result_key: deleted
-- KEYS[3] checkpoint_key (optional): deleted
-- ARGV[1] wake (optional): "publish" or "spublish": announce it on the channel
--   named claim_key, so waiters claim the work at once
-- returns how many of the keys existed (0 when there was nothing to forget)
local deleted = redis.call("del", unpack(KEYS))
if deleted > 0 and (ARGV[1] == "publish" or ARGV[1] == "spublish") then
  redis.pcall(ARGV[1], KEYS[1], "free")  -- refused (ACL): waiters poll
end
return deleted
