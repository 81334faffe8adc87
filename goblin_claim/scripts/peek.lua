-- KEYS[1] claim_key: read only
-- ARGV none
-- returns GET claim_key: the holder's token (or the done marker), or nil when free
return redis.call("get", KEYS[1])
