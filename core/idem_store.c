/* idem_store.c: the one claim/settle interface over the stores' operations tables (ric_idem_store_ops_t), opening them in a worker, their counters, the settle backlog and the lost-settle log. */
#include "idem_store.h"
#include "conf.h"
#include "log.h"
#include "shm.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

int64_t ric_idem_wall_skew_ms;
int64_t ric_idem_boot_skew_ms;

static int64_t
clock_ms(clockid_t id, int64_t skew)
{
    struct timespec ts;

    clock_gettime(id, &ts);
    return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + skew;
}

int64_t
ric_idem_wall_ms(void)
{
    return clock_ms(CLOCK_REALTIME, ric_idem_wall_skew_ms);
}

int64_t
ric_idem_boot_ms(void)
{
    return clock_ms(CLOCK_BOOTTIME, ric_idem_boot_skew_ms);
}

int
ric_idem_lock_lapsed(int64_t lock_expires)
{
    return ric_idem_boot_ms() >= lock_expires;
}

static int
hex_digit(int c)
{
    return c >= '0' && c <= '9' ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

const u_char *
ric_idem_boot_id(void)
{
    static u_char id[RIC_IDEM_ID_LEN];
    static int read_once;
    u_char got[RIC_IDEM_ID_LEN];
    char text[64];
    ssize_t n;
    int fd, i, j = 0, hi = -1, v;

    if (read_once) {
        return id;
    }
    read_once = 1;
    /* one value per boot of the kernel, the same in every process */
    fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return id;
    }
    n = read(fd, text, sizeof(text) - 1);
    close(fd);
    for (i = 0; i < n && j < RIC_IDEM_ID_LEN; i++) {
        if (text[i] == '-') {
            continue;
        }
        if ((v = hex_digit(text[i])) < 0) {
            break;
        }
        if (hi < 0) {
            hi = v;
        } else {
            got[j++] = (u_char) (hi << 4 | v);
            hi = -1;
        }
    }
    if (j == RIC_IDEM_ID_LEN) {
        memcpy(id, got, sizeof(id));
    }
    return id;
}

static int
is_zero(const u_char *p, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++) {
        if (p[i] != 0) {
            return 0;
        }
    }
    return 1;
}

int
ric_idem_record_live(const u_char *rec, size_t len)
{
    if (len < RIC_IDEM_OLD_HEAD) {
        return 0;
    }
    if (rec[0] == RIC_IDEM_LOCKED && len >= RIC_IDEM_REC_HEAD
        && !is_zero(rec + RIC_IDEM_REC_BOOT, RIC_IDEM_ID_LEN)) {
        /* another boot: the host restarted since, and its request with it */
        return memcmp(rec + RIC_IDEM_REC_BOOT, ric_idem_boot_id(), RIC_IDEM_ID_LEN) == 0
               && !ric_idem_lock_lapsed((int64_t) ric_idem_get64(rec + RIC_IDEM_REC_LAPSE));
    }
    return (int64_t) ric_idem_get64(rec + RIC_IDEM_REC_EXPIRES) > ric_idem_wall_ms();
}

/* The checksum of rec: SHA-256 over all of it but the checksum's bytes. */
static int
checksum(const u_char *rec, size_t len, u_char *out)
{
    static EVP_MD_CTX *ctx;
    static EVP_MD *sha256;
    u_char md[32];

    if (ctx == NULL) {
        /* fetched once: an implicit fetch per digest costs more than it */
        ctx = EVP_MD_CTX_new();
        sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
    }
    if (ctx == NULL || sha256 == NULL || EVP_DigestInit_ex(ctx, sha256, NULL) != 1
        || EVP_DigestUpdate(ctx, rec, RIC_IDEM_REC_SUM) != 1
        || EVP_DigestUpdate(ctx, rec + RIC_IDEM_REC_HEAD, len - RIC_IDEM_REC_HEAD) != 1
        || EVP_DigestFinal_ex(ctx, md, NULL) != 1) {
        return RIC_ERROR;
    }
    memcpy(out, md, RIC_IDEM_ID_LEN);
    return RIC_OK;
}

void
ric_idem_record_seal(u_char *rec, size_t len)
{
    if (checksum(rec, len, rec + RIC_IDEM_REC_SUM) != RIC_OK) {
        /* no SHA-256 to be had: a record no reader accepts, never a wrong one */
        memset(rec + RIC_IDEM_REC_SUM, 0, RIC_IDEM_ID_LEN);
        rec[0] = 0;
    }
}

void
ric_idem_record_bare(const u_char *rec, u_char *bare)
{
    memcpy(bare, rec, RIC_IDEM_REC_HEAD);
    bare[0] = RIC_IDEM_DONE_BARE;
    ric_idem_record_seal(bare, RIC_IDEM_REC_HEAD);
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
    const u_char *p;
    u_char sum[RIC_IDEM_ID_LEN];
    size_t flen;

    memset(out, 0, sizeof(*out));
    if (len < RIC_IDEM_OLD_HEAD) {
        return RIC_ERROR;
    }
    switch (rec[0]) {
    case 'L':
    case 'D':
    case 'N':
        /* the format before the checksum: its structure is all there is to check */
        out->old = 1;
        out->state = rec[0] == 'L' ? RIC_IDEM_LOCKED
                     : rec[0] == 'D' ? RIC_IDEM_DONE : RIC_IDEM_DONE_BARE;
        p = rec + RIC_IDEM_OLD_HEAD;
        break;
    case RIC_IDEM_LOCKED:
    case RIC_IDEM_DONE:
    case RIC_IDEM_DONE_BARE:
        if (len < RIC_IDEM_REC_HEAD) {
            return RIC_ERROR;
        }
        if (checksum(rec, len, sum) != RIC_OK
            || memcmp(sum, rec + RIC_IDEM_REC_SUM, sizeof(sum)) != 0) {
            return RIC_DECLINED;
        }
        out->state = rec[0];
        out->lapse = ric_idem_get64(rec + RIC_IDEM_REC_LAPSE);
        out->boot = rec + RIC_IDEM_REC_BOOT;
        out->client = rec + RIC_IDEM_REC_CLIENT;
        p = rec + RIC_IDEM_REC_HEAD;
        break;
    default:
        return RIC_ERROR;
    }
    out->expires = ric_idem_get64(rec + RIC_IDEM_REC_EXPIRES);
    out->fp = rec + RIC_IDEM_REC_FP;
    out->token = rec + RIC_IDEM_REC_TOKEN;
    if (out->state != RIC_IDEM_DONE) {
        return RIC_OK;
    }
    if ((size_t) (rec + len - p) < 6) {
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
    return sc->ops != NULL && sc->ops->check != NULL ? sc->ops->check(sc, err, errlen) : RIC_OK;
}

int
ric_idem_store_recover_all(ric_conf_t *conf, int test, char *err, size_t errlen)
{
    ric_idem_store_conf_t *sc;

    for (sc = conf->http ? conf->http->idem_stores : NULL; sc; sc = sc->next) {
        if (sc->ops != NULL && sc->ops->recover != NULL
            && sc->ops->recover(sc, test, err, errlen) != RIC_OK) {
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
        if (sc->ops == NULL) {
            continue;
        }
        sc->store = sc->ops->open(sc, base, err, sizeof(err));
        if (sc->store == NULL) {
            ric_log_error(RIC_LOG_ALERT, 0, "idempotency store \"%s\" is unusable: %s", sc->spec,
                          err);
        }
    }
}

void
ric_idem_store_close_all(ric_idem_store_conf_t *list)
{
    ric_idem_store_conf_t *sc;

    for (sc = list; sc; sc = sc->next) {
        if (sc->store != NULL) {
            sc->ops->close(sc->store);
            sc->store = NULL;
        }
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
    return s->conf->ops->claim(s, key, rec, len, ttl_ms, durable, op);
}

void
ric_idem_store_settle(ric_idem_store_t *s, const u_char *key, const u_char *token,
                      const u_char *rec, size_t len, int64_t ttl_ms, int64_t lock_expires)
{
    if (s != NULL) {
        s->conf->ops->settle(s, key, token, rec, len, ttl_ms, lock_expires);
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

/* What a settle of rec is, for its log line. */
static const char *
settle_kind(const u_char *rec)
{
    return rec == NULL ? "release" : rec[0] == RIC_IDEM_LOCKED ? "lock refresh" : "answer";
}

void
ric_idem_settle_lost_hex(const ric_idem_store_conf_t *sc, const char *digest, const u_char *rec,
                         int count, const char *what)
{
    ric_log_error(RIC_LOG_ERR, 0, "idempotency store \"%s\": the %s of key digest %.64s %s",
                  sc->spec, settle_kind(rec), digest, what);
    if (count && rec != NULL && sc->counters != NULL) {
        __atomic_fetch_add(&sc->counters->settles_lost, 1, __ATOMIC_RELAXED);
    }
}

void
ric_idem_settle_lost(const ric_idem_store_conf_t *sc, const u_char *key, const u_char *rec,
                     int count, const char *what)
{
    char digest[2 * RIC_IDEM_KEY_LEN + 1];

    ric_idem_key_hex(key, digest);
    ric_idem_settle_lost_hex(sc, digest, rec, count, what);
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
        char digest[2 * RIC_IDEM_KEY_LEN + 1];

        ric_idem_record_bare(rec, bare);
        rec = bare;
        len = sizeof(bare);
        /* not lost: the key stays done, only its body is not kept */
        ric_idem_key_hex(key, digest);
        ric_log_error(RIC_LOG_ERR, 0, "idempotency store \"%s\": the answer of key digest %s "
                      "waits as done without its body: the settles waiting for the store hold "
                      "64 MiB (a repeat gets 409)", sc->spec, digest);
    }
    if (b->n >= RIC_IDEM_BACKLOG_MAX) {
        p = backlog_shift(b);
        ric_idem_settle_lost(sc, p->key, p->rec, !p->lost,
                             "is lost: too many settles wait for the store (its lock lapses at "
                             "idempotency_lock_ttl, then the key can run again)");
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

/* Whether p's lock lapsed while it waited; the first time, it is lost. */
static void
pending_lapsed(ric_idem_pending_t *p, const ric_idem_store_conf_t *sc)
{
    if (p->rec != NULL && !p->lost && ric_idem_lock_lapsed(p->lock_expires)) {
        p->lost = 1;
        ric_idem_settle_lost(sc, p->key, p->rec, 1, "is lost: its lock lapsed before the store "
                             "took it, so a repeat may run the request again (it still goes, "
                             "for a key nobody claimed since)");
    }
}

ric_idem_pending_t *
ric_idem_backlog_take(ric_idem_backlog_t *b, const ric_idem_store_conf_t *sc)
{
    ric_idem_pending_t *p = backlog_shift(b);

    if (p != NULL) {
        pending_lapsed(p, sc);
    }
    return p;
}

void
ric_idem_backlog_lapsed(ric_idem_backlog_t *b, const ric_idem_store_conf_t *sc)
{
    ric_idem_pending_t *p;

    for (p = b->head; p; p = p->next) {
        pending_lapsed(p, sc);
    }
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
        ric_idem_settle_lost(sc, p->key, p->rec, !p->lost,
                             "is lost: the worker exits before the store could take it (the "
                             "key stays locked until idempotency_lock_ttl)");
        ric_idem_pending_free(p);
    }
}
