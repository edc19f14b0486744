/* idem_store.h: the idempotency stores (LMDB, Redis) behind one interface: claim a key or read its record, then settle it. */
#ifndef RIC_IDEM_STORE_H
#define RIC_IDEM_STORE_H

#include "ric_core.h"

#include <event2/event.h>
#include <sys/socket.h>

typedef enum {
    RIC_IDEM_STORE_OFF = 0,
    RIC_IDEM_STORE_LMDB,
    RIC_IDEM_STORE_REDIS
} ric_idem_store_kind_t;

typedef struct ric_idem_store_s ric_idem_store_t;
typedef struct ric_idem_store_conf_s ric_idem_store_conf_t;
typedef struct ric_idem_op_s ric_idem_op_t;

/* A kind of store's operations (idem_lmdb.c, idem_redis.c), as the I/O
 * layer's kinds of socket have theirs: the interface below reaches a store
 * only through them. */
typedef struct {
    const char *name;
    /* the master, before any worker: whether the store can be used (NULL:
     * nothing to check; it may come up later) ... */
    int (*check)(ric_idem_store_conf_t *sc, char *err, size_t errlen);
    /* ... and what becomes of a damaged one (NULL: nothing can be) */
    int (*recover)(ric_idem_store_conf_t *sc, int test, char *err, size_t errlen);
    /* a worker's: NULL with err when it cannot be used */
    ric_idem_store_t *(*open)(ric_idem_store_conf_t *sc, struct event_base *base, char *err,
                              size_t errlen);
    void (*close)(ric_idem_store_t *s);
    int (*claim)(ric_idem_store_t *s, const u_char *key, u_char *rec, size_t len, int64_t ttl_ms,
                 int durable, ric_idem_op_t *op);
    void (*settle)(ric_idem_store_t *s, const u_char *key, const u_char *token,
                   const u_char *rec, size_t len, int64_t ttl_ms, int64_t lock_expires);
} ric_idem_store_ops_t;

extern const ric_idem_store_ops_t ric_idem_lmdb_ops;
extern const ric_idem_store_ops_t ric_idem_redis_ops;

/* What a store's requests met, counted by every worker in the shared zone
 * (for metrics): indexes into ric_idem_counters_t.n. */
typedef enum {
    RIC_IDEM_N_CLAIMED = 0,
    RIC_IDEM_N_REPLAYED,
    RIC_IDEM_N_IN_FLIGHT,      /* 409: a repeat while the first runs */
    RIC_IDEM_N_MISMATCH,       /* 422 */
    RIC_IDEM_N_NOT_REPLAYABLE, /* 409: done, its answer not kept */
    RIC_IDEM_N_STORED,
    RIC_IDEM_N_RELEASED,
    RIC_IDEM_N_STORE_FAILED,   /* 503 (closed) */
    RIC_IDEM_N_PASSED_OPEN,    /* passed on without dedupe (open) */
    RIC_IDEM_N_MAX
} ric_idem_count_t;

typedef struct {
    uint64_t n[RIC_IDEM_N_MAX];
    uint64_t settles_lost; /* answers and lock refreshes the store never took while their
                            * lock lived (ric_idem_settle_lost) */
} ric_idem_counters_t;

/* One `idempotency_store` value; routes naming the same store share one. */
struct ric_idem_store_conf_s {
    ric_idem_store_kind_t kind;
    const ric_idem_store_ops_t *ops; /* NULL: off */
    char *spec;          /* as written: "lmdb:/var/lib/ricochet/idem.mdb", "redis://..." */
    char *path;          /* LMDB: the data file (its lock file is PATH-lock) */
    int64_t map_size;    /* LMDB: the map's size in bytes (size=) */
    char *host;          /* Redis: as written */
    char *user, *password; /* Redis: AUTH's, NULL when none (spec shows the password masked) */
    char addr[64];       /* Redis: the numeric address it resolved to */
    int port;
    int db;
    const char *file;    /* where it was first named, for errors */
    int line;
    char damaged[400];   /* LMDB: why the file failed its check when the config was read ("": sound) */
    /* LMDB: the data and lock files as the master's check left them (st_dev,
     * st_ino; the data file's size): a worker uses no other (ino 0: not
     * checked, as in the unit tests) */
    dev_t dev, lock_dev;
    ino_t ino, lock_ino;
    int64_t checked_size;
    ric_idem_store_t *store; /* this worker's open store (opened after fork) */
    ric_idem_counters_t *counters; /* in the shared zone; NULL: not counted */
    ric_idem_store_conf_t *next;
};

/*
 * A record, as both stores keep it (one byte string): a fixed head, then
 * for a completed, replayable answer its status, fields and body.
 *   [0]        state: RIC_IDEM_LOCKED, _DONE (replayable) or _DONE_BARE
 *   [1..8]     expires, Unix milliseconds, big-endian: a done record's on
 *              the wall clock (LMDB checks it; Redis has its own TTL); a
 *              lock's is for reading only (its lapse below times it)
 *   [9..40]    the request's fingerprint (SHA-256)
 *   [41..56]   the token of the request that claimed it: only that request
 *              may settle it (Redis's script reads it at this offset)
 *   [57..64]   a lock's lapse, CLOCK_BOOTTIME milliseconds, big-endian (0
 *              in a done record)
 *   [65..80]   a lock's boot identity (the kernel's boot_id; zeros in a
 *              done record, or when the host has none to read)
 *   [81..96]   the client's digest (idem.c: of its Authorization and
 *              Cookie fields); zeros when it sent neither
 *   [97..112]  checksum: the first 16 bytes of SHA-256 over the record
 *              without these 16 bytes
 *   [113..]    _DONE: status (2 bytes), fields length (4), fields, body
 * Records of the format before the checksum ('L', 'D', 'N', a head of 57
 * bytes, no lapse, boot, client or checksum) are still read: a binary
 * upgrade shares the file.
 */
#define RIC_IDEM_LOCKED 'l'
#define RIC_IDEM_DONE 'd'
#define RIC_IDEM_DONE_BARE 'n' /* completed, but its answer was too large to keep */
#define RIC_IDEM_REC_EXPIRES 1
#define RIC_IDEM_REC_FP 9
#define RIC_IDEM_REC_TOKEN 41
#define RIC_IDEM_TOKEN_LEN 16
#define RIC_IDEM_REC_LAPSE 57
#define RIC_IDEM_REC_BOOT 65
#define RIC_IDEM_REC_CLIENT 81
#define RIC_IDEM_REC_SUM 97
#define RIC_IDEM_ID_LEN 16  /* a boot identity, a client digest, a checksum */
#define RIC_IDEM_REC_HEAD 113
#define RIC_IDEM_OLD_HEAD 57 /* the format before the checksum */
#define RIC_IDEM_KEY_LEN 32

/* A record, read. Spans point into the bytes read. */
typedef struct {
    int state;          /* RIC_IDEM_LOCKED, _DONE or _DONE_BARE (an old record's too) */
    int old;            /* the format before the checksum: no lapse, boot, client */
    uint64_t expires;   /* Unix ms */
    uint64_t lapse;     /* a lock's, boot ms */
    const u_char *fp;   /* 32 bytes */
    const u_char *token;
    const u_char *boot, *client; /* RIC_IDEM_ID_LEN bytes each; NULL in an old record */
    int status;         /* _DONE: the answer's */
    ric_str_t fields;   /* "Name: value\r\n" each */
    ric_str_t body;
} ric_idem_record_t;

/* Reads a record as a store gave it back (it may come from another
 * gateway, or be damaged). RIC_OK; RIC_DECLINED when it fails its
 * checksum (a changed byte anywhere in it); RIC_ERROR when it is not one:
 * too short, an unknown state, a status outside 100..599, fields that do
 * not fit. An old record (no checksum) is checked for its structure only. */
int ric_idem_record_parse(const u_char *rec, size_t len, ric_idem_record_t *out);

/* Writes the checksum of rec (len bytes, a head at least) into it. */
void ric_idem_record_seal(u_char *rec, size_t len);

/* Makes bare (RIC_IDEM_REC_HEAD bytes) the head of rec, a completed
 * answer, as done without its answer, sealed. */
void ric_idem_record_bare(const u_char *rec, u_char *bare);

/* Whether a record (len bytes, RIC_IDEM_OLD_HEAD at least; its checksum
 * is not read) is still live on this host: a done record until its wall
 * expiry; a lock while this boot lasts and its boot-clock lapse has not
 * passed (a wall-clock step changes nothing, a reboot ends it); an old
 * lock, or one written where the boot had no identity, by its wall
 * expiry. LMDB's rule (Redis keeps its own TTLs). */
int ric_idem_record_live(const u_char *rec, size_t len);

/* This boot's identity (RIC_IDEM_ID_LEN bytes, read once per process
 * from /proc/sys/kernel/random/boot_id; zeros when it cannot be read). */
const u_char *ric_idem_boot_id(void);

/* A store that does not answer within this long counts as unreachable. */
#define RIC_IDEM_STORE_TIMEOUT_MS 1000

/* The common head of every open store (each kind's struct starts with it). */
struct ric_idem_store_s {
    ric_idem_store_kind_t kind;
    ric_idem_store_conf_t *conf;
};

/* What a claim found. */
#define RIC_IDEM_CLAIMED 1 /* no live record: ours (the lock) is written */
#define RIC_IDEM_FOUND 2   /* a live record: in op->found */

/* One claim of a request. The caller owns it (in the request's pool) and
 * sets done and data; found and error are filled by the store. */
struct ric_idem_op_s {
    ric_async_t async; /* the request's pending operation while RIC_AGAIN */
    void (*done)(ric_idem_op_t *op);
    void *data;
    const u_char *key, *token; /* the claim's (the caller's, alive while it is pending) */
    int rc;            /* RIC_IDEM_CLAIMED, RIC_IDEM_FOUND or RIC_ERROR */
    ric_buf_t found;   /* the record found (heap: the caller frees it) */
    char error[200];   /* why, when RIC_ERROR */
    /* the store's */
    ric_idem_store_t *store;
    void *pending;     /* Redis: the command in flight */
    struct event *timer;
    uint64_t sync_gen; /* LMDB: the flush that makes the lock durable */
    ric_idem_op_t *next;
};

/* Gives every store of conf its counters in the shared zone (the master,
 * before the first fork). RIC_OK, or RIC_ERROR with a reason in err. */
struct ric_shm_s;
int ric_idem_store_share(ric_conf_t *conf, struct ric_shm_s *zone, char *err, size_t errlen);

/* Counts one of what a store's request met. */
static inline void
ric_idem_count(const ric_idem_store_conf_t *sc, ric_idem_count_t what)
{
    if (sc != NULL && sc->counters != NULL) {
        __atomic_fetch_add(&sc->counters->n[what], 1, __ATOMIC_RELAXED);
    }
}

/* Checks that a store can be used (LMDB: opens, creates the file, and
 * closes it again), in the master before any worker starts. RIC_OK, or
 * RIC_ERROR with a reason in err. */
int ric_idem_store_check(ric_idem_store_conf_t *sc, char *err, size_t errlen);

/* Checks an LMDB file without trusting it: in a child process (a damaged
 * page may crash LMDB), its size against the pages its meta page names,
 * every page of its free list and every record (the record format and its
 * checksum, as ric_idem_record_parse reads them). RIC_OK: sound, or no file yet (also an
 * empty file without its lock file: one never written); RIC_DECLINED:
 * damaged or truncated, why says how; RIC_ERROR: it could not be checked
 * (why says), e.g. it or its lock file cannot be opened for writing by this
 * process: no finding about the file, never moved aside for it. */
int ric_idem_lmdb_verify(const ric_idem_store_conf_t *sc, char *why, size_t len);

/* The master, before any worker starts: every damaged LMDB file of conf
 * (idempotency_store_recover rename) is moved aside to
 * PATH.damaged-TIMESTAMP, logged, and made again empty. With test set
 * (ricochet -t) nothing is moved; what would be is printed. RIC_OK, or
 * RIC_ERROR with a reason in err. */
int ric_idem_store_recover_all(ric_conf_t *conf, int test, char *err, size_t errlen);

#define RIC_IDEM_RECOVER_FAIL 0
#define RIC_IDEM_RECOVER_RENAME 1

/* Opens every store of the list in this worker, on its loop. A store that
 * cannot be opened is logged and answers every claim with RIC_ERROR (the
 * routes' idempotency_store_failure decides). */
void ric_idem_store_open_all(ric_idem_store_conf_t *list, struct event_base *base);

/* Closes them (flushing LMDB). */
void ric_idem_store_close_all(ric_idem_store_conf_t *list);

/*
 * Claims key: when no live record is under it, writes rec (a lock, whose
 * expires field says when it lapses; ttl_ms is the same span for stores
 * that keep their own TTLs) and answers RIC_IDEM_CLAIMED; else copies the
 * live record into op->found and answers RIC_IDEM_FOUND; RIC_ERROR when
 * the store cannot be reached or written (op->error says why). RIC_AGAIN:
 * the answer comes later in op->rc through op->done, unless the request
 * cancels op->async first. durable: the lock is on disk before it counts
 * (LMDB's idempotency_sync on).
 */
int ric_idem_store_claim(ric_idem_store_t *s, const u_char *key, u_char *rec, size_t len,
                         int64_t ttl_ms, int durable, ric_idem_op_t *op);

/* Replaces the record under key by rec (ttl_ms), or removes it (rec NULL),
 * if it still holds token, or, for a record, if nothing is there (our lock
 * lapsed and nobody claimed the key since): a lock claimed again is
 * someone else's. Done in the background. A settle the store cannot take
 * now (unreachable, a failed write) waits in the store's backlog and goes,
 * in order, when it can; one that goes after lock_expires (boot-clock ms:
 * when the lock it settles lapses), or never, is logged with the key's digest. */
void ric_idem_store_settle(ric_idem_store_t *s, const u_char *key, const u_char *token,
                           const u_char *rec, size_t len, int64_t ttl_ms, int64_t lock_expires);

/* --- the backlog of settles a store could not take yet ---------------------- */

#define RIC_IDEM_BACKLOG_MAX 10000 /* settles kept per store and worker */
#define RIC_IDEM_BACKLOG_BYTES (64 << 20) /* ...and their bytes: past them, an answer waits
                                           * as "done" without its body */

typedef struct ric_idem_pending_s ric_idem_pending_t;
struct ric_idem_pending_s {
    u_char key[RIC_IDEM_KEY_LEN];
    u_char token[RIC_IDEM_TOKEN_LEN];
    u_char *rec;          /* owned; NULL: a release */
    size_t len;
    int64_t ttl_ms;
    int64_t lock_expires; /* boot ms */
    int lost;             /* logged and counted as lost already (its lock lapsed) */
    ric_idem_pending_t *next;
};

typedef struct {
    ric_idem_pending_t *head, **tail;
    int n;
    size_t bytes;
} ric_idem_backlog_t;

/* Keeps a copy of a settle at the end of b. An answer that would take b
 * past RIC_IDEM_BACKLOG_BYTES waits as "done" without it (a repeat gets
 * 409, never a second run); when b holds RIC_IDEM_BACKLOG_MAX its oldest
 * is given up (ric_idem_settle_lost). */
void ric_idem_backlog_push(ric_idem_backlog_t *b, const ric_idem_store_conf_t *sc,
                           const u_char *key, const u_char *token, const u_char *rec,
                           size_t len, int64_t ttl_ms, int64_t lock_expires);

/* The oldest settle of b, now the caller's (ric_idem_pending_free), or
 * NULL. One whose lock lapsed meanwhile is lost (ric_idem_backlog_lapsed):
 * it still goes, as the record may still be there for it. */
ric_idem_pending_t *ric_idem_backlog_take(ric_idem_backlog_t *b, const ric_idem_store_conf_t *sc);

/* Every settle of b whose lock lapsed while it waited (answers and
 * refreshes: a repeat may run the request again) is logged and counted as
 * lost, once; it keeps its place. */
void ric_idem_backlog_lapsed(ric_idem_backlog_t *b, const ric_idem_store_conf_t *sc);

/* Puts p back at the head of b (it could not go after all). */
void ric_idem_backlog_unshift(ric_idem_backlog_t *b, ric_idem_pending_t *p);

/* Gives up every settle of b (a worker that exits): each is lost. */
void ric_idem_backlog_drop(ric_idem_backlog_t *b, const ric_idem_store_conf_t *sc);

void ric_idem_pending_free(ric_idem_pending_t *p);

/* Logs at error a settle given up, or one whose lock lapsed before the
 * store took it, with its key's digest (given as the key, or as its 64 hex
 * digits); what says how, and that it is lost. rec is the settle's record:
 * NULL a release, a lock a refresh, else an answer. Unless count is 0 (it
 * was counted before) or it is a release (losing one keeps the key locked
 * only until its lock lapses), it is counted in the store's settles_lost. */
void ric_idem_settle_lost(const ric_idem_store_conf_t *sc, const u_char *key, const u_char *rec,
                          int count, const char *what);
void ric_idem_settle_lost_hex(const ric_idem_store_conf_t *sc, const char *digest,
                              const u_char *rec, int count, const char *what);

/* A record key as 64 lowercase hex digits and a NUL (2 * RIC_IDEM_KEY_LEN + 1 bytes). */
void ric_idem_key_hex(const u_char *key, char *out);

/* The LMDB store's open and close, for its unit tests (the gateway goes
 * through ric_idem_lmdb_ops). */
ric_idem_store_t *ric_idem_lmdb_open(ric_idem_store_conf_t *sc, struct event_base *base,
                                     char *err, size_t errlen);
void ric_idem_lmdb_close(ric_idem_store_t *s);

/* The wall clock in milliseconds (done records outlive processes and
 * hosts), moved by ric_idem_wall_skew_ms (tests move time forward with it). */
int64_t ric_idem_wall_ms(void);
extern int64_t ric_idem_wall_skew_ms;

/* The boot clock (CLOCK_BOOTTIME: steady, counts a suspend) in
 * milliseconds, moved by ric_idem_boot_skew_ms (tests): what locks are
 * timed by. */
int64_t ric_idem_boot_ms(void);
extern int64_t ric_idem_boot_skew_ms;

/* Whether a lock whose lapse field (as idem.c hands it to a settle, its
 * lock_expires: boot-clock ms) says it lapsed by now: the one place that
 * reads the clock locks are timed by. */
int ric_idem_lock_lapsed(int64_t lock_expires);

/* Big-endian helpers for the record's fields. */
void ric_idem_put64(u_char *p, uint64_t v);
uint64_t ric_idem_get64(const u_char *p);

#endif /* RIC_IDEM_STORE_H */
