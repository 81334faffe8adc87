-- KEYS[1] claim_key: deleted, whoever holds it
-- KEYS[2] result_key: deleted
-- ARGV none
-- returns how many of the two keys existed (0 when there was nothing to forget)
return redis.call("del", KEYS[1], KEYS[2])
