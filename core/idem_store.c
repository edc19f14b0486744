/* idem_store.c: opening the idempotency stores in a worker, and the one claim/settle interface over LMDB and Redis. */
#include "idem_store.h"
#include "conf.h"
#include "log.h"
#include "shm.h"

#include <errno.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

int64_t ric_idem_wall_skew_ms;

int64_t
ric_idem_wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + ric_idem_wall_skew_ms;
}

void
ric_idem_put64(u_char *p, uint64_t v)
{
    int i;

    for (i = 7; i >= 0; i--) {
        p[i] = (u_char) (v & 0xff);
        v >>= 8;
    }
}

uint64_t
ric_idem_get64(const u_char *p)
{
    uint64_t v = 0;
    int i;

    for (i = 0; i < 8; i++) {
        v = (v << 8) | p[i];
    }
    return v;
}

int
ric_idem_record_parse(const u_char *rec, size_t len, ric_idem_record_t *out)
{
    const u_char *p = rec + RIC_IDEM_REC_HEAD;
    size_t flen;

    memset(out, 0, sizeof(*out));
    if (len < RIC_IDEM_REC_HEAD) {
        return RIC_ERROR;
    }
    out->state = rec[0];
    out->expires = ric_idem_get64(rec + RIC_IDEM_REC_EXPIRES);
    out->fp = rec + RIC_IDEM_REC_FP;
    out->token = rec + RIC_IDEM_REC_TOKEN;
    if (out->state == RIC_IDEM_LOCKED || out->state == RIC_IDEM_DONE_BARE) {
        return RIC_OK;
    }
    if (out->state != RIC_IDEM_DONE || len - RIC_IDEM_REC_HEAD < 6) {
        return RIC_ERROR;
    }
    out->status = (p[0] << 8) | p[1];
    flen = ((size_t) p[2] << 24) | ((size_t) p[3] << 16) | ((size_t) p[4] << 8) | p[5];
    p += 6;
    if (out->status < 100 || out->status > 599 || flen > (size_t) (rec + len - p)) {
        return RIC_ERROR;
    }
    out->fields.data = p;
    out->fields.len = flen;
    out->body.data = p + flen;
    out->body.len = (size_t) (rec + len - (p + flen));
    return RIC_OK;
}

int
ric_idem_store_share(ric_conf_t *conf, struct ric_shm_s *zone, char *err, size_t errlen)
{
    ric_idem_store_conf_t *sc;
    char name[600];
    int created;

    for (sc = conf->http ? conf->http->idem_stores : NULL; sc; sc = sc->next) {
        snprintf(name, sizeof(name), "idempotency:%s",
                 sc->kind == RIC_IDEM_STORE_LMDB ? sc->path : sc->spec);
        sc->counters = ric_shm_entry(zone, name, sizeof(ric_idem_counters_t), &created);
        if (sc->counters == NULL) {
            snprintf(err, errlen, "the shared memory zone has no room for \"%s\"", name);
            return RIC_ERROR;
        }
    }
    return RIC_OK;
}

int
ric_idem_store_check(ric_idem_store_conf_t *sc, char *err, size_t errlen)
{
    ric_idem_store_t *s;
    int rc;

    if (sc->kind != RIC_IDEM_STORE_LMDB) {
        return RIC_OK; /* Redis may come up after us: the gateway reconnects */
    }
    /* a damaged file is never opened for writing: the config decides
     * (idempotency_store_recover) what becomes of it */
    sc->damaged[0] = '\0';
    rc = ric_idem_lmdb_verify(sc, sc->damaged, sizeof(sc->damaged));
    if (rc == RIC_DECLINED) {
        return RIC_OK;
    }
    sc->damaged[0] = '\0';
    if (rc == RIC_ERROR) {
        snprintf(err, errlen, "cannot check LMDB file \"%s\"", sc->path);
        return RIC_ERROR;
    }
    s = ric_idem_lmdb_open(sc, NULL, err, errlen);
    if (s == NULL) {
        return RIC_ERROR;
    }
    ric_idem_lmdb_close(s);
    return RIC_OK;
}

int
ric_idem_store_recover_all(ric_conf_t *conf, int test, char *err, size_t errlen)
{
    ric_idem_store_conf_t *sc;
    char aside[4200], lock[4200];
    struct tm tm;
    time_t now = time(NULL);

    for (sc = conf->http ? conf->http->idem_stores : NULL; sc; sc = sc->next) {
        if (sc->kind != RIC_IDEM_STORE_LMDB || sc->damaged[0] == '\0') {
            continue;
        }
        localtime_r(&now, &tm);
        snprintf(aside, sizeof(aside), "%s.damaged-%04d%02d%02dT%02d%02d%02d", sc->path,
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
        if (test) {
            fprintf(stderr, "ricochet: [warn] idempotency store \"%s\" is damaged (%s): at start "
                    "it is moved aside to %s and a new, empty store is made "
                    "(idempotency_store_recover rename)\n", sc->spec, sc->damaged, aside);
            continue;
        }
        if (rename(sc->path, aside) != 0) {
            snprintf(err, errlen, "idempotency store \"%s\" is damaged (%s) and cannot be moved "
                     "aside to %s: %s", sc->spec, sc->damaged, aside, strerror(errno));
            return RIC_ERROR;
        }
        snprintf(lock, sizeof(lock), "%s-lock", sc->path);
        unlink(lock); /* the old file's readers' table: the new file starts its own */
        ric_log_error(RIC_LOG_ALERT, 0, "idempotency store \"%s\" is damaged (%s): moved aside "
                      "to %s, starting with an empty store: keys it held can run again "
                      "(idempotency_store_recover rename)", sc->spec, sc->damaged, aside);
        sc->damaged[0] = '\0';
        if (ric_idem_store_check(sc, err, errlen) != RIC_OK) {
            return RIC_ERROR;
        }
        if (sc->damaged[0] != '\0') {
            snprintf(err, errlen, "idempotency store \"%s\": the new file is damaged too: %s",
                     sc->spec, sc->damaged);
            return RIC_ERROR;
        }
    }
    return RIC_OK;
}

void
ric_idem_store_open_all(ric_idem_store_conf_t *list, struct event_base *base)
{
    ric_idem_store_conf_t *sc;
    char err[512];

    for (sc = list; sc; sc = sc->next) {
        switch (sc->kind) {
        case RIC_IDEM_STORE_LMDB:
            sc->store = ric_idem_lmdb_open(sc, base, err, sizeof(err));
            if (sc->store == NULL) {
                ric_log_error(RIC_LOG_ALERT, 0, "idempotency store \"%s\" is unusable: %s",
                              sc->spec, err);
            }
            break;
        case RIC_IDEM_STORE_REDIS:
            sc->store = ric_idem_redis_open(sc, base);
            break;
        case RIC_IDEM_STORE_OFF:
            break;
        }
    }
}

void
ric_idem_store_close_all(ric_idem_store_conf_t *list)
{
    ric_idem_store_conf_t *sc;

    for (sc = list; sc; sc = sc->next) {
        if (sc->store == NULL) {
            continue;
        }
        if (sc->kind == RIC_IDEM_STORE_LMDB) {
            ric_idem_lmdb_close(sc->store);
        } else {
            ric_idem_redis_close(sc->store);
        }
        sc->store = NULL;
    }
}

int
ric_idem_store_claim(ric_idem_store_t *s, const u_char *key, u_char *rec, size_t len,
                     int64_t ttl_ms, int durable, ric_idem_op_t *op)
{
    op->store = s;
    op->found.len = 0;
    op->error[0] = '\0';
    if (s == NULL) {
        snprintf(op->error, sizeof(op->error), "the store could not be opened");
        return op->rc = RIC_ERROR;
    }
    if (s->kind == RIC_IDEM_STORE_LMDB) {
        return ric_idem_lmdb_claim(s, key, rec, len, durable, op);
    }
    return ric_idem_redis_claim(s, key, rec, len, ttl_ms, op);
}

void
ric_idem_store_settle(ric_idem_store_t *s, const u_char *key, const u_char *token,
                      const u_char *rec, size_t len, int64_t ttl_ms, int64_t lock_expires)
{
    if (s == NULL) {
        return;
    }
    if (s->kind == RIC_IDEM_STORE_LMDB) {
        ric_idem_lmdb_settle(s, key, token, rec, len, lock_expires);
    } else {
        ric_idem_redis_settle(s, key, token, rec, len, ttl_ms, lock_expires);
    }
}

/* --- the backlog -------------------------------------------------------------- */

void
ric_idem_key_hex(const u_char *key, char *out)
{
    static const char hex[] = "0123456789abcdef";
    int i;

    for (i = 0; i < RIC_IDEM_KEY_LEN; i++) {
        out[2 * i] = hex[key[i] >> 4];
        out[2 * i + 1] = hex[key[i] & 15];
    }
    out[2 * RIC_IDEM_KEY_LEN] = '\0';
}

void
ric_idem_settle_lost_hex(const ric_idem_store_conf_t *sc, const char *digest, int release,
                         const char *what)
{
    ric_log_error(RIC_LOG_ERR, 0, "idempotency store \"%s\": the %s of key digest %.64s %s",
                  sc->spec, release ? "release" : "answer", digest, what);
}

void
ric_idem_settle_lost(const ric_idem_store_conf_t *sc, const u_char *key, int release,
                     const char *what)
{
    char digest[2 * RIC_IDEM_KEY_LEN + 1];

    ric_idem_key_hex(key, digest);
    ric_idem_settle_lost_hex(sc, digest, release, what);
}

void
ric_idem_pending_free(ric_idem_pending_t *p)
{
    if (p != NULL) {
        free(p->rec);
        free(p);
    }
}

static ric_idem_pending_t *
backlog_shift(ric_idem_backlog_t *b)
{
    ric_idem_pending_t *p = b->head;

    if (p != NULL) {
        b->head = p->next;
        if (b->head == NULL) {
            b->tail = &b->head;
        }
        b->n--;
        b->bytes -= p->len;
        p->next = NULL;
    }
    return p;
}

void
ric_idem_backlog_push(ric_idem_backlog_t *b, const ric_idem_store_conf_t *sc, const u_char *key,
                      const u_char *token, const u_char *rec, size_t len, int64_t ttl_ms,
                      int64_t lock_expires)
{
    ric_idem_pending_t *p;
    u_char bare[RIC_IDEM_REC_HEAD];

    if (b->tail == NULL) {
        b->tail = &b->head;
    }
    if (rec != NULL && len > RIC_IDEM_REC_HEAD && rec[0] == RIC_IDEM_DONE
        && b->bytes + len > RIC_IDEM_BACKLOG_BYTES) {
        memcpy(bare, rec, RIC_IDEM_REC_HEAD);
        bare[0] = RIC_IDEM_DONE_BARE;
        rec = bare;
        len = sizeof(bare);
        ric_idem_settle_lost(sc, key, 0, "waits as done without its body: the settles waiting "
                             "for the store hold 64 MiB (a repeat gets 409)");
    }
    if (b->n >= RIC_IDEM_BACKLOG_MAX) {
        p = backlog_shift(b);
        ric_idem_settle_lost(sc, p->key, p->rec == NULL,
                             "was given up: too many settles wait for the store (its lock "
                             "lapses at idempotency_lock_ttl, then the key can run again)");
        ric_idem_pending_free(p);
    }
    p = ric_xcalloc(1, sizeof(*p));
    memcpy(p->key, key, RIC_IDEM_KEY_LEN);
    memcpy(p->token, token, RIC_IDEM_TOKEN_LEN);
    if (rec != NULL) {
        p->rec = ric_xmalloc(len ? len : 1);
        memcpy(p->rec, rec, len);
        p->len = len;
    }
    p->ttl_ms = ttl_ms;
    p->lock_expires = lock_expires;
    *b->tail = p;
    b->tail = &p->next;
    b->n++;
    b->bytes += p->len;
}

ric_idem_pending_t *
ric_idem_backlog_take(ric_idem_backlog_t *b, const ric_idem_store_conf_t *sc)
{
    ric_idem_pending_t *p = backlog_shift(b);

    if (p != NULL && p->rec != NULL && ric_idem_wall_ms() >= p->lock_expires) {
        ric_idem_settle_lost(sc, p->key, 0, "goes after its lock lapsed: a repeat that came "
                             "in between may have run the request again");
    }
    return p;
}

void
ric_idem_backlog_unshift(ric_idem_backlog_t *b, ric_idem_pending_t *p)
{
    if (b->tail == NULL || b->head == NULL) {
        b->tail = &p->next;
    }
    p->next = b->head;
    b->head = p;
    b->n++;
    b->bytes += p->len;
}

void
ric_idem_backlog_drop(ric_idem_backlog_t *b, const ric_idem_store_conf_t *sc)
{
    ric_idem_pending_t *p;

    while ((p = backlog_shift(b)) != NULL) {
        ric_idem_settle_lost(sc, p->key, p->rec == NULL,
                             "is lost: the worker exits before the store could take it (the "
                             "key stays locked until idempotency_lock_ttl)");
        ric_idem_pending_free(p);
    }
}
