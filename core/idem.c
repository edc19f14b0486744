/* idem.c: the idempotency phase (claim a key, or replay / 409 / 422 from the store), the copy of the answer as it is relayed, and the settle at finalize. */
#include "idem.h"
#include "metrics.h"
#include "attempt.h"
#include "idem_store.h"
#include "headers.h"
#include "log.h"
#include "request.h"

#include <event2/event_struct.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <strings.h>
#include <unistd.h>

#define KEY_MAX_LEN 255 /* as Stripe's keys: longer is a client's mistake */

typedef struct ric_idem_s {
    ric_idem_store_conf_t *sc;
    ric_idem_op_t op;
    int held;          /* the key is ours until settled */
    u_char key[RIC_IDEM_KEY_LEN]; /* the record's: route and client key */
    ric_str_t client_key; /* as the request gave it (alive while it is) */
    u_char fp[32];     /* the request's fingerprint */
    u_char client[RIC_IDEM_ID_LEN]; /* its Authorization and Cookie's digest (zeros: neither) */
    int fp_pending;    /* a streamed body: fp is known once all of it passed (zeros till then) */
    u_char token[RIC_IDEM_TOKEN_LEN];
    u_char lock[RIC_IDEM_REC_HEAD];
    struct event refresh; /* writes the lock again halfway through its TTL */
    int refreshing;
    /* the answer, as the client got it */
    int captured;      /* its head was seen */
    int status;
    ric_buf_t fields;
    ric_buf_t body;
    int too_large;     /* its body passed idempotency_max_body: not kept */
    int dechunk;       /* the relayed bytes are chunked: decoded for keeping */
    ric_http_chunked_t chunked;
} ric_idem_t;

_Static_assert(RIC_IDEM_N_MAX == RIC_MI_MAX, "metrics.h counts every idempotency outcome");

/* What the store's answer made of the request: in its access log line,
 * the store's counters and its route's. */
static void
outcome(ric_request_t *r, ric_idem_t *d, const char *name, ric_idem_count_t what)
{
    ric_route_shard_t *sh = ric_metrics_route(r->location ? r->location->metrics : NULL);

    r->log.idempotency = name;
    ric_idem_count(d->sc, what);
    if (sh != NULL) {
        ric_metric_add(&sh->idem[what], 1);
    }
}

/* --- answers -------------------------------------------------------------- */

/* An RFC 9457 problem answer; one worth retrying soon says when. */
static int
problem(ric_request_t *r, int status, const char *type, const char *title, const char *detail)
{
    static const char ctype[] = "Content-Type: application/problem+json\r\n";
    static const char ctype_later[] = "Content-Type: application/problem+json\r\n"
                                      "Retry-After: 1\r\n";
    int later = status == 503 || strcmp(type, "idempotency-key-in-use") == 0;
    char body[1024];
    int n;

    n = snprintf(body, sizeof(body),
                 "{\"type\":\"urn:ricochet:problem:%s\",\"title\":\"%s\",\"status\":%d,"
                 "\"detail\":\"%s\"}\n", type, title, status, detail);
    n = ric_min(n, (int) sizeof(body) - 1);
    r->own_custom = 1;
    r->own_fields.data = (const u_char *) (later ? ctype_later : ctype);
    r->own_fields.len = later ? sizeof(ctype_later) - 1 : sizeof(ctype) - 1;
    r->own_body.data = (const u_char *) ric_pstrndup(r->pool, body, (size_t) n);
    r->own_body.len = (size_t) n;
    return ric_request_answer(r, status, 0);
}

/* The stored answer, as it was, marked replayed: its Set-Cookie fields
 * only to the client it was stored for (the same Authorization and
 * Cookie; an old record names no client), so that a session never
 * passes to another client that shares the key space. */
static int
replay(ric_request_t *r, const ric_idem_t *d, const ric_idem_record_t *rec)
{
    static const char mark[] = "Idempotent-Replayed: true\r\n";
    static const char set_cookie[] = "set-cookie:";
    int same = rec->client != NULL && memcmp(rec->client, d->client, sizeof(d->client)) == 0;
    const u_char *p = rec->fields.data, *end = p + rec->fields.len, *eol;
    size_t flen = 0, n;
    u_char *fields;

    fields = ric_palloc(r->pool, rec->fields.len + sizeof(mark) - 1);
    while (p < end) {
        eol = memchr(p, '\n', (size_t) (end - p));
        n = eol != NULL ? (size_t) (eol + 1 - p) : (size_t) (end - p);
        if (same || n < sizeof(set_cookie) - 1
            || strncasecmp((const char *) p, set_cookie, sizeof(set_cookie) - 1) != 0) {
            memcpy(fields + flen, p, n);
            flen += n;
        }
        p += n;
    }
    memcpy(fields + flen, mark, sizeof(mark) - 1);
    r->own_custom = 1;
    r->own_fields.data = fields;
    r->own_fields.len = flen + sizeof(mark) - 1;
    r->own_body.data = (const u_char *) ric_pstrndup(r->pool, (const char *) rec->body.data,
                                                     rec->body.len);
    r->own_body.len = rec->body.len;
    return ric_request_answer(r, rec->status, 0);
}

/* --- the key and the fingerprint ------------------------------------------- */

/* The request's key: its script's, else the client's field: one field,
 * its value 1 to 255 bytes, bare or in the draft's quoted form ("abc" is
 * abc). 1: in *key; 0: none; -1: unusable (*why says). */
static int
request_key(ric_request_t *r, ric_str_t *key, const char **why)
{
    const char *field = r->location->refs.idempotency_key_header;
    int n;

    if (r->script_key != NULL) {
        key->data = (const u_char *) r->script_key;
        key->len = strlen(r->script_key);
    } else if (r->script_key_removed) {
        return 0;
    } else {
        n = ric_headers_count(r->c->in, r->msg, field);
        if (n == 0) {
            return 0;
        }
        if (n > 1) {
            /* which one counts would be a guess; every client must see one rule */
            *why = "The request has more than one idempotency key field: send exactly one.";
            return -1;
        }
        *key = ric_headers_find(r->c->in, r->msg, field);
        if (key->len > 0 && key->data[0] == '"') {
            if (key->len < 2 || key->data[key->len - 1] != '"') {
                *why = "The idempotency key opens a quoted string it does not close.";
                return -1;
            }
            key->data++;
            key->len -= 2;
        }
        if (key->len == 0) {
            /* an empty key would be one key shared by every client */
            *why = "The idempotency key is empty: send a unique key of 1 to 255 bytes.";
            return -1;
        }
    }
    if (key->len > KEY_MAX_LEN) {
        *why = "The idempotency key is longer than 255 bytes.";
        return -1;
    }
    return 1;
}

static void
digest_piece(void *ctx, const u_char *p, size_t n)
{
    EVP_DigestUpdate(ctx, p, n);
}

/* The token of a claim: unique among every gateway's claims (a random
 * prefix per process, then a count), so a lock is settled only by the
 * request that holds it. */
static void
new_token(u_char *token)
{
    static u_char prefix[8];
    static pid_t owner;
    static uint64_t count;

    if (owner != getpid()) {
        owner = getpid(); /* drawn again in every worker */
        if (RAND_bytes(prefix, sizeof(prefix)) != 1) {
            /* no randomness: the process and the moment are unique enough */
            ric_idem_put64(prefix, ((uint64_t) owner << 40) ^ (uint64_t) ric_now_exact_us());
        }
        count = 0;
    }
    memcpy(token, prefix, sizeof(prefix));
    ric_idem_put64(token + sizeof(prefix), ++count);
}

/* The client's part of the record key (idempotency_scope): every value
 * of the field (Authorization by default), or the client's address. A
 * request without the default Authorization takes every Cookie value
 * instead: a client that signs in by cookie must not share one key space
 * with every other such client, whose answers (their Set-Cookie too)
 * would be its replays. A request with neither has no scope, as before
 * scopes: its key is the route's. */
static void
digest_scope(ric_request_t *r, EVP_MD_CTX *ctx)
{
    const char *scope = r->location->refs.idempotency_scope;
    const ric_http_msg_t *m = r->msg;
    ric_str_t want, name, value;
    unsigned i;
    int found = 0;

    if (scope == NULL || scope[0] == '\0') {
        return;
    }
    if (strcmp(scope, "$remote_addr") == 0) {
        EVP_DigestUpdate(ctx, "\0addr", 6);
        EVP_DigestUpdate(ctx, r->c->peer_ip, strlen(r->c->peer_ip));
        return;
    }
    want.data = (const u_char *) scope;
    want.len = strlen(scope);
    for (i = 0; i < m->nfields; i++) {
        name = ric_field_name(r->c->in, m, i);
        if (ric_str_eq_nocase(name, want)) {
            value = ric_field_value(r->c->in, m, i);
            EVP_DigestUpdate(ctx, "\0field", 7);
            EVP_DigestUpdate(ctx, value.data, value.len);
            found = 1;
        }
    }
    if (found || strcasecmp(scope, "Authorization") != 0) {
        return; /* another FIELD names its own clients: without it, none */
    }
    for (i = 0; i < m->nfields; i++) {
        if (ric_str_eq_lower(ric_field_name(r->c->in, m, i), "cookie")) {
            value = ric_field_value(r->c->in, m, i);
            EVP_DigestUpdate(ctx, "\0cookie", 8);
            EVP_DigestUpdate(ctx, value.data, value.len);
        }
    }
}

/* The head of a request's fingerprint: its method and target, each ended
 * by a NUL; the body's bytes follow, held or streamed alike. */
static void
fingerprint_head(const ric_request_t *r, void (*put)(void *ctx, const u_char *p, size_t n),
                 void *ctx)
{
    const ric_http_msg_t *m = r->msg;
    ric_str_t method = ric_request_span(r, m->method_off, m->method_len);
    ric_str_t target = ric_request_span(r, m->target_off, m->target_len);

    put(ctx, method.data, method.len);
    put(ctx, (const u_char *) "", 1);
    put(ctx, target.data, target.len);
    put(ctx, (const u_char *) "", 1);
}

static void
body_digest_piece(void *ctx, const u_char *p, size_t n)
{
    ric_body_digest_add(ctx, p, n);
}

/* The record's key: the route (the server's first name, the location and,
 * when another route has those two, what tells them apart: idem_route.h),
 * the client's scope and its key, so that routes never share records, nor
 * clients answers. The fingerprint: method, target and body, as the draft
 * asks; a streamed body's is taken as it passes (ric_idem_body_digest),
 * the same digest as a held body's, so raising or lowering
 * retry_body_max never turns a repeat into a 422. */
static int
digest(ric_request_t *r, ric_idem_t *d, ric_str_t key)
{
    static EVP_MD_CTX *ctx;
    static EVP_MD *sha256;
    const ric_server_conf_t *s = r->server;
    const char *name = s->nnames > 0 ? s->names[0] : "";
    const char *route = r->location->idem_route;
    int rc = RIC_ERROR;

    if (ctx == NULL) {
        /* fetched once: an implicit fetch per digest costs more than it */
        ctx = EVP_MD_CTX_new();
        sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
    }
    if (ctx == NULL || sha256 == NULL || EVP_DigestInit_ex(ctx, sha256, NULL) != 1) {
        goto done;
    }
    EVP_DigestUpdate(ctx, name, strlen(name) + 1);
    EVP_DigestUpdate(ctx, r->location->path, strlen(r->location->path) + 1);
    EVP_DigestUpdate(ctx, r->location->exact ? "=" : "~", 1);
    if (route != NULL) {
        /* a key never begins with a NUL: no key of a route alone under
         * its name is one of these */
        EVP_DigestUpdate(ctx, "", 1);
        EVP_DigestUpdate(ctx, route, strlen(route) + 1);
    }
    EVP_DigestUpdate(ctx, key.data, key.len);
    digest_scope(r, ctx);
    if (EVP_DigestFinal_ex(ctx, d->key, NULL) != 1) {
        goto done;
    }
    if (r->body_mode == RIC_REQ_BODY_STREAM) {
        /* too large to hold (retry_body_max): known once the last of its
         * bytes passed */
        d->fp_pending = !r->body_digested;
        if (d->fp_pending) {
            memset(d->fp, 0, sizeof(d->fp));
        } else {
            memcpy(d->fp, r->body_sha, sizeof(d->fp));
        }
        rc = RIC_OK;
        goto done;
    }
    if (EVP_DigestInit_ex(ctx, sha256, NULL) != 1) {
        goto done;
    }
    fingerprint_head(r, digest_piece, ctx);
    if (ric_body_each(&r->body, digest_piece, ctx) != RIC_OK) {
        goto done;
    }
    if (EVP_DigestFinal_ex(ctx, d->fp, NULL) == 1) {
        rc = RIC_OK;
    }
done:
    return rc;
}

/* A record's head (its checksum is the caller's, once the record is
 * whole): a lock lapses on the boot clock of this boot; a done record
 * expires on the wall clock (it outlives the host's boot). */
static void
record_head(u_char *rec, int state, const ric_idem_t *d, int64_t ttl_ms)
{
    memset(rec, 0, RIC_IDEM_REC_HEAD);
    rec[0] = (u_char) state;
    ric_idem_put64(rec + RIC_IDEM_REC_EXPIRES, (uint64_t) (ric_idem_wall_ms() + ttl_ms));
    memcpy(rec + RIC_IDEM_REC_FP, d->fp, sizeof(d->fp));
    memcpy(rec + RIC_IDEM_REC_TOKEN, d->token, RIC_IDEM_TOKEN_LEN);
    if (state == RIC_IDEM_LOCKED) {
        ric_idem_put64(rec + RIC_IDEM_REC_LAPSE, (uint64_t) (ric_idem_boot_ms() + ttl_ms));
        memcpy(rec + RIC_IDEM_REC_BOOT, ric_idem_boot_id(), RIC_IDEM_ID_LEN);
    }
    memcpy(rec + RIC_IDEM_REC_CLIENT, d->client, sizeof(d->client));
}

/* The client's digest: every Authorization and Cookie field, in order,
 * each as its kind, its length and its value (no two lists of fields give
 * one input); zeros when it has neither. */
static void
client_digest(ric_request_t *r, ric_idem_t *d)
{
    static const ric_str_t names[2] = { ric_string("authorization"), ric_string("cookie") };
    static EVP_MD_CTX *ctx;
    static EVP_MD *sha256;
    const ric_http_msg_t *m = r->msg;
    u_char md[32], len[8];
    ric_str_t name, value;
    unsigned i, k, seen = 0;

    memset(d->client, 0, sizeof(d->client));
    if (ctx == NULL) {
        ctx = EVP_MD_CTX_new();
        sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
    }
    if (ctx == NULL || sha256 == NULL || EVP_DigestInit_ex(ctx, sha256, NULL) != 1) {
        return; /* as a client without either: its replays go without Set-Cookie */
    }
    for (i = 0; i < m->nfields; i++) {
        name = ric_field_name(r->c->in, m, i);
        for (k = 0; k < 2; k++) {
            if (ric_str_eq_nocase(name, names[k])) {
                value = ric_field_value(r->c->in, m, i);
                ric_idem_put64(len, value.len);
                EVP_DigestUpdate(ctx, k == 0 ? "a" : "c", 1);
                EVP_DigestUpdate(ctx, len, sizeof(len));
                EVP_DigestUpdate(ctx, value.data, value.len);
                seen++;
            }
        }
    }
    if (seen > 0 && EVP_DigestFinal_ex(ctx, md, NULL) == 1) {
        memcpy(d->client, md, sizeof(d->client));
    }
}

/* The lock lives at least as long as the route may keep trying. */
static int64_t
lock_ttl(const ric_request_t *r)
{
    return ric_max(r->settings->idempotency_lock_ttl, r->settings->retry_timeout);
}

/* --- the copy of the answer ------------------------------------------------ */

static void
keep_body(ric_idem_t *d, const ric_request_t *r, const u_char *p, size_t n)
{
    if (d->too_large) {
        return;
    }
    if (d->body.len + n > (uint64_t) r->settings->idempotency_max_body) {
        d->too_large = 1; /* completed, but only "done" is kept */
        ric_buf_free(&d->body);
        return;
    }
    ric_buf_put(&d->body, p, n);
}

/* A lock lapses lock_ttl after it was written; a request still at work
 * halfway there (a slow upload, a slow upstream, a long answer) writes it
 * again, so it lapses only when its gateway is gone. */
static void
on_refresh(evutil_socket_t fd, short what, void *arg)
{
    ric_request_t *r = arg;
    ric_idem_t *d = r->idem;
    struct timeval tv = ric_ms_to_tv(lock_ttl(r) / 2);
    uint64_t expires;

    (void) fd;
    (void) what;
    /* settled against the lock as it stands, then the new one counts */
    expires = ric_idem_get64(d->lock + RIC_IDEM_REC_LAPSE);
    record_head(d->lock, RIC_IDEM_LOCKED, d, lock_ttl(r));
    ric_idem_record_seal(d->lock, sizeof(d->lock));
    ric_idem_store_settle(d->sc->store, d->key, d->token, d->lock, sizeof(d->lock), lock_ttl(r),
                          (int64_t) expires);
    event_add(&d->refresh, &tv);
}

/* What a stored answer leaves out: what the gateway sets itself when it
 * answers (the framing, Date, Server). */
static int
stored_skips(void *ctx, ric_str_t name)
{
    (void) ctx;
    return ric_str_eq_lower(name, "transfer-encoding") || ric_str_eq_lower(name, "content-length")
           || ric_str_eq_lower(name, "date") || ric_str_eq_lower(name, "server");
}

static void
stored_put(void *ctx, const void *p, size_t n)
{
    ric_buf_put(ctx, p, n);
}

static void
tap(ric_request_t *r, const u_char *p, size_t n)
{
    ric_idem_t *d = r->idem;
    ric_http1_t *h = &r->answer->client;
    const ric_http_msg_t *m = &h->resp;
    const u_char *end, *data;
    size_t dlen;

    if (p == NULL) {
        /* the head: the upstream's end-to-end fields, less what the
         * gateway sets itself when it answers */
        d->captured = 1;
        d->status = m->status;
        d->dechunk = m->body == RIC_BODY_CHUNKED && !h->dechunk;
        ric_http_chunked_init(&d->chunked);
        ric_headers_copy(h->buf, m, stored_skips, stored_put, &d->fields);
        return;
    }
    if (!d->dechunk) {
        keep_body(d, r, p, n);
        return;
    }
    end = p + n;
    while (ric_http_chunked_next(&d->chunked, &p, end, &data, &dlen) == RIC_OK) {
        keep_body(d, r, data, dlen);
    }
}

/* --- settling at finalize ---------------------------------------------------- */

/* When the lock in the store lapses (boot-clock ms). */
static int64_t
lock_expires(const ric_idem_t *d)
{
    return (int64_t) ric_idem_get64(d->lock + RIC_IDEM_REC_LAPSE);
}

/* The key goes: the client may run its request again. */
static void
release(ric_request_t *r, ric_idem_t *d)
{
    ric_idem_store_settle(d->sc->store, d->key, d->token, NULL, 0, 0, lock_expires(d));
    outcome(r, d, "released", RIC_IDEM_N_RELEASED);
}

static void
store_answer(ric_request_t *r, ric_idem_t *d, int bare)
{
    ric_buf_t rec = { NULL, 0, 0 };
    u_char head[RIC_IDEM_REC_HEAD], sizes[6];
    size_t flen = d->fields.len;

    record_head(head, bare ? RIC_IDEM_DONE_BARE : RIC_IDEM_DONE, d,
                r->settings->idempotency_ttl);
    ric_buf_put(&rec, head, sizeof(head));
    if (!bare) {
        sizes[0] = (u_char) (d->status >> 8);
        sizes[1] = (u_char) d->status;
        sizes[2] = (u_char) (flen >> 24);
        sizes[3] = (u_char) (flen >> 16);
        sizes[4] = (u_char) (flen >> 8);
        sizes[5] = (u_char) flen;
        ric_buf_put(&rec, sizes, sizeof(sizes));
        ric_buf_put(&rec, d->fields.data, flen);
        ric_buf_put(&rec, d->body.data, d->body.len);
    }
    ric_idem_record_seal(rec.data, rec.len);
    ric_idem_store_settle(d->sc->store, d->key, d->token, rec.data, rec.len,
                          r->settings->idempotency_ttl, lock_expires(d));
    ric_buf_free(&rec);
    outcome(r, d, bare ? "stored_bare" : "stored", RIC_IDEM_N_STORED);
}

/* A final answer from the upstream is kept; a retryable one (a 5xx, 408,
 * 409, 425, 429, a status of idempotency_store_status, one the route
 * script called "retry") or no answer at all lets the key go, so the
 * client may try again. A request cut off by a stopping
 * worker keeps its lock until idempotency_lock_ttl: nobody knows whether
 * the upstream did it. */
static void
settle_cleanup(void *data)
{
    ric_request_t *r = data;
    ric_idem_t *d = r->idem;

    if (d->refreshing) {
        event_del(&d->refresh);
    }
    if (d->held && d->captured && d->fp_pending
        && (digest(r, d, d->client_key) != RIC_OK || d->fp_pending)) {
        /* the upstream answered before the whole body passed: what it
         * answered was not this body, so nothing is kept for it */
        release(r, d);
    } else if (d->held && d->captured) {
        /* the same rule as the retry decision's, with the store's set:
         * the kill switch, the attempts cap or an unsafe method are no
         * reasons to run a final answer's request again */
        if (!ric_retry_final(r->location->refs.idempotency_release, RIC_CLASS_STATUS, d->status,
                             r->answer_classified)) {
            release(r, d);
        } else {
            /* an answer broken off on its way still happened upstream */
            store_answer(r, d, d->too_large || r->end != RIC_END_ANSWERED);
        }
    } else if (d->held && r->end == RIC_END_ANSWERED) {
        /* the gateway's own answer (502, 504...): the upstream gave none */
        release(r, d);
    } else if (d->held && r->body_mode == RIC_REQ_BODY_STREAM && !r->body_complete) {
        /* its body never reached the upstream whole: nothing can have run */
        release(r, d);
    } else if (d->held) {
        ric_log_error(RIC_LOG_WARN, 0, "a keyed request to location \"%s\" ended before its "
                      "answer (%s): its key stays locked for idempotency_lock_ttl, client: %s",
                      r->location->path,
                      r->end == RIC_END_SHUTDOWN ? "the worker stopped" : "the client left",
                      r->c->peer);
        r->log.idempotency = "left_locked";
    }
    ric_buf_free(&d->fields);
    ric_buf_free(&d->body);
    ric_buf_free(&d->op.found);
}

/* --- the phase ----------------------------------------------------------------- */

static void
on_claimed(ric_idem_op_t *op)
{
    ric_request_t *r = op->data;

    ric_request_async_end(r, &op->async);
    ric_request_resume(r);
}

/* A lock taken for a streamed body carries no fingerprint yet. */
static int
fp_unknown(const u_char *fp)
{
    static const u_char zeros[32];

    return memcmp(fp, zeros, sizeof(zeros)) == 0;
}

/* The record under the key is damaged: whatever idempotency_store_failure
 * says, nothing of it is sent and the request does not run (it may have
 * run before). */
static int
damaged(ric_request_t *r, ric_idem_t *d, const char *what)
{
    char hex[2 * RIC_IDEM_KEY_LEN + 1];

    ric_idem_key_hex(d->key, hex);
    ric_log_error(RIC_LOG_ERR, 0, "idempotency store \"%s\": the record of key digest %s %s: "
                  "answering 503 (stop the gateway and run ricochet -t), client: %s",
                  d->sc->spec, hex, what, r->c->peer);
    outcome(r, d, "store_failed", RIC_IDEM_N_STORE_FAILED);
    return problem(r, 503, "idempotency-store-unavailable", "Idempotency store unavailable",
                   "The gateway cannot check this idempotency key now; nothing was sent. "
                   "Retry the request later with the same key.");
}

/* The store's answer to the claim. */
static int
decide(ric_request_t *r, ric_idem_t *d)
{
    ric_idem_record_t rec;
    struct timeval tv;
    int rc;

    switch (d->op.rc) {
    case RIC_IDEM_CLAIMED:
        d->held = 1;
        evtimer_assign(&d->refresh, r->c->base, on_refresh, r);
        tv = ric_ms_to_tv(lock_ttl(r) / 2);
        event_add(&d->refresh, &tv);
        d->refreshing = 1;
        r->tap = tap;
        /* a client that gives up does not stop what it started: the
         * answer is still kept, for its next try */
        r->outlives_client = 1;
        outcome(r, d, "claimed", RIC_IDEM_N_CLAIMED);
        return RIC_OK;
    case RIC_IDEM_FOUND:
        break;
    default:
        if (r->settings->idempotency_store_failure == RIC_IDEM_FAIL_OPEN) {
            ric_log_error(RIC_LOG_ERR, 0, "idempotency store \"%s\": %s: passing the request "
                          "on without dedupe (idempotency_store_failure open), client: %s",
                          d->sc->spec, d->op.error, r->c->peer);
            outcome(r, d, "store_failed_open", RIC_IDEM_N_PASSED_OPEN);
            return RIC_OK;
        }
        ric_log_error(RIC_LOG_ERR, 0, "idempotency store \"%s\": %s: answering 503 "
                      "(idempotency_store_failure closed), client: %s", d->sc->spec,
                      d->op.error, r->c->peer);
        outcome(r, d, "store_failed", RIC_IDEM_N_STORE_FAILED);
        return problem(r, 503, "idempotency-store-unavailable", "Idempotency store unavailable",
                       "The gateway cannot check this idempotency key now; nothing was sent. "
                       "Retry the request later with the same key.");
    }
    rc = ric_idem_record_parse(d->op.found.data, d->op.found.len, &rec);
    if (rc != RIC_OK) {
        return damaged(r, d, rc == RIC_DECLINED ? "fails its checksum" : "cannot be read");
    }
    if (rec.state == RIC_IDEM_LOCKED && (d->fp_pending || fp_unknown(rec.fp))) {
        goto in_flight; /* a streamed body's fingerprint is known only at its end */
    }
    if (d->fp_pending) {
        /* a completed record: the streamed body is read to its end (and
         * dropped) for its fingerprint before anything is answered */
        if (!r->body_complete) {
            r->body_drop = 1;
            r->body_awaited = 1;
            ric_request_upload_room(r);
            if (r->own_answer) {
                return RIC_DONE; /* it broke on the way */
            }
            if (!r->body_complete) {
                return RIC_AGAIN; /* ric_request_body_done resumes the phase */
            }
        }
        if (digest(r, d, d->client_key) != RIC_OK || d->fp_pending) {
            return ric_request_answer(r, 500, 0);
        }
    }
    if (memcmp(rec.fp, d->fp, sizeof(d->fp)) != 0) {
        outcome(r, d, "mismatch", RIC_IDEM_N_MISMATCH);
        return problem(r, 422, "idempotency-key-reused", "Idempotency key reused",
                       "This idempotency key was used for a different request (method, path, "
                       "query or body). Use a new key for a new request.");
    }
    switch (rec.state) {
    case RIC_IDEM_LOCKED:
    in_flight:
        outcome(r, d, "in_flight", RIC_IDEM_N_IN_FLIGHT);
        return problem(r, 409, "idempotency-key-in-use", "Request in progress",
                       "A request with this idempotency key is being processed. Retry later "
                       "with the same key to get its answer.");
    case RIC_IDEM_DONE:
        outcome(r, d, "replayed", RIC_IDEM_N_REPLAYED);
        return replay(r, d, &rec);
    default:
        outcome(r, d, "not_replayable", RIC_IDEM_N_NOT_REPLAYABLE);
        return problem(r, 409, "idempotency-answer-not-stored", "Request already completed",
                       "A request with this idempotency key completed, but its answer was not "
                       "kept (larger than idempotency_max_body, cut off, or no room in the "
                       "store), so it cannot be replayed.");
    }
}

ric_body_digest_t *
ric_idem_body_digest(const ric_request_t *r)
{
    const ric_idem_store_conf_t *sc = r->location ? r->location->refs.idempotency_store : NULL;
    ric_body_digest_t *bd;

    /* the body streams before on_request runs: a route script may still
     * say an idempotent method's request is not (req.idempotent = false) */
    if (sc == NULL || sc->kind == RIC_IDEM_STORE_OFF
        || (ric_retry_method_idempotent((int) r->msg->method)
            && r->location->refs.script == NULL)) {
        return NULL;
    }
    bd = ric_body_digest_new();
    if (bd == NULL) {
        return NULL;
    }
    fingerprint_head(r, body_digest_piece, bd);
    if (ric_body_digest_add_body(bd, &r->body) != RIC_OK) {
        ric_body_digest_free(bd);
        return NULL;
    }
    return bd;
}

int
ric_idem_phase(ric_request_t *r)
{
    const ric_http_settings_t *s = r->settings;
    ric_idem_store_conf_t *sc;
    ric_idem_t *d = r->idem;
    ric_str_t key;
    const char *why = NULL;
    int rc;

    if (d != NULL) {
        if (r->own_answer) {
            return RIC_DONE; /* the body broke while the phase waited */
        }
        return d->op.async.pending || r->body_awaited ? RIC_AGAIN : decide(r, d);
    }
    if (r->up == NULL || ric_retry_repeatable((int) r->msg->method, r->script_idempotent)) {
        return RIC_OK; /* safe to repeat: nothing to dedupe */
    }
    sc = r->location->refs.idempotency_store;
    if (sc != NULL && sc->kind == RIC_IDEM_STORE_OFF) {
        sc = NULL;
    }
    if (sc == NULL && !s->idempotency_required) {
        return RIC_OK; /* the key is the upstream's business */
    }
    rc = request_key(r, &key, &why);
    if (rc < 0) {
        r->log.idempotency = "bad_key";
        return problem(r, 400, "idempotency-key-invalid", "Invalid idempotency key", why);
    }
    if (rc == 0) {
        if (s->idempotency_required) {
            r->log.idempotency = "missing";
            return problem(r, 400, "idempotency-key-missing", "Idempotency key missing",
                           "This endpoint needs an idempotency key for this method: send the "
                           "request again with one.");
        }
        return RIC_OK;
    }
    if (sc == NULL) {
        return RIC_OK;
    }
    d = ric_pcalloc(r->pool, sizeof(*d));
    d->sc = sc;
    d->client_key = key;
    if (digest(r, d, key) != RIC_OK) {
        return ric_request_answer(r, 500, 0);
    }
    client_digest(r, d);
    new_token(d->token);
    r->idem = d;
    ric_request_cleanup_add(r, settle_cleanup, r);
    record_head(d->lock, RIC_IDEM_LOCKED, d, lock_ttl(r));
    ric_idem_record_seal(d->lock, sizeof(d->lock));
    d->op.done = on_claimed;
    d->op.data = r;
    d->op.key = d->key;
    d->op.token = d->token;
    rc = ric_idem_store_claim(sc->store, d->key, d->lock, sizeof(d->lock), lock_ttl(r),
                              s->idempotency_sync == 1, &d->op);
    if (rc == RIC_AGAIN) {
        ric_request_async_begin(r, &d->op.async);
        return RIC_AGAIN;
    }
    return decide(r, d);
}
