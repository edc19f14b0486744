/* idem_redis.c: the shared idempotency store: hiredis async on the worker's loop, lock-or-read and settle as Lua scripts in Redis, reconnect with jittered backoff. */
#include "idem_store.h"
#include "backoff.h"
#include "log.h"

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <openssl/sha.h>
#include <stdio.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
#include <hiredis/adapters/libevent.h>
#pragma GCC diagnostic pop

#define RECONNECT_MIN_MS 100
#define RECONNECT_MAX_MS 5000
#define KEY_PREFIX "ricochet:idem:"

/* KEYS[1] the record; ARGV[1] our lock, ARGV[2] its TTL (ms). The live
 * record, or 0 when ours was written: one atomic step for every gateway. */
static const char claim_lua[] =
    "local v = redis.call('GET', KEYS[1])\n"
    "if v then return v end\n"
    "redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])\n"
    "return 0\n";

/* KEYS[1] the record; ARGV[1] our token, ARGV[2] the record to keep ("":
 * remove it), ARGV[3] its TTL. Only the request that holds the lock
 * settles it. */
static const char settle_lua[] =
    "local v = redis.call('GET', KEYS[1])\n"
    "if not v or string.sub(v, 42, 57) ~= ARGV[1] then return 0 end\n"
    "if ARGV[2] == '' then redis.call('DEL', KEYS[1])\n"
    "else redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end\n"
    "return 1\n";

typedef enum { REDIS_DOWN = 0, REDIS_CONNECTING, REDIS_UP } redis_state_t;

typedef struct {
    ric_idem_store_t base;
    struct event_base *ev;
    redisAsyncContext *ac;
    redis_state_t state;
    struct event *retry_timer;   /* the next connect */
    struct event *connect_timer; /* a connect that takes too long */
    int64_t retry_ms;            /* the current backoff window */
    int failures;                /* connects failed in a row (logged once) */
    int inflight;                /* commands sent and not answered */
    int stalled;                 /* claims in a row that timed out */
    int closing;                 /* the worker exits: answers are awaited, then no reconnect */
    char claim_sha[41], settle_sha[41];
} redis_store_t;

/* A command in flight: it outlives a request that gave up on it. */
typedef struct {
    redis_store_t *s;
    ric_idem_op_t *op; /* NULL: nobody waits (a settle, or a claim given up) */
    int claim;
    int fell_back;     /* EVAL sent after NOSCRIPT */
    char key[sizeof(KEY_PREFIX) + 2 * RIC_IDEM_KEY_LEN];
    u_char *arg;       /* the claim's lock or the settle's record (owned) */
    size_t arg_len;
    char token[RIC_IDEM_TOKEN_LEN];
    long long ttl_ms;
} pending_t;

static void connect_now(redis_store_t *s);

static void
sha1_hex(const char *text, char *out)
{
    u_char d[SHA_DIGEST_LENGTH];
    int i;

    SHA1((const u_char *) text, strlen(text), d);
    for (i = 0; i < SHA_DIGEST_LENGTH; i++) {
        snprintf(out + 2 * i, 3, "%02x", d[i]);
    }
}

static void
schedule_reconnect(redis_store_t *s)
{
    struct timeval tv;
    int64_t ms;

    s->state = REDIS_DOWN;
    s->ac = NULL;
    event_del(s->connect_timer);
    /* jittered over [window/2, window): gateways that lost one Redis
     * together do not come back in a herd */
    ms = s->retry_ms / 2 + (int64_t) (ric_backoff_rand(NULL) % (uint64_t) (s->retry_ms / 2 + 1));
    s->retry_ms = ric_min(s->retry_ms * 2, (int64_t) RECONNECT_MAX_MS);
    tv = ric_ms_to_tv(ms);
    event_add(s->retry_timer, &tv);
}

static void
on_connect(const redisAsyncContext *ac, int status)
{
    redis_store_t *s = ac->data;

    if (status != REDIS_OK) {
        ric_log_error(s->failures++ == 0 ? RIC_LOG_ERR : RIC_LOG_INFO, 0,
                      "idempotency store \"%s\": cannot connect: %s (retrying)",
                      s->base.conf->spec, ac->errstr);
        schedule_reconnect(s); /* hiredis frees ac after this */
        return;
    }
    event_del(s->connect_timer);
    if (s->failures > 0) {
        ric_log_error(RIC_LOG_NOTICE, 0, "idempotency store \"%s\": connected again",
                      s->base.conf->spec);
    }
    s->failures = 0;
    s->state = REDIS_UP;
    s->retry_ms = RECONNECT_MIN_MS;
}

static void
on_disconnect(const redisAsyncContext *ac, int status)
{
    redis_store_t *s = ac->data;

    if (s == NULL) {
        return; /* freed while closing */
    }
    if (s->closing) {
        s->ac = NULL;
        event_base_loopbreak(s->ev); /* every answer is in */
        return;
    }
    if (status != REDIS_OK) {
        ric_log_error(s->failures++ == 0 ? RIC_LOG_ERR : RIC_LOG_INFO, 0,
                      "idempotency store \"%s\": connection lost: %s (reconnecting)",
                      s->base.conf->spec, ac->errstr);
    }
    schedule_reconnect(s);
}

/* Gives up on the connection (a connect or answers that do not come):
 * its pending commands fail now, and the next connect is scheduled. */
static void
drop_connection(redis_store_t *s)
{
    redisAsyncContext *ac = s->ac;

    if (ac == NULL) {
        return;
    }
    ac->data = NULL; /* its disconnect callback is ours to skip */
    s->ac = NULL;
    redisAsyncFree(ac);
    schedule_reconnect(s);
}

static void
on_retry(evutil_socket_t fd, short what, void *arg)
{
    (void) fd;
    (void) what;
    connect_now(arg);
}

static void
on_connect_timeout(evutil_socket_t fd, short what, void *arg)
{
    redis_store_t *s = arg;

    (void) fd;
    (void) what;
    if (s->state == REDIS_CONNECTING && s->ac != NULL) {
        ric_log_error(s->failures++ == 0 ? RIC_LOG_ERR : RIC_LOG_INFO, 0,
                      "idempotency store \"%s\": connect timed out (retrying)",
                      s->base.conf->spec);
        drop_connection(s);
    }
}

static void
connect_now(redis_store_t *s)
{
    redisAsyncContext *ac;
    struct timeval tv;

    ac = redisAsyncConnect(s->base.conf->addr, s->base.conf->port);
    if (ac == NULL || ac->err) {
        ric_log_error(s->failures++ == 0 ? RIC_LOG_ERR : RIC_LOG_INFO, 0,
                      "idempotency store \"%s\": cannot connect: %s (retrying)",
                      s->base.conf->spec, ac ? ac->errstr : "out of memory");
        if (ac != NULL) {
            redisAsyncFree(ac);
        }
        schedule_reconnect(s);
        return;
    }
    ac->data = s;
    redisLibeventAttach(ac, s->ev);
    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);
    s->ac = ac;
    s->state = REDIS_CONNECTING;
    /* queued behind the connect, in order: every later command finds the
     * scripts loaded and the database selected */
    if (s->base.conf->db != 0) {
        redisAsyncCommand(ac, NULL, NULL, "SELECT %d", s->base.conf->db);
    }
    redisAsyncCommand(ac, NULL, NULL, "SCRIPT LOAD %s", claim_lua);
    redisAsyncCommand(ac, NULL, NULL, "SCRIPT LOAD %s", settle_lua);
    tv = ric_ms_to_tv(RIC_IDEM_STORE_TIMEOUT_MS);
    event_add(s->connect_timer, &tv);
}

ric_idem_store_t *
ric_idem_redis_open(ric_idem_store_conf_t *sc, struct event_base *base)
{
    redis_store_t *s = ric_xcalloc(1, sizeof(*s));

    s->base.kind = RIC_IDEM_STORE_REDIS;
    s->base.conf = sc;
    s->ev = base;
    s->retry_ms = RECONNECT_MIN_MS;
    s->retry_timer = evtimer_new(base, on_retry, s);
    s->connect_timer = evtimer_new(base, on_connect_timeout, s);
    sha1_hex(claim_lua, s->claim_sha);
    sha1_hex(settle_lua, s->settle_sha);
    connect_now(s);
    return &s->base;
}

static void
on_close_timeout(evutil_socket_t fd, short what, void *arg)
{
    redis_store_t *s = arg;

    (void) fd;
    (void) what;
    event_base_loopbreak(s->ev);
}

void
ric_idem_redis_close(ric_idem_store_t *base)
{
    redis_store_t *s = (redis_store_t *) base;
    struct event *limit;
    struct timeval tv;

    if (s->ac != NULL && s->state == REDIS_UP && s->inflight > 0) {
        /* the last answers' settles must land, or their keys would stay
         * locked until idempotency_lock_ttl: wait for them, briefly */
        s->closing = 1;
        event_del(s->retry_timer);
        redisAsyncDisconnect(s->ac); /* after the pending replies */
        limit = evtimer_new(s->ev, on_close_timeout, s);
        tv = ric_ms_to_tv(RIC_IDEM_STORE_TIMEOUT_MS);
        event_add(limit, &tv);
        event_base_dispatch(s->ev);
        event_free(limit);
    }
    if (s->ac != NULL) {
        s->ac->data = NULL;
        redisAsyncFree(s->ac); /* pending callbacks run now, with no reply */
    }
    event_free(s->retry_timer);
    event_free(s->connect_timer);
    free(s);
}

static void pending_free(pending_t *p);

#define STALLED_MAX 3 /* claims in a row without an answer: the connection is dropped */

static void
claim_over(ric_idem_op_t *op, int rc)
{
    event_free(op->timer);
    op->timer = NULL;
    op->pending = NULL;
    op->rc = rc;
    op->done(op);
}

static int send_command(pending_t *p);
static void release_abandoned(const pending_t *claim);

static void
on_reply(redisAsyncContext *ac, void *reply_, void *privdata)
{
    redisReply *reply = reply_;
    pending_t *p = privdata;
    ric_idem_op_t *op = p->op;
    int rc = RIC_ERROR;

    (void) ac;
    if (reply != NULL && reply->type == REDIS_REPLY_ERROR && !p->fell_back
        && strncmp(reply->str, "NOSCRIPT", 8) == 0 && p->s->ac != NULL) {
        p->fell_back = 1; /* flushed since we loaded it: EVAL loads it again */
        if (send_command(p) == RIC_OK) {
            return;
        }
    }
    if (!p->claim) {
        if (reply == NULL || reply->type == REDIS_REPLY_ERROR) {
            ric_log_error(RIC_LOG_ERR, 0, "idempotency store \"%s\": settling a key failed: %s",
                          p->s->base.conf->spec,
                          reply ? reply->str : "the connection was lost");
        }
        pending_free(p);
        return;
    }
    if (reply != NULL) {
        p->s->stalled = 0;
    }
    if (op == NULL) {
        if (reply != NULL && reply->type == REDIS_REPLY_INTEGER) {
            release_abandoned(p); /* it took the lock for nobody: let it go */
        }
        pending_free(p); /* its request gave up on it */
        return;
    }
    if (reply == NULL) {
        snprintf(op->error, sizeof(op->error), "the connection to Redis was lost");
    } else if (reply->type == REDIS_REPLY_INTEGER) {
        rc = RIC_IDEM_CLAIMED;
    } else if (reply->type == REDIS_REPLY_STRING && reply->len >= RIC_IDEM_REC_HEAD) {
        ric_buf_put(&op->found, reply->str, reply->len);
        rc = RIC_IDEM_FOUND;
    } else {
        snprintf(op->error, sizeof(op->error), "Redis answered: %.150s",
                 reply->type == REDIS_REPLY_ERROR ? reply->str : "an unexpected reply");
    }
    pending_free(p);
    claim_over(op, rc);
}

static int
send_command(pending_t *p)
{
    redis_store_t *s = p->s;
    const char *argv[7];
    size_t len[7];
    char ttl[24];
    int n = 0, rc;

    /* argv, not a format: nothing to parse on the hot path */
    argv[n] = p->fell_back ? "EVAL" : "EVALSHA";
    len[n] = strlen(argv[n]);
    n++;
    argv[n] = p->claim ? (p->fell_back ? claim_lua : s->claim_sha)
                       : (p->fell_back ? settle_lua : s->settle_sha);
    len[n] = strlen(argv[n]);
    n++;
    argv[n] = "1";
    len[n++] = 1;
    argv[n] = p->key;
    len[n++] = sizeof(p->key) - 1;
    if (!p->claim) {
        argv[n] = p->token;
        len[n++] = RIC_IDEM_TOKEN_LEN;
    }
    argv[n] = p->arg ? (const char *) p->arg : "";
    len[n++] = p->arg_len;
    len[n] = (size_t) snprintf(ttl, sizeof(ttl), "%lld", p->ttl_ms);
    argv[n++] = ttl;
    rc = redisAsyncCommandArgv(s->ac, on_reply, p, n, argv, len);
    return rc == REDIS_OK ? RIC_OK : RIC_ERROR;
}

static void
pending_free(pending_t *p)
{
    p->s->inflight--;
    free(p->arg);
    free(p);
}

static pending_t *
pending_new(redis_store_t *s, const u_char *key, const u_char *arg, size_t len, int64_t ttl_ms)
{
    static const char hex[] = "0123456789abcdef";
    pending_t *p = ric_xmalloc(sizeof(*p));
    char *k = p->key + sizeof(KEY_PREFIX) - 1;
    int i;

    memset(p, 0, offsetof(pending_t, key));
    p->s = s;
    s->inflight++;
    memcpy(p->key, KEY_PREFIX, sizeof(KEY_PREFIX) - 1);
    for (i = 0; i < RIC_IDEM_KEY_LEN; i++) {
        k[2 * i] = hex[key[i] >> 4];
        k[2 * i + 1] = hex[key[i] & 15];
    }
    k[2 * RIC_IDEM_KEY_LEN] = '\0';
    p->arg = NULL;
    p->arg_len = 0;
    if (arg != NULL) {
        p->arg = ric_xmalloc(len ? len : 1);
        memcpy(p->arg, arg, len);
        p->arg_len = len;
    }
    p->ttl_ms = (long long) ric_max(ttl_ms, (int64_t) 1);
    return p;
}

static void
cancel_claim(ric_async_t *a)
{
    ric_idem_op_t *op = a->data;
    pending_t *p = op->pending;

    if (p != NULL) {
        p->op = NULL; /* the reply, when it comes, finds nobody */
    }
    op->pending = NULL;
    if (op->timer != NULL) {
        event_free(op->timer);
        op->timer = NULL;
    }
}

static void
on_claim_timeout(evutil_socket_t fd, short what, void *arg)
{
    ric_idem_op_t *op = arg;
    redis_store_t *s;

    (void) fd;
    (void) what;
    if (op->pending != NULL) {
        ((pending_t *) op->pending)->op = NULL;
    }
    snprintf(op->error, sizeof(op->error), "Redis did not answer within %d ms",
             RIC_IDEM_STORE_TIMEOUT_MS);
    s = ((redis_store_t *) op->store);
    claim_over(op, RIC_ERROR);
    if (++s->stalled >= STALLED_MAX && s->ac != NULL) {
        ric_log_error(RIC_LOG_ERR, 0, "idempotency store \"%s\": %d answers in a row did not "
                      "come: reconnecting", s->base.conf->spec, s->stalled);
        s->stalled = 0;
        drop_connection(s);
    }
}

int
ric_idem_redis_claim(ric_idem_store_t *base, const u_char *key, const u_char *rec, size_t len,
                     int64_t ttl_ms, ric_idem_op_t *op)
{
    redis_store_t *s = (redis_store_t *) base;
    pending_t *p;
    struct timeval tv;

    if (s->state == REDIS_DOWN || s->ac == NULL) {
        snprintf(op->error, sizeof(op->error), "not connected to Redis");
        return op->rc = RIC_ERROR;
    }
    p = pending_new(s, key, rec, len, ttl_ms);
    p->claim = 1;
    p->op = op;
    if (send_command(p) != RIC_OK) {
        pending_free(p);
        snprintf(op->error, sizeof(op->error), "the command could not be queued");
        return op->rc = RIC_ERROR;
    }
    op->pending = p;
    op->timer = evtimer_new(s->ev, on_claim_timeout, op);
    tv = ric_ms_to_tv(RIC_IDEM_STORE_TIMEOUT_MS);
    event_add(op->timer, &tv);
    op->async.cancel = cancel_claim;
    op->async.data = op;
    return RIC_AGAIN;
}

void
ric_idem_redis_settle(ric_idem_store_t *base, const u_char *key, const u_char *token,
                      const u_char *rec, size_t len, int64_t ttl_ms)
{
    redis_store_t *s = (redis_store_t *) base;
    pending_t *p;

    if (s->state == REDIS_DOWN || s->ac == NULL) {
        ric_log_error(RIC_LOG_ERR, 0, "idempotency store \"%s\": not connected: a key stays "
                      "locked until its idempotency_lock_ttl", s->base.conf->spec);
        return;
    }
    p = pending_new(s, key, rec, rec ? len : 0, ttl_ms);
    memcpy(p->token, token, RIC_IDEM_TOKEN_LEN);
    if (send_command(p) != RIC_OK) {
        ric_log_error(RIC_LOG_ERR, 0, "idempotency store \"%s\": a settle could not be sent: "
                      "its key stays locked until idempotency_lock_ttl", s->base.conf->spec);
        pending_free(p);
    }
}

/* A claim whose request gave up (its answer came too late) but that took
 * the lock: the lock is released with the claim's own token. */
static void
release_abandoned(const pending_t *claim)
{
    redis_store_t *s = claim->s;
    pending_t *p;

    if (s->ac == NULL || claim->arg == NULL || claim->arg_len < RIC_IDEM_REC_HEAD) {
        return;
    }
    p = ric_xcalloc(1, sizeof(*p));
    p->s = s;
    s->inflight++;
    memcpy(p->key, claim->key, sizeof(p->key));
    memcpy(p->token, claim->arg + RIC_IDEM_REC_TOKEN, RIC_IDEM_TOKEN_LEN);
    p->ttl_ms = 1;
    if (send_command(p) != RIC_OK) {
        pending_free(p);
    }
}
