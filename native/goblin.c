/*
 * goblin: the reference Redis module for the goblin-claim protocol.
 *
 *   GOBLIN.CLAIM claim_key result_key token seconds
 *       SET claim_key token NX EX seconds; if that set the key, reply "CLAIMED",
 *       otherwise reply GET result_key (a value, nil, or WRONGTYPE).
 *   GOBLIN.CAD key value
 *       Delete key only while it holds value; reply 1 or 0 (compare-and-delete).
 *
 * The contract is the protocol's source document (shared/seeds/000_*.txt): the
 * replies of its table, SET's errors for a bad seconds (checked before NX, so
 * also when the claim is held), NX testing existence only (any type fails the
 * claim), and the fall-through read being a plain GET.
 *
 * Only the low-level key API is used: no call back into the command processor
 * (RedisModule_Call). Effects are replicated (and written to the AOF) as plain
 * commands, SET key token PXAT <absolute ms> and DEL key, so replicas and AOF
 * loaders need no module: exactly what Redis 7 propagates for the scripted form.
 *
 * Build: `make native` (fetches redismodule.h at build time; see the Makefile).
 * Load:  redis-server --loadmodule /path/to/goblin.so   (or `loadmodule` in redis.conf)
 */

/* RedisModule_NotifyKeyspaceEvent is still marked experimental in older headers. */
#define REDISMODULE_EXPERIMENTAL_API
#include "redismodule.h"

#include <limits.h>
#include <string.h>

#define CLAIMED "CLAIMED"
#define ERR_NOT_INTEGER "ERR value is not an integer or out of range"
#define ERR_EXPIRE "ERR invalid expire time in 'goblin.claim' command"

/*
 * The absolute expiry (ms since the epoch) of a lease of `arg` seconds, as
 * SET ... EX checks it: an integer in Redis's strict form (no sign, spaces or
 * leading zeros: what RedisModule_StringToLongLong accepts), positive, and
 * small enough that now + seconds * 1000 fits a long long. On a bad value the
 * error is replied and REDISMODULE_ERR returned.
 */
static int expiry_or_reply(RedisModuleCtx *ctx, RedisModuleString *arg, long long *expire_at) {
    long long seconds;
    if (RedisModule_StringToLongLong(arg, &seconds) != REDISMODULE_OK) {
        RedisModule_ReplyWithError(ctx, ERR_NOT_INTEGER);
        return REDISMODULE_ERR;
    }
    long long now = RedisModule_Milliseconds();
    /* Checked without overflowing: seconds * 1000 + now <= LLONG_MAX. */
    if (seconds <= 0 || seconds > LLONG_MAX / 1000 || seconds * 1000 > LLONG_MAX - now) {
        RedisModule_ReplyWithError(ctx, ERR_EXPIRE);
        return REDISMODULE_ERR;
    }
    *expire_at = now + seconds * 1000;
    return REDISMODULE_OK;
}

/* Whether `name` exists (of any type), after lazy expiry: what NX tests. */
static int exists(RedisModuleCtx *ctx, RedisModuleString *name) {
    /* Opened for reading: closing a key opened for writing would signal it as
     * modified (breaking a WATCH) even when nothing was written. */
    RedisModuleKey *key = RedisModule_OpenKey(ctx, name, REDISMODULE_READ);
    int found = RedisModule_KeyType(key) != REDISMODULE_KEYTYPE_EMPTY;
    RedisModule_CloseKey(key);
    return found;
}

/* GOBLIN.CLAIM claim_key result_key token seconds */
static int claim_command(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 5) return RedisModule_WrongArity(ctx);
    long long expire_at;
    /* SET checks its expiry before NX: a bad seconds fails even when the claim is held. */
    if (expiry_or_reply(ctx, argv[4], &expire_at) != REDISMODULE_OK) return REDISMODULE_OK;

    if (!exists(ctx, argv[1])) {
        RedisModuleKey *claim = RedisModule_OpenKey(ctx, argv[1], REDISMODULE_WRITE);
        RedisModule_StringSet(claim, argv[3]);
        RedisModule_SetAbsExpire(claim, expire_at);
        RedisModule_CloseKey(claim);
        /* As SET ... EX is propagated since Redis 7: an absolute expiry, so a
         * replica or an AOF reload expires the claim at the same instant. */
        RedisModule_Replicate(ctx, "SET", "sscl", argv[1], argv[3], "PXAT", expire_at);
        RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_STRING, "set", argv[1]);
        RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_GENERIC, "expire", argv[1]);
        return RedisModule_ReplyWithStringBuffer(ctx, CLAIMED, strlen(CLAIMED));
    }

    /* Held: the reply is GET result_key (result_key may be claim_key itself). */
    RedisModuleKey *result = RedisModule_OpenKey(ctx, argv[2], REDISMODULE_READ);
    switch (RedisModule_KeyType(result)) {
    case REDISMODULE_KEYTYPE_EMPTY:
        RedisModule_ReplyWithNull(ctx);
        break;
    case REDISMODULE_KEYTYPE_STRING: {
        /* The one way to read a string through the key API. For a value stored
         * compact (embstr, int) Redis converts it to a plain string once, in
         * place: same value, same TTL, nothing propagated. */
        size_t len;
        const char *value = RedisModule_StringDMA(result, &len, REDISMODULE_READ);
        RedisModule_ReplyWithStringBuffer(ctx, value, len);
        break;
    }
    default:
        RedisModule_ReplyWithError(ctx, REDISMODULE_ERRORMSG_WRONGTYPE);
        break;
    }
    RedisModule_CloseKey(result);
    return REDISMODULE_OK;
}

/* GOBLIN.CAD key value */
static int cad_command(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    if (argc != 3) return RedisModule_WrongArity(ctx);
    RedisModuleKey *key = RedisModule_OpenKey(ctx, argv[1], REDISMODULE_READ);
    int type = RedisModule_KeyType(key);
    if (type == REDISMODULE_KEYTYPE_EMPTY) {
        RedisModule_CloseKey(key);
        return RedisModule_ReplyWithLongLong(ctx, 0);
    }
    if (type != REDISMODULE_KEYTYPE_STRING) {
        /* As the scripted form's GET does. */
        RedisModule_CloseKey(key);
        return RedisModule_ReplyWithError(ctx, REDISMODULE_ERRORMSG_WRONGTYPE);
    }
    size_t held_len, want_len;
    const char *held = RedisModule_StringDMA(key, &held_len, REDISMODULE_READ);
    const char *want = RedisModule_StringPtrLen(argv[2], &want_len);
    int match = held_len == want_len && memcmp(held, want, held_len) == 0;
    RedisModule_CloseKey(key);
    if (!match) return RedisModule_ReplyWithLongLong(ctx, 0);

    key = RedisModule_OpenKey(ctx, argv[1], REDISMODULE_WRITE);
    RedisModule_DeleteKey(key);
    RedisModule_CloseKey(key);
    RedisModule_Replicate(ctx, "DEL", "s", argv[1]);
    RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_GENERIC, "del", argv[1]);
    return RedisModule_ReplyWithLongLong(ctx, 1);
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    if (RedisModule_Init(ctx, "goblin", 1, REDISMODULE_APIVER_1) == REDISMODULE_ERR) return REDISMODULE_ERR;
    /* Keys declared as (first, last, step) so cluster clients route the commands
     * and ACL key patterns apply to them. */
    if (RedisModule_CreateCommand(ctx, "goblin.claim", claim_command, "write deny-oom", 1, 2, 1) == REDISMODULE_ERR)
        return REDISMODULE_ERR;
    if (RedisModule_CreateCommand(ctx, "goblin.cad", cad_command, "write fast", 1, 1, 1) == REDISMODULE_ERR)
        return REDISMODULE_ERR;
    return REDISMODULE_OK;
}
