/* idem_redis.c: the shared idempotency store: hiredis async on the worker's loop, each turn's claims (lock-or-read) and settles in one Lua script call, settles kept in order until Redis takes them, reconnect with jittered backoff. */
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
#define AGAIN_MS 1000 /* settles that wait are tried again this often */
#define KEY_PREFIX "ricochet:idem:"

/* Every claim and settle of one turn of the worker's loop, in one atomic
 * step: KEYS[i] is a record, ARGV[4i-3..4i] its op: "c", our lock, "",
 * its TTL (ms) claims the key when no record is there (the reply's [i] is
 * 0) or answers the live record; "s", our token, the record to keep (""
 * removes it), its TTL settles the key if it still holds our token, or
 * keeps the record when nothing is there (our lock lapsed, and nobody
 * claimed the key since: the request did run). A lock (a refresh) never
 * replaces an answer: a refresh sent on a connection that was given up
 * (answers that did not come) may still run in Redis after the answer
 * that followed it on the next connection, and must not undo it. */
static const char batch_lua[] =
    "local out = {}\n"
    "for i = 1, #KEYS do\n"
    "  local kind, a, b, ttl = ARGV[4*i-3], ARGV[4*i-2], ARGV[4*i-1], ARGV[4*i]\n"
    "  if kind == 'c' then\n"
    "    local v = redis.call('GET', KEYS[i])\n"
    "    if v then out[i] = v else redis.call('SET', KEYS[i], a, 'PX', ttl); out[i] = 0 end\n"
    "  else\n"
    "    local cur = redis.call('GETRANGE', KEYS[i], 0, 56)\n"
    "    local state = string.sub(cur, 1, 1)\n"
    "    cur = string.sub(cur, 42)\n"
    "    if string.sub(b, 1, 1) == 'L' and state ~= '' and state ~= 'L' then\n"
    "    elseif cur == a then\n"
    "      if b == '' then redis.call('DEL', KEYS[i])\n"
    "      else redis.call('SET', KEYS[i], b, 'PX', ttl) end\n"
    "    elseif cur == '' and b ~= '' then\n"
    "      redis.call('SET', KEYS[i], b, 'PX', ttl)\n"
    "    end\n"
    "    out[i] = 1\n"
    "  end\n"
    "end\n"
    "return out\n";

#define BATCH_MAX 256 /* ops in one script call */

typedef enum { REDIS_DOWN = 0, REDIS_CONNECTING, REDIS_UP } redis_state_t;

/*
 * Settles (answers, refreshes, releases) keep the order they were made in:
 * a refresh must never land after the answer or the release that ends its
 * lock. So at most one call carrying settles is in flight; the others wait
 * in the backlog behind it, as do those made while Redis is away and those
 * of a call that failed (no answer, or an error reply: nobody knows how
 * much of it ran, and every op is token-guarded, so it goes again whole).
 * A failed call's settles are the oldest: they go back to the backlog's
 * head. The backlog goes when the connection is up, one call at a time,
 * at once after a call that Redis took, else each second (AGAIN_MS) while
 * Redis answers errors (LOADING, MISCONF, READONLY, ...: the connection is
 * kept) until it takes them, or their worker exits.
 */
typedef struct {
    ric_idem_store_t base;
    struct event_base *ev;
    redisAsyncContext *ac;
    redis_state_t state;
    struct event *retry_timer;   /* the next connect */
    struct event *connect_timer; /* a connect that takes too long */
    int64_t retry_ms;            /* the current backoff window */
    int failures;                /* connects failed in a row (logged once) */
    int inflight;                /* batches sent and not answered */
    int stalled;                 /* claims in a row that timed out */
    int closing;                 /* the worker exits: answers are awaited, then no reconnect */
    int setup_left;              /* AUTH and SELECT answers still awaited after a connect */
    char batch_sha[41];
    struct event *batch;         /* runs after the turn's events */
    struct item_s *queue, **queue_tail; /* the turn's claims, and its settles when none wait */
    int queued_settles;
    int settling;                /* the one call with settles is in flight */
    ric_idem_backlog_t backlog;  /* settles that wait, oldest first */
    struct event *again;         /* each AGAIN_MS while settles wait */
    char answers[32];            /* the error Redis answers now ("LOADING"; "": none) */
} redis_store_t;

/* A claim or a settle: queued for the turn's batch, then in flight; it
 * outlives a request that gave up on it. */
typedef struct item_s {
    ric_idem_op_t *op; /* a claim's; NULL: a settle, or a claim given up */
    int claim;
    u_char raw[RIC_IDEM_KEY_LEN]; /* the key, as the backlog keeps it */
    char key[sizeof(KEY_PREFIX) + 2 * RIC_IDEM_KEY_LEN];
    u_char *rec;       /* owned: the claim's lock, the settle's record (NULL: release) */
    size_t len;
    char token[RIC_IDEM_TOKEN_LEN];
    int64_t ttl_ms;
    char ttl[24];
    int64_t lock_expires; /* a settle's: when the lock it settles lapses */
    int lost;          /* a settle's: logged and counted as lost already */
    struct item_s *next;
} item_t;

/* One script call: its items, until the reply. */
typedef struct {
    redis_store_t *s;
    item_t *items;
    int n;
    int settles;   /* it carries settles: the one such call in flight */
    int fell_back; /* EVAL sent after NOSCRIPT */
    int sent;      /* it reached the connection: a lost one leaves it unknown */
} batch_t;

static void connect_now(redis_store_t *s);
static void item_free(item_t *it);
static item_t *item_new(redis_store_t *s, const u_char *key, const u_char *rec, size_t len,
                        int64_t ttl_ms);
static void drain(redis_store_t *s);
static void on_batch(evutil_socket_t fd, short what, void *arg);

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
    if (s->queue != NULL && s->batch != NULL) {
        event_active(s->batch, EV_TIMEOUT, 1); /* what waits for a connection fails now */
    }
}

/* Connected (and in its database): the settles that wait go (what a lost
 * connection left unknown goes again: token-guarded, harmless if done),
 * then the claims asked while connecting. */
static void
store_up(redis_store_t *s)
{
    ric_log_error(s->failures > 0 ? RIC_LOG_NOTICE : RIC_LOG_INFO, 0,
                  "idempotency store \"%s\": connected%s", s->base.conf->spec,
                  s->failures > 0 ? " again" : "");
    s->failures = 0;
    s->state = REDIS_UP;
    s->retry_ms = RECONNECT_MIN_MS;
    drain(s);
    if (s->queue != NULL) {
        event_active(s->batch, EV_TIMEOUT, 1);
    }
}

/* The answer to AUTH or SELECT, sent first on every connection: the
 * store is up once both said OK. */
static void
on_setup(redisAsyncContext *ac, void *reply_, void *privdata)
{
    redisReply *reply = reply_;
    redis_store_t *s = ac->data;
    const char *step = privdata;

    if (s == NULL || reply == NULL) {
        return; /* closing, or the connection is going anyway */
    }
    if (reply->type == REDIS_REPLY_ERROR) {
        /* never go on unauthenticated, or in database 0: another store's
         * records may live there */
        ric_log_error(RIC_LOG_ERR, 0, "idempotency store \"%s\": %s failed: %.150s (retrying)",
                      s->base.conf->spec, step, reply->str);
        s->failures++;
        redisAsyncDisconnect(ac); /* on_disconnect schedules the next try */
        return;
    }
    if (--s->setup_left == 0) {
        store_up(s);
    }
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
    if (s->setup_left == 0) {
        store_up(s);
    }
    /* else AUTH's and SELECT's answers say */
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
    ric_log_error(s->failures++ == 0 ? RIC_LOG_ERR : RIC_LOG_INFO, 0,
                  "idempotency store \"%s\": connection lost: %s (reconnecting)",
                  s->base.conf->spec, status != REDIS_OK ? ac->errstr : "closed by Redis");
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
    s->setup_left = 0;
    if (s->base.conf->password != NULL) {
        const char *argv[3] = { "AUTH", s->base.conf->user, s->base.conf->password };
        size_t len[3] = { 4, s->base.conf->user ? strlen(s->base.conf->user) : 0,
                          strlen(s->base.conf->password) };
        if (s->base.conf->user == NULL) {
            argv[1] = argv[2];
            len[1] = len[2];
        }
        redisAsyncCommandArgv(ac, on_setup, (void *) "authentication (AUTH)",
                              s->base.conf->user ? 3 : 2, argv, len);
        s->setup_left++;
    }
    if (s->base.conf->db != 0) {
        redisAsyncCommand(ac, on_setup, (void *) "selecting the database (SELECT)", "SELECT %d",
                          s->base.conf->db);
        s->setup_left++;
    }
    redisAsyncCommand(ac, NULL, NULL, "SCRIPT LOAD %s", batch_lua);
    tv = ric_ms_to_tv(RIC_IDEM_STORE_TIMEOUT_MS);
    event_add(s->connect_timer, &tv);
}

static void
on_again(evutil_socket_t fd, short what, void *arg)
{
    redis_store_t *s = arg;
    struct timeval tv = ric_ms_to_tv(AGAIN_MS);

    (void) fd;
    (void) what;
    ric_idem_backlog_lapsed(&s->backlog, s->base.conf);
    drain(s);
    if (s->backlog.n > 0) {
        event_add(s->again, &tv);
    }
}

static ric_idem_store_t *
redis_open(ric_idem_store_conf_t *sc, struct event_base *base, char *err, size_t errlen)
{
    (void) err; /* it cannot fail here: it connects, and reconnects, on its own */
    (void) errlen;
    redis_store_t *s = ric_xcalloc(1, sizeof(*s));

    s->base.kind = RIC_IDEM_STORE_REDIS;
    s->base.conf = sc;
    s->ev = base;
    s->retry_ms = RECONNECT_MIN_MS;
    s->retry_timer = evtimer_new(base, on_retry, s);
    s->connect_timer = evtimer_new(base, on_connect_timeout, s);
    s->again = evtimer_new(base, on_again, s);
    sha1_hex(batch_lua, s->batch_sha);
    s->batch = event_new(base, -1, 0, on_batch, s);
    s->queue_tail = &s->queue;
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

static void
redis_close(ric_idem_store_t *base)
{
    redis_store_t *s = (redis_store_t *) base;
    redisAsyncContext *ac;
    struct event *limit;
    struct timeval tv;

    if (s->queue != NULL) {
        on_batch(-1, 0, s); /* the last settles of a stopping worker */
    }
    if (s->ac != NULL && s->state == REDIS_UP && (s->inflight > 0 || s->backlog.n > 0)) {
        /* the last answers' settles must land, or their keys would stay
         * locked until idempotency_lock_ttl: the backlog goes (a call that
         * fails ends it) and the answers are awaited, briefly */
        s->closing = 1;
        event_del(s->retry_timer);
        event_del(s->again);
        drain(s);
        if (s->inflight > 0) {
            limit = evtimer_new(s->ev, on_close_timeout, s);
            tv = ric_ms_to_tv(RIC_IDEM_STORE_TIMEOUT_MS);
            event_add(limit, &tv);
            event_base_dispatch(s->ev); /* until on_disconnect, after the last answer */
            event_free(limit);
        }
    }
    if (s->ac != NULL) {
        ac = s->ac;
        s->ac = NULL;
        ac->data = NULL;
        redisAsyncFree(ac); /* pending callbacks run now, with no reply */
    }
    ric_idem_backlog_drop(&s->backlog, s->base.conf);
    event_free(s->retry_timer);
    event_free(s->connect_timer);
    event_free(s->again);
    event_free(s->batch);
    free(s);
}

#define STALLED_MAX 3 /* claims in a row without an answer: the connection is dropped */

static void
item_free(item_t *it)
{
    free(it->rec);
    free(it);
}

static void
claim_over(ric_idem_op_t *op, int rc)
{
    if (op->timer != NULL) {
        event_free(op->timer);
        op->timer = NULL;
    }
    op->pending = NULL;
    op->rc = rc;
    op->done(op);
}

/* A new op for key (copying rec), not queued yet. */
static item_t *
item_make(const u_char *key, const u_char *rec, size_t len, int64_t ttl_ms)
{
    item_t *it = ric_xcalloc(1, sizeof(*it));

    memcpy(it->raw, key, RIC_IDEM_KEY_LEN);
    memcpy(it->key, KEY_PREFIX, sizeof(KEY_PREFIX) - 1);
    ric_idem_key_hex(key, it->key + sizeof(KEY_PREFIX) - 1);
    if (rec != NULL) {
        it->rec = ric_xmalloc(len ? len : 1);
        memcpy(it->rec, rec, len);
        it->len = len;
    }
    it->ttl_ms = ttl_ms;
    snprintf(it->ttl, sizeof(it->ttl), "%lld", (long long) ric_max(ttl_ms, (int64_t) 1));
    return it;
}

/* A new op at the end of the turn's queue. */
static item_t *
item_new(redis_store_t *s, const u_char *key, const u_char *rec, size_t len, int64_t ttl_ms)
{
    item_t *it = item_make(key, rec, len, ttl_ms);

    if (s->queue == NULL) {
        /* after the events of this turn: their ops join this call */
        event_active(s->batch, EV_TIMEOUT, 1);
    }
    *s->queue_tail = it;
    s->queue_tail = &it->next;
    return it;
}

static void
again_later(redis_store_t *s)
{
    struct timeval tv = ric_ms_to_tv(AGAIN_MS);

    if (!s->closing && !evtimer_pending(s->again, NULL)) {
        event_add(s->again, &tv);
    }
}

/* A settle waits, at the end of the backlog. */
static void
keep(redis_store_t *s, const u_char *key, const u_char *token, const u_char *rec, size_t len,
     int64_t ttl_ms, int64_t lock_expires)
{
    ric_idem_backlog_push(&s->backlog, s->base.conf, key, token, rec, len, ttl_ms, lock_expires);
    again_later(s);
}

/* A claim that took the lock (or may have: its call failed) for a request
 * that does not hold it: the lock goes, by the claim's own token. */
static void
release_claim(redis_store_t *s, const item_t *claim)
{
    if (claim->rec == NULL || claim->len < RIC_IDEM_REC_HEAD) {
        return;
    }
    keep(s, claim->raw, claim->rec + RIC_IDEM_REC_TOKEN, NULL, 0, 1,
         (int64_t) ric_idem_get64(claim->rec + RIC_IDEM_REC_EXPIRES));
}

/* A settle of a failed call, as the backlog keeps it (its record moves). */
static ric_idem_pending_t *
item_pending(item_t *it)
{
    ric_idem_pending_t *p = ric_xcalloc(1, sizeof(*p));

    memcpy(p->key, it->raw, RIC_IDEM_KEY_LEN);
    memcpy(p->token, it->token, RIC_IDEM_TOKEN_LEN);
    p->rec = it->rec;
    p->len = it->rec != NULL ? it->len : 0;
    p->ttl_ms = it->ttl_ms;
    p->lock_expires = it->lock_expires;
    p->lost = it->lost;
    it->rec = NULL;
    return p;
}

/* Redis answered a call with an error: said once for each error in a row
 * (its first word: LOADING, MISCONF, READONLY, ...). */
static void
answers_error(redis_store_t *s, const char *why)
{
    size_t n = ric_min(strcspn(why, " "), sizeof(s->answers) - 1);

    if (strlen(s->answers) == n && memcmp(s->answers, why, n) == 0) {
        return;
    }
    memcpy(s->answers, why, n);
    s->answers[n] = '\0';
    ric_log_error(RIC_LOG_ERR, 0, "idempotency store \"%s\": Redis answers errors: %.200s "
                  "(claims fail; settles wait and are tried again every second)",
                  s->base.conf->spec, why);
}

static int send_batch(batch_t *b);

/* What the items of one call have to hear: results in order, or the
 * failure of them all (reply NULL or an error). A failed call may have run
 * in part (a script's writes before an error stay): its settles go again,
 * its claims' locks are released by their tokens. */
static void
batch_over(batch_t *b, redisReply *reply)
{
    redis_store_t *s = b->s;
    ric_idem_pending_t *back[BATCH_MAX];
    item_t *it, *next;
    redisReply *r;
    int i = 0, rc, nback = 0, wrote = b->settles;
    const char *why = reply == NULL ? "the connection to Redis was lost"
                      : reply->type == REDIS_REPLY_ERROR ? reply->str
                      : reply->type != REDIS_REPLY_ARRAY || (int) reply->elements != b->n
                          ? "an unexpected reply" : NULL;

    if (b->settles) {
        s->settling = 0;
    }
    if (why != NULL && b->n > 0) {
        if (reply == NULL) {
            ric_log_error(RIC_LOG_ERR, 0, "idempotency store \"%s\": %d operation%s failed: "
                          "%s", s->base.conf->spec, b->n, b->n > 1 ? "s" : "", why);
        } else {
            answers_error(s, why);
        }
    }
    /* the failed settles first, back to the backlog's head in their order
     * (they are the oldest): a claim's request, told next, may settle */
    for (it = b->items; it && why != NULL; it = it->next) {
        if (!it->claim) {
            back[nback++] = item_pending(it);
        }
    }
    while (nback > 0) {
        ric_idem_backlog_unshift(&s->backlog, back[--nback]);
    }
    for (it = b->items; it; it = next, i++) {
        next = it->next;
        r = why == NULL ? reply->element[i] : NULL;
        if (it->claim) {
            rc = r == NULL ? RIC_ERROR
                 : r->type == REDIS_REPLY_INTEGER ? RIC_IDEM_CLAIMED
                 : r->type == REDIS_REPLY_STRING && r->len >= RIC_IDEM_OLD_HEAD ? RIC_IDEM_FOUND
                 : RIC_ERROR;
            wrote |= rc == RIC_IDEM_CLAIMED;
            if (why != NULL ? b->sent : rc == RIC_IDEM_CLAIMED && it->op == NULL) {
                release_claim(s, it);
            }
            if (it->op != NULL) {
                if (rc == RIC_IDEM_FOUND) {
                    it->op->found.len = 0;
                    ric_buf_put(&it->op->found, r->str, r->len);
                } else if (rc == RIC_ERROR) {
                    snprintf(it->op->error, sizeof(it->op->error), "%.150s",
                             why ? why : "Redis answered something else");
                }
                claim_over(it->op, rc);
            }
        }
        item_free(it);
    }
    if (s->backlog.n > 0) {
        again_later(s);
    }
    free(b);
    if (why == NULL && wrote && s->answers[0] != '\0') {
        /* a call that took settles or a claim's lock: not a read that
         * Redis would answer while it refuses writes */
        ric_log_error(RIC_LOG_NOTICE, 0, "idempotency store \"%s\": Redis answers again (no "
                      "more %s)", s->base.conf->spec, s->answers);
        s->answers[0] = '\0';
    }
    if (why == NULL) {
        drain(s);
    }
}

/* The next call of the settles that wait, oldest first, when none is in
 * flight and none is queued (those go first: they are older). */
static void
drain(redis_store_t *s)
{
    ric_idem_pending_t *p;
    item_t *it, **tail;
    batch_t *b;

    if (s->settling || s->queued_settles > 0 || s->backlog.n == 0 || s->state != REDIS_UP
        || s->ac == NULL) {
        return;
    }
    b = ric_xcalloc(1, sizeof(*b));
    b->s = s;
    b->settles = 1;
    tail = &b->items;
    while (b->n < BATCH_MAX && (p = ric_idem_backlog_take(&s->backlog, s->base.conf)) != NULL) {
        it = ric_xcalloc(1, sizeof(*it));
        memcpy(it->raw, p->key, RIC_IDEM_KEY_LEN);
        memcpy(it->key, KEY_PREFIX, sizeof(KEY_PREFIX) - 1);
        ric_idem_key_hex(p->key, it->key + sizeof(KEY_PREFIX) - 1);
        memcpy(it->token, p->token, RIC_IDEM_TOKEN_LEN);
        it->rec = p->rec; /* moves */
        it->len = p->len;
        it->ttl_ms = p->ttl_ms;
        snprintf(it->ttl, sizeof(it->ttl), "%lld", (long long) ric_max(p->ttl_ms, (int64_t) 1));
        it->lock_expires = p->lock_expires;
        it->lost = p->lost;
        p->rec = NULL;
        ric_idem_pending_free(p);
        *tail = it;
        tail = &it->next;
        b->n++;
    }
    if (send_batch(b) != RIC_OK) {
        batch_over(b, NULL);
    }
}

static void
on_batch_reply(redisAsyncContext *ac, void *reply_, void *privdata)
{
    redisReply *reply = reply_;
    batch_t *b = privdata;
    redis_store_t *s = b->s;

    (void) ac;
    s->inflight--;
    if (reply != NULL) {
        s->stalled = 0;
    }
    if (reply != NULL && reply->type == REDIS_REPLY_ERROR && !b->fell_back
        && strncmp(reply->str, "NOSCRIPT", 8) == 0 && s->ac != NULL) {
        b->fell_back = 1; /* flushed since we loaded it: EVAL loads it again */
        if (send_batch(b) == RIC_OK) {
            return;
        }
    }
    batch_over(b, reply);
    if (s->closing && s->inflight == 0 && s->ac != NULL) {
        redisAsyncDisconnect(s->ac); /* the last answer is in: on_disconnect ends the wait */
    }
}

static int
send_batch(batch_t *b)
{
    redis_store_t *s = b->s;
    int argc = 3 + 5 * b->n, n = 0, rc;
    const char **argv = ric_xmalloc(sizeof(*argv) * (size_t) argc);
    size_t *len = ric_xmalloc(sizeof(*len) * (size_t) argc);
    char count[16];
    item_t *it;

    /* argv, not a format: nothing to parse on the hot path */
    argv[n] = b->fell_back ? "EVAL" : "EVALSHA";
    len[n] = strlen(argv[n]);
    n++;
    argv[n] = b->fell_back ? batch_lua : s->batch_sha;
    len[n] = strlen(argv[n]);
    n++;
    len[n] = (size_t) snprintf(count, sizeof(count), "%d", b->n);
    argv[n++] = count;
    for (it = b->items; it; it = it->next) {
        argv[n] = it->key;
        len[n++] = sizeof(it->key) - 1;
    }
    for (it = b->items; it; it = it->next) {
        argv[n] = it->claim ? "c" : "s";
        len[n++] = 1;
        argv[n] = it->claim ? (const char *) it->rec : it->token;
        len[n++] = it->claim ? it->len : RIC_IDEM_TOKEN_LEN;
        argv[n] = !it->claim && it->rec ? (const char *) it->rec : "";
        len[n++] = !it->claim && it->rec ? it->len : 0;
        argv[n] = it->ttl;
        len[n++] = strlen(it->ttl);
    }
    rc = redisAsyncCommandArgv(s->ac, on_batch_reply, b, argc, argv, len);
    free(argv);
    free(len);
    if (rc != REDIS_OK) {
        return RIC_ERROR;
    }
    b->sent = 1;
    s->inflight++;
    if (b->settles) {
        s->settling = 1;
    }
    return RIC_OK;
}

/* The turn's ops go in calls of up to BATCH_MAX: its settles (at most
 * BATCH_MAX) first, in the first call, then its claims. */
static void
on_batch(evutil_socket_t fd, short what, void *arg)
{
    redis_store_t *s = arg;
    item_t *it, *next, *settles = NULL, **st = &settles, *claims = NULL, **ct = &claims, *last;
    batch_t *b;

    (void) fd;
    (void) what;
    if (s->state == REDIS_CONNECTING) {
        return; /* they go when it is up (or fail when it is not) */
    }
    for (it = s->queue; it; it = next) {
        next = it->next;
        it->next = NULL;
        if (it->claim) {
            *ct = it;
            ct = &it->next;
        } else {
            *st = it;
            st = &it->next;
        }
    }
    *st = claims;
    it = settles;
    s->queue = NULL;
    s->queue_tail = &s->queue;
    s->queued_settles = 0;
    while (it != NULL) {
        b = ric_xcalloc(1, sizeof(*b));
        b->s = s;
        b->items = it;
        b->settles = !it->claim;
        for (last = it, b->n = 1; last->next && b->n < BATCH_MAX; last = last->next) {
            b->n++;
        }
        it = last->next;
        last->next = NULL;
        if (s->state != REDIS_UP || s->ac == NULL || send_batch(b) != RIC_OK) {
            batch_over(b, NULL);
        }
    }
}

static void
cancel_claim(ric_async_t *a)
{
    ric_idem_op_t *op = a->data;

    if (op->pending != NULL) {
        ((item_t *) op->pending)->op = NULL; /* its answer, when it comes, finds nobody */
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
    redis_store_t *s = (redis_store_t *) op->store;

    (void) fd;
    (void) what;
    if (op->pending != NULL) {
        ((item_t *) op->pending)->op = NULL;
    }
    snprintf(op->error, sizeof(op->error), "Redis did not answer within %d ms",
             RIC_IDEM_STORE_TIMEOUT_MS);
    claim_over(op, RIC_ERROR);
    if (++s->stalled >= STALLED_MAX && s->ac != NULL) {
        ric_log_error(RIC_LOG_ERR, 0, "idempotency store \"%s\": %d answers in a row did not "
                      "come: reconnecting", s->base.conf->spec, s->stalled);
        s->stalled = 0;
        drop_connection(s);
    }
}

static int
redis_claim(ric_idem_store_t *base, const u_char *key, u_char *rec, size_t len, int64_t ttl_ms,
            int durable, ric_idem_op_t *op)
{
    redis_store_t *s = (redis_store_t *) base;
    item_t *it;
    struct timeval tv;

    (void) durable; /* Redis's own persistence decides */
    if (s->state == REDIS_DOWN || s->ac == NULL) {
        snprintf(op->error, sizeof(op->error), "not connected to Redis");
        return op->rc = RIC_ERROR;
    }
    it = item_new(s, key, rec, len, ttl_ms);
    it->claim = 1;
    it->op = op;
    op->pending = it;
    op->timer = evtimer_new(s->ev, on_claim_timeout, op);
    tv = ric_ms_to_tv(RIC_IDEM_STORE_TIMEOUT_MS);
    event_add(op->timer, &tv);
    op->async.cancel = cancel_claim;
    op->async.data = op;
    return RIC_AGAIN;
}

static void
redis_settle(ric_idem_store_t *base, const u_char *key, const u_char *token,
                      const u_char *rec, size_t len, int64_t ttl_ms, int64_t lock_expires)
{
    redis_store_t *s = (redis_store_t *) base;
    item_t *it;

    if (s->state != REDIS_UP || s->ac == NULL || s->settling || s->backlog.n > 0
        || s->queued_settles >= BATCH_MAX) {
        /* behind the older ones, in order */
        if (s->state != REDIS_UP && s->backlog.n == 0) {
            ric_log_error(RIC_LOG_WARN, 0, "idempotency store \"%s\": not connected: settles "
                          "wait for Redis to come back", s->base.conf->spec);
        }
        keep(s, key, token, rec, rec ? len : 0, ttl_ms, lock_expires);
        return;
    }
    it = item_new(s, key, rec, rec ? len : 0, ttl_ms);
    memcpy(it->token, token, RIC_IDEM_TOKEN_LEN);
    it->lock_expires = lock_expires;
    s->queued_settles++;
}

/* Nothing to check before workers start: Redis may come up after the gateway, which reconnects. */
const ric_idem_store_ops_t ric_idem_redis_ops = {
    "redis", NULL, NULL, redis_open, redis_close, redis_claim, redis_settle
};
