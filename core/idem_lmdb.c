/* idem_lmdb.c: the embedded idempotency store: one LMDB file shared by every worker, short write transactions on the loop, fsync on a thread. */
#include "idem_store.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdio.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static void lmdb_settle(ric_idem_store_t *base, const u_char *key, const u_char *token,
                        const u_char *rec, size_t len, int64_t ttl_ms, int64_t lock_expires);

#define SWEEP_EVERY_MS 1000 /* expired records are swept this often */
#define FLUSH_EVERY_MS 5000 /* idempotency_sync off: the file is flushed this often */
#define SWEEP_AT_ONCE 1024  /* records looked at per sweep: one short transaction */
#define SWEEP_BUSY_MS 50    /* ...and again this soon while it finds expired ones */
#define SWEEP_SUMS_BYTES (16 << 20) /* ...and bytes of expired records checked per sweep */
#define DAMAGE_LOG_MS 60000 /* a damaged record the sweep keeps meeting is logged this often */
#define ROOM_AT_ONCE 4096   /* records looked at to make room in a full map */
#define HIGH_WATER_PCT 80   /* claims stop above this much of the map: deletes need room too */
#define ANSWERS_PCT 90      /* answers are kept as "done" only above this much */
#define RC_REFUSED (-40000) /* the store is not the one opened any more: never written again */

typedef struct {
    ric_idem_store_t base;
    MDB_env *env;
    MDB_dbi dbi;
    struct event *tick;   /* the sweep and the periodic flush */
    struct event *synced; /* the flusher finished one: efd is readable */
    int efd;
    int dirty;            /* written since the last flush was asked */
    int64_t flushed_ms;   /* when the last periodic flush was asked */
    u_char sweep_from[RIC_IDEM_KEY_LEN]; /* where the next sweep starts */
    int sweep_has;
    int swept_all;        /* the last sweep looked at fewer records than it could */
    int64_t damage_logged_ms; /* when the sweep last logged a damaged record */

    /* the flusher thread: mdb_env_sync off the loop */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t want_gen, done_gen; /* flushes asked / done */
    int sync_err;
    int stop;
    ric_idem_op_t *waiting; /* durable claims waiting for their flush */

    /* claims and settles of one turn of the loop, done in one transaction */
    struct event *batch;
    struct batch_item_s *queue, **queue_tail;
    ric_idem_backlog_t backlog; /* settles whose write failed: tried again each tick */
    const u_char *map;    /* the map (WRITEMAP: every value lies in it), else NULL */
    size_t map_size;
    int writemap;
    pthread_mutex_t map_mu; /* a resize remaps while the flusher would sync the old map */

    /* the files this store opened: checked before each write transaction */
    char *lock_path;
    dev_t dev, lock_dev;
    ino_t ino, lock_ino;
    int64_t file_size;    /* the data file's at open: a file that shrinks faults the map */
    char broken[320];     /* why it is refused from now on ("": sound) */
} lmdb_store_t;

/* A claim or a settle waiting for the turn's transaction. */
typedef struct batch_item_s {
    ric_idem_op_t *op; /* a claim's; NULL: a settle, or a claim given up */
    int claim;
    int durable;
    u_char key[RIC_IDEM_KEY_LEN];
    u_char token[RIC_IDEM_TOKEN_LEN];
    u_char *rec;       /* owned; a settle's NULL: release */
    size_t len;
    int64_t lock_expires; /* a settle's: when the lock it settles lapses */
    int kept;          /* a settle moved to the backlog, behind older ones */
    int rc;            /* the claim's outcome in the transaction */
    struct batch_item_s *next;
} batch_item_t;

static void on_batch(evutil_socket_t fd, short what, void *arg);
static void backlog_retry(lmdb_store_t *s);
static int txn_begin(lmdb_store_t *s, MDB_txn **txn);
static int store_sound(lmdb_store_t *s);

static void *
flusher(void *arg)
{
    lmdb_store_t *s = arg;
    uint64_t gen, one = 1;
    int rc;

    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->stop && s->want_gen == s->done_gen) {
            pthread_cond_wait(&s->cv, &s->mu);
        }
        if (s->want_gen == s->done_gen) {
            break; /* stopping, and nothing is left to flush */
        }
        gen = s->want_gen;
        pthread_mutex_unlock(&s->mu);
        pthread_mutex_lock(&s->map_mu);
        rc = mdb_env_sync(s->env, 1);
        pthread_mutex_unlock(&s->map_mu);
        pthread_mutex_lock(&s->mu);
        s->done_gen = gen;
        s->sync_err = rc;
        if (write(s->efd, &one, sizeof(one)) < 0) {
            /* the counter is full: the loop has wake-ups enough */
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Asks for a flush of everything committed so far; returns its number. */
static uint64_t
flush_ask(lmdb_store_t *s)
{
    uint64_t gen;

    s->dirty = 0;
    pthread_mutex_lock(&s->mu);
    gen = ++s->want_gen;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return gen;
}

static void
on_synced(evutil_socket_t fd, short what, void *arg)
{
    lmdb_store_t *s = arg;
    uint64_t n, done;
    int err;
    ric_idem_op_t *op, **pp;

    (void) what;
    if (read(fd, &n, sizeof(n)) < 0) {
        return;
    }
    pthread_mutex_lock(&s->mu);
    done = s->done_gen;
    err = s->sync_err;
    pthread_mutex_unlock(&s->mu);
    if (err != 0) {
        ric_log_error(RIC_LOG_CRIT, 0, "idempotency store \"%s\": flushing to disk failed: %s",
                      s->base.conf->spec, mdb_strerror(err));
    }
    /* one at a time from the head: a done() may cancel others */
    for (;;) {
        for (pp = &s->waiting; *pp && (*pp)->sync_gen > done; pp = &(*pp)->next) {
        }
        if ((op = *pp) == NULL) {
            break;
        }
        *pp = op->next;
        op->next = NULL;
        if (err != 0) {
            snprintf(op->error, sizeof(op->error), "flushing the lock to disk failed: %s",
                     mdb_strerror(err));
        }
        op->rc = err != 0 ? RIC_ERROR : RIC_IDEM_CLAIMED;
        op->done(op);
    }
}

static void
cancel_wait(ric_async_t *a)
{
    ric_idem_op_t *op = a->data, **pp;
    lmdb_store_t *s = (lmdb_store_t *) op->store;

    if (op->pending != NULL) {
        ((batch_item_t *) op->pending)->op = NULL; /* queued: skipped, nothing written */
        op->pending = NULL;
        return;
    }
    for (pp = &s->waiting; *pp; pp = &(*pp)->next) {
        if (*pp == op) {
            *pp = op->next;
            /* the lock was written, for a request that is gone now */
            lmdb_settle(&s->base, op->key, op->token, NULL, 0, 0, 0);
            break;
        }
    }
    op->next = NULL;
}

/* Whether an expired record may go: it is sound (a damaged byte must not
 * make a record look expired and free its key: it stays, and its key's
 * requests are answered 503). */
static int
sweepable(lmdb_store_t *s, const MDB_val *k, const MDB_val *v)
{
    ric_idem_record_t rec;
    char hex[2 * RIC_IDEM_KEY_LEN + 1];

    if (k->mv_size != RIC_IDEM_KEY_LEN) {
        return 1; /* make_room's mark */
    }
    if (ric_idem_record_parse(v->mv_data, v->mv_size, &rec) == RIC_OK) {
        return 1;
    }
    if (ric_now_ms() - s->damage_logged_ms >= DAMAGE_LOG_MS) {
        s->damage_logged_ms = ric_now_ms();
        ric_idem_key_hex(k->mv_data, hex);
        ric_log_error(RIC_LOG_ERR, 0, "idempotency store \"%s\": the record of key digest %s is "
                      "damaged (it fails its checksum, or is no record): it is kept, and its "
                      "key answered 503 (stop the gateway and run ricochet -t)",
                      s->base.conf->spec, hex);
    }
    return 0;
}

/* Looks at up to at_once records from where the last sweep ended and
 * deletes the expired ones (a lock by its boot clock, never by the wall
 * clock). Returns how many it deleted. */
static int
sweep(lmdb_store_t *s, int at_once)
{
    MDB_txn *txn;
    MDB_cursor *cur;
    MDB_val k, v;
    int rc, seen = 0, gone = 0;
    size_t summed = 0;

    if (txn_begin(s, &txn) != 0) { /* a resize taken, a changed file refused */
        return 0;
    }
    if (mdb_cursor_open(txn, s->dbi, &cur) != 0) {
        mdb_txn_abort(txn);
        return 0;
    }
    k.mv_data = s->sweep_from;
    k.mv_size = sizeof(s->sweep_from);
    rc = mdb_cursor_get(cur, &k, &v, s->sweep_has ? MDB_SET_RANGE : MDB_FIRST);
    while (rc == 0 && seen++ < at_once && summed < SWEEP_SUMS_BYTES) {
        if (k.mv_size != RIC_IDEM_KEY_LEN || !ric_idem_record_live(v.mv_data, v.mv_size)) {
            summed += v.mv_size;
            if (sweepable(s, &k, &v) && mdb_cursor_del(cur, 0) == 0) {
                gone++;
            }
        }
        rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
    }
    s->swept_all = seen <= at_once && summed < SWEEP_SUMS_BYTES;
    s->sweep_has = rc == 0 && k.mv_size == sizeof(s->sweep_from);
    if (s->sweep_has) {
        memcpy(s->sweep_from, k.mv_data, sizeof(s->sweep_from));
    }
    mdb_cursor_close(cur);
    if (mdb_txn_commit(txn) != 0) {
        return 0;
    }
    if (gone > 0) {
        s->dirty = 1;
    }
    return gone;
}

/* A full map: expired records go now. Pages a transaction frees are
 * reusable only two commits later (LMDB keeps the previous snapshot), so
 * a second, tiny transaction follows the sweep: what the sweep freed
 * serves the claim after them. Returns whether anything was freed. */
static int
make_room(lmdb_store_t *s)
{
    static u_char mark_key[1], mark[8];
    MDB_txn *txn;
    MDB_val k = { sizeof(mark_key), mark_key }, v = { sizeof(mark), mark };
    int gone = sweep(s, ROOM_AT_ONCE);

    if (gone > 0 && txn_begin(s, &txn) == 0) {
        /* a value too short to be a record: the next sweep deletes it */
        ric_idem_put64(mark, (uint64_t) ric_idem_wall_ms());
        if (mdb_put(txn, s->dbi, &k, &v, 0) == 0) {
            mdb_txn_commit(txn);
        } else {
            mdb_txn_abort(txn);
        }
    }
    return gone > 0;
}

/* Whether the records fill more than HIGH_WATER_PCT of the map: then a
 * claim is refused (as a full map) while deletes and settles still find
 * the pages they need. */
static int
filled_over(lmdb_store_t *s, MDB_txn *txn, uint64_t extra, int pct)
{
    MDB_stat st;
    uint64_t used, pages;

    if (mdb_stat(txn, s->dbi, &st) != 0 || st.ms_psize == 0) {
        return 0;
    }
    used = (uint64_t) st.ms_branch_pages + st.ms_leaf_pages + st.ms_overflow_pages
           + extra / st.ms_psize + 1;
    pages = (uint64_t) s->map_size / st.ms_psize; /* the map's, after any resize */
    return used * 100 > pages * (uint64_t) pct;
}

static int
nearly_full(lmdb_store_t *s, MDB_txn *txn)
{
    return filled_over(s, txn, 0, HIGH_WATER_PCT);
}

static void
on_tick(evutil_socket_t fd, short what, void *arg)
{
    lmdb_store_t *s = arg;

    struct timeval tv;
    int gone;

    (void) fd;
    (void) what;
    /* a file shrunk under the map faults whatever reads it: none is read
     * unless the file is still the one opened, whole */
    gone = 0;
    if (store_sound(s) == 0) {
        backlog_retry(s);
        gone = sweep(s, SWEEP_AT_ONCE);
    }

    /* while it keeps finding expired records, it comes back soon */
    tv = ric_ms_to_tv(gone > 0 && !s->swept_all ? SWEEP_BUSY_MS : SWEEP_EVERY_MS);
    event_add(s->tick, &tv);
    /* idempotency_sync off: at most this much is only in the page cache
     * (a flush write-protects the pages it cleans, and the next write to
     * each faults: flushing more often costs more than its write) */
    if (s->dirty && s->broken[0] == '\0' && ric_now_ms() - s->flushed_ms >= FLUSH_EVERY_MS) {
        s->flushed_ms = ric_now_ms();
        flush_ask(s);
    }
}

/* Reserves the file's size on disk. A page written through the map that
 * the filesystem cannot back (a full disk) kills the process with SIGBUS,
 * where a write(2) would return ENOSPC: the map is written in place only
 * when every page of it is reserved. 1: reserved; 0: the filesystem cannot
 * reserve (the map is then written with pwrite); -1 with errno: no. */
static int
reserve(const char *path, int64_t size)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600), rc, e;

    if (fd == -1) {
        return -1;
    }
    /* the blocks, not the length: LMDB makes a new file its own only while
     * it is empty, and gives it its length itself */
    rc = fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, (off_t) size);
    e = errno;
    close(fd);
    errno = e;
    if (rc == 0) {
        return 1;
    }
    return errno == EOPNOTSUPP || errno == ENOSYS ? 0 : -1;
}

/* --- the check of a file at start ------------------------------------------ */

#define VERIFY_DAMAGED 3     /* the child's exit code for a finding */
#define VERIFY_ERROR 4       /* ...and for a file it could not open (not a finding) */
#define VERIFY_LIMIT_S 300   /* a check that runs longer is given up */

/*
 * LMDB trusts its pages: a reader follows a page number into whatever is
 * there, and a writer frees the number a page's own head gives, so one
 * damaged head becomes a free list that crashes every later write. The
 * walk below checks what LMDB does not, from LMDB 0.9's file format (its
 * data.mdb layout, stable across 0.9): every page of both trees carries its
 * own number and a known kind, every child and overflow run lies inside the
 * file, and the pages found are the pages the meta page counts.
 */
#define PAGE_HEAD 16         /* pgno (8), pad (2), flags (2), lower/upper (2+2) or pages (4) */
#define P_BRANCH 0x01
#define P_LEAF 0x02
#define P_OVERFLOW 0x04
#define F_BIGDATA 0x01       /* a leaf node whose value is an overflow run */
#define META_DBS 40          /* mm_dbs[2] in a meta page, each 48 bytes */
#define META_LAST_PG 136
#define META_TXNID 144
#define DB_SIZE 48
#define DB_DEPTH 6
#define DB_PAGES 8           /* branch, leaf, overflow pages: three pgno_t */
#define DB_ROOT 40
#define MAX_DEPTH 32

typedef struct {
    const u_char *map;
    size_t psize;
    uint64_t last;           /* the last page in use */
    uint64_t seen;           /* pages met: branch, leaf, overflow */
    char *why;
    size_t len;
} tree_walk_t;

static uint64_t
get_word(const u_char *p)
{
    uint64_t v;

    memcpy(&v, p, sizeof(v));
    return v;
}

static uint16_t
get_half(const u_char *p)
{
    uint16_t v;

    memcpy(&v, p, sizeof(v));
    return v;
}

/* The page pgno of a tree, and everything under it. 0, or -1 (w->why). */
static int
walk_page(tree_walk_t *w, uint64_t pgno, int depth, const char *tree)
{
    const u_char *page, *node;
    uint16_t flags, lower, off, ksize, nflags;
    uint64_t child, pages;
    size_t i, n;

    if (pgno < 2 || pgno > w->last || depth > MAX_DEPTH) {
        snprintf(w->why, w->len, "its %s tree names page %llu, outside the file's 2..%llu",
                 tree, (unsigned long long) pgno, (unsigned long long) w->last);
        return -1;
    }
    page = w->map + pgno * w->psize;
    if (get_word(page) != pgno) {
        snprintf(w->why, w->len, "page %llu of its %s tree says it is page %llu", (unsigned
                 long long) pgno, tree, (unsigned long long) get_word(page));
        return -1;
    }
    flags = get_half(page + 10);
    w->seen++;
    if (flags & P_OVERFLOW) {
        snprintf(w->why, w->len, "page %llu of its %s tree is an overflow page",
                 (unsigned long long) pgno, tree);
        return -1;
    }
    lower = get_half(page + 12);
    if (!(flags & (P_BRANCH | P_LEAF)) || lower < PAGE_HEAD || lower > w->psize) {
        snprintf(w->why, w->len, "page %llu of its %s tree is of no known kind",
                 (unsigned long long) pgno, tree);
        return -1;
    }
    n = (size_t) (lower - PAGE_HEAD) / 2;
    for (i = 0; i < n; i++) {
        off = get_half(page + PAGE_HEAD + 2 * i);
        if (off < PAGE_HEAD || (size_t) off + 8 > w->psize) {
            snprintf(w->why, w->len, "a node of page %llu lies outside it",
                     (unsigned long long) pgno);
            return -1;
        }
        node = page + off;
        nflags = get_half(node + 4);
        ksize = get_half(node + 6);
        if (flags & P_BRANCH) {
            child = get_half(node) | ((uint64_t) get_half(node + 2) << 16)
                    | ((uint64_t) nflags << 32);
            if (walk_page(w, child, depth + 1, tree) != 0) {
                return -1;
            }
            continue;
        }
        if (!(nflags & F_BIGDATA)) {
            continue; /* the value is in the leaf: the record check reads it */
        }
        if ((size_t) off + 8 + ksize + 8 > w->psize) {
            snprintf(w->why, w->len, "a node of page %llu lies outside it",
                     (unsigned long long) pgno);
            return -1;
        }
        child = get_word(node + 8 + ksize);
        if (child < 2 || child > w->last || get_word(w->map + child * w->psize) != child
            || !(get_half(w->map + child * w->psize + 10) & P_OVERFLOW)) {
            snprintf(w->why, w->len, "a value on page %llu names page %llu, which is not its "
                     "overflow page", (unsigned long long) pgno, (unsigned long long) child);
            return -1;
        }
        pages = get_word(w->map + child * w->psize + 12) & 0xffffffffu;
        if (pages == 0 || child + pages - 1 > w->last) {
            snprintf(w->why, w->len, "the overflow run at page %llu reaches past the file",
                     (unsigned long long) child);
            return -1;
        }
        w->seen += pages;
    }
    return 0;
}

/* Both trees of the snapshot txnid (the caller's read transaction, which
 * keeps writers off its pages), against what its meta page counts. 0, or
 * -1 (why); 1: no meta page holds that snapshot any more (a busy writer
 * moved on twice): the caller begins again. */
static int
walk_trees(const char *path, size_t psize, uint64_t file_size, uint64_t txnid, char *why,
           size_t len)
{
    tree_walk_t w = { NULL, psize, 0, 0, why, len };
    u_char meta[META_TXNID + 8];
    const u_char *db, *slot;
    uint64_t counted = 0;
    int fd, i, j, rc = -1;
    void *map;

    if (file_size < 2 * psize) {
        snprintf(why, len, "it is shorter than its two meta pages");
        return -1;
    }
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) == -1) {
        snprintf(why, len, "it cannot be read: %s", strerror(errno));
        return -1;
    }
    map = mmap(NULL, (size_t) file_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) {
        snprintf(why, len, "it cannot be mapped: %s", strerror(errno));
        return -1;
    }
    w.map = map;
    /* the meta page of our snapshot, copied whole before it can change */
    for (i = 0, slot = NULL; i < 2 && slot == NULL; i++) {
        if (get_word(w.map + i * psize + META_TXNID) == txnid) {
            memcpy(meta, w.map + i * psize, sizeof(meta));
            slot = get_word(w.map + i * psize + META_TXNID) == txnid ? meta : NULL;
        }
    }
    if (slot == NULL) {
        rc = 1;
        goto done;
    }
    w.last = get_word(meta + META_LAST_PG);
    if ((w.last + 1) * psize > file_size) {
        snprintf(why, len, "it is truncated: its pages reach byte %llu, the file has %llu",
                 (unsigned long long) ((w.last + 1) * psize), (unsigned long long) file_size);
        goto done;
    }
    for (i = 0; i < 2; i++) {
        db = meta + META_DBS + i * DB_SIZE;
        for (j = 0; j < 3; j++) {
            counted += get_word(db + DB_PAGES + 8 * j);
        }
        if (get_word(db + DB_ROOT) != ~(uint64_t) 0
            && walk_page(&w, get_word(db + DB_ROOT), get_half(db + DB_DEPTH) > MAX_DEPTH
                                                         ? MAX_DEPTH + 1 : 0,
                         i == 0 ? "free-list" : "records") != 0) {
            goto done;
        }
    }
    if (w.seen != counted) {
        snprintf(why, len, "its trees hold %llu pages where its meta page counts %llu",
                 (unsigned long long) w.seen, (unsigned long long) counted);
        goto done;
    }
    rc = 0;
done:
    munmap(map, (size_t) file_size);
    return rc;
}

/* What LMDB 0.9 takes from a meta page without a look: the page size
 * (mm_dbs[0].md_pad), by which it divides and sizes everything (a page
 * size of 0 stops it with SIGFPE, a small one wraps its limits). The
 * meta pages LMDB would take (meta flag and magic) must give a power of
 * two it can have written (512 B .. 64 KiB: MAX_PAGESIZE). 0 sound, else
 * why holds the finding. */
#define P_META 0x08
#define META_MAGIC 16
#define MDB_MAGIC_WORD 0xBEEFC0DEu
static int
meta_sound(const char *path, off_t file_size, char *why, size_t len)
{
    u_char page[META_DBS + 4];
    uint32_t magic, psize;
    off_t off = 0;
    int fd, i, rc = 0;

    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) == -1) {
        return 0; /* LMDB's open says why */
    }
    for (i = 0; i < 2 && off + (off_t) sizeof(page) <= file_size; i++) {
        if (pread(fd, page, sizeof(page), off) != (ssize_t) sizeof(page)) {
            break;
        }
        memcpy(&magic, page + META_MAGIC, sizeof(magic));
        memcpy(&psize, page + META_DBS, sizeof(psize));
        if (!(get_half(page + 10) & P_META) || magic != MDB_MAGIC_WORD) {
            break; /* not a meta page: LMDB refuses it itself */
        }
        if (psize < 512 || psize > 65536 || (psize & (psize - 1)) != 0) {
            snprintf(why, len, "its meta page %d gives a page size of %u bytes", i, psize);
            rc = -1;
            break;
        }
        off += psize; /* where LMDB reads the second, by the first's size */
    }
    close(fd);
    return rc;
}

/* The child's walk: 0 sound, VERIFY_ERROR when it could not open the file,
 * else why holds the finding. */
static int
verify_walk(const ric_idem_store_conf_t *sc, off_t file_size, char *why, size_t len)
{
    MDB_env *env = NULL;
    MDB_txn *txn = NULL;
    MDB_cursor *cur = NULL;
    MDB_envinfo info;
    MDB_stat st, db;
    MDB_val k, v;
    MDB_dbi dbi;
    ric_idem_record_t rec;
    char hex[2 * RIC_IDEM_KEY_LEN + 1];
    size_t count, i, pg;
    uint64_t need, entries = 0;
    int rc, found = 1, tries, parsed;

    if (meta_sound(sc->path, file_size, why, len) != 0) {
        goto done;
    }
    if ((rc = mdb_env_create(&env)) != 0 || (rc = mdb_env_set_mapsize(env, (size_t) sc->map_size))
        || (rc = mdb_env_open(env, sc->path, MDB_NOSUBDIR | MDB_RDONLY | MDB_NORDAHEAD, 0600))) {
        snprintf(why, len, "LMDB cannot open it: %s", mdb_strerror(rc));
        found = rc > 0 ? VERIFY_ERROR : 1; /* an errno: the system's refusal, not the file's */
        goto done;
    }
    if ((rc = mdb_env_info(env, &info)) != 0 || (rc = mdb_env_stat(env, &st)) != 0) {
        snprintf(why, len, "its meta pages cannot be read: %s", mdb_strerror(rc));
        goto done;
    }
    need = ((uint64_t) info.me_last_pgno + 1) * st.ms_psize;
    if (need > (uint64_t) file_size) {
        snprintf(why, len, "it is truncated: its pages reach byte %llu, the file has %llu",
                 (unsigned long long) need, (unsigned long long) file_size);
        goto done;
    }
    for (tries = 0;; tries++) {
        if ((rc = mdb_txn_begin(env, NULL, MDB_RDONLY, &txn)) != 0
            || (rc = mdb_dbi_open(txn, NULL, 0, &dbi)) != 0) {
            snprintf(why, len, "its main database cannot be read: %s", mdb_strerror(rc));
            goto done;
        }
        rc = walk_trees(sc->path, st.ms_psize, (uint64_t) file_size, (uint64_t) mdb_txn_id(txn),
                        why, len);
        if (rc < 0) {
            goto done;
        }
        if (rc == 0 || tries == 10) {
            break; /* a file a gateway writes that fast is read below, as LMDB reads it */
        }
        mdb_txn_abort(txn);
        txn = NULL;
    }
    /* the free list: pages a writer will reuse must be pages of the file */
    if ((rc = mdb_cursor_open(txn, 0, &cur)) == 0) {
        for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
             rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
            if (v.mv_size < sizeof(size_t)) {
                snprintf(why, len, "a free-list entry of %zu bytes", v.mv_size);
                goto done;
            }
            memcpy(&count, v.mv_data, sizeof(count));
            if (count > v.mv_size / sizeof(size_t) - 1) {
                snprintf(why, len, "a free-list entry names %zu pages in %zu bytes", count,
                         v.mv_size);
                goto done;
            }
            for (i = 1; i <= count; i++) {
                memcpy(&pg, (const char *) v.mv_data + i * sizeof(size_t), sizeof(pg));
                if (pg < 2 || pg > info.me_last_pgno) {
                    snprintf(why, len, "its free list names page %zu, outside the file's 2..%zu",
                             pg, info.me_last_pgno);
                    goto done;
                }
            }
        }
        mdb_cursor_close(cur);
        cur = NULL;
        if (rc != MDB_NOTFOUND) {
            snprintf(why, len, "its free list cannot be read: %s", mdb_strerror(rc));
            goto done;
        }
    }
    /* every record, as the gateway will read it */
    if ((rc = mdb_cursor_open(txn, dbi, &cur)) != 0) {
        snprintf(why, len, "its records cannot be read: %s", mdb_strerror(rc));
        goto done;
    }
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        entries++;
        if (k.mv_size == 1 && v.mv_size == 8) {
            continue; /* make_room's mark */
        }
        parsed = k.mv_size != RIC_IDEM_KEY_LEN ? RIC_ERROR
                 : ric_idem_record_parse(v.mv_data, v.mv_size, &rec);
        if (parsed == RIC_DECLINED) {
            ric_idem_key_hex(k.mv_data, hex);
            snprintf(why, len, "record %llu (key digest %s, a value of %zu bytes) fails its "
                     "checksum: a byte of it changed", (unsigned long long) entries, hex,
                     v.mv_size);
            goto done;
        }
        if (parsed != RIC_OK) {
            snprintf(why, len, "record %llu (a key of %zu bytes, a value of %zu) is not one of "
                     "ricochet's", (unsigned long long) entries, k.mv_size, v.mv_size);
            goto done;
        }
    }
    if (rc != MDB_NOTFOUND) {
        snprintf(why, len, "its records cannot be read past record %llu: %s",
                 (unsigned long long) entries, mdb_strerror(rc));
        goto done;
    }
    if (mdb_stat(txn, dbi, &db) == 0 && db.ms_entries != entries) {
        snprintf(why, len, "it counts %zu records, and %llu can be read", db.ms_entries,
                 (unsigned long long) entries);
        goto done;
    }
    found = 0;
done:
    if (cur != NULL) {
        mdb_cursor_close(cur);
    }
    if (txn != NULL) {
        mdb_txn_abort(txn);
    }
    if (env != NULL) {
        mdb_env_close(env);
    }
    return found;
}

int
ric_idem_lmdb_verify(const ric_idem_store_conf_t *sc, char *why, size_t len)
{
    char lock[4200], buf[400];
    struct stat st;
    ssize_t n, got = 0;
    int fds[2], status, devnull, fd;
    pid_t pid;

    why[0] = '\0';
    if (stat(sc->path, &st) != 0) {
        return RIC_OK; /* none yet (or unreachable: opening it says why) */
    }
    if (!S_ISREG(st.st_mode)) {
        return RIC_OK; /* opening it says what it is */
    }
    /* files this process may not write are no finding about the store:
     * said as what they are, and never moved aside for it */
    snprintf(lock, sizeof(lock), "%s-lock", sc->path);
    if ((fd = open(sc->path, O_RDWR | O_CLOEXEC)) == -1) {
        snprintf(why, len, "cannot open \"%s\" for writing: %s", sc->path, strerror(errno));
        return RIC_ERROR;
    }
    close(fd);
    if ((fd = open(lock, O_RDWR | O_CLOEXEC)) == -1 && errno != ENOENT) {
        snprintf(why, len, "cannot open lock file %s: %s", lock, strerror(errno));
        return RIC_ERROR;
    }
    if (fd != -1) {
        close(fd);
    }
    if (st.st_size == 0) {
        if (access(lock, F_OK) != 0) {
            return RIC_OK; /* made, never written: LMDB makes it its own */
        }
        snprintf(why, len, "it is empty, though its lock file %s shows it was in use: was it "
                 "truncated?", lock);
        return RIC_DECLINED;
    }
    if (pipe(fds) != 0) {
        snprintf(why, len, "pipe: %s", strerror(errno));
        return RIC_ERROR;
    }
    pid = fork();
    if (pid < 0) {
        snprintf(why, len, "fork: %s", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return RIC_ERROR;
    }
    if (pid == 0) {
        /* a damaged page may crash LMDB: it does so here, not in the master */
        close(fds[0]);
        devnull = open("/dev/null", O_WRONLY);
        if (devnull >= 0) {
            dup2(devnull, STDERR_FILENO);
        }
        alarm(VERIFY_LIMIT_S);
        if ((status = verify_walk(sc, st.st_size, buf, sizeof(buf))) != 0) {
            n = write(fds[1], buf, strlen(buf));
            (void) n;
            _exit(status == VERIFY_ERROR ? VERIFY_ERROR : VERIFY_DAMAGED);
        }
        _exit(0);
    }
    close(fds[1]);
    while (got < (ssize_t) sizeof(buf) - 1
           && ((n = read(fds[0], buf + got, sizeof(buf) - 1 - (size_t) got)) > 0
               || (n < 0 && errno == EINTR))) {
        got += n > 0 ? n : 0;
    }
    buf[got] = '\0';
    close(fds[0]);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        return RIC_OK;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == VERIFY_ERROR) {
        snprintf(why, len, "%s", buf);
        return RIC_ERROR;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == VERIFY_DAMAGED) {
        snprintf(why, len, "%s", buf);
    } else if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) {
        snprintf(why, len, "reading it took longer than %d s", VERIFY_LIMIT_S);
    } else {
        snprintf(why, len, "reading its pages crashed LMDB (%s): they are damaged",
                 WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : "an abnormal exit");
    }
    return RIC_DECLINED;
}

/* --- the store is the one opened ------------------------------------------ */

/* The bytes the newer meta page's pages reach (its last page, plus one,
 * times the page size), read without mapping the file. 0, or -1 with why. */
static int
meta_need(const char *path, uint64_t *need, char *why, size_t len)
{
    u_char meta[META_TXNID + 8];
    uint32_t magic, psize = 0;
    uint64_t best = 0;
    int fd, i, found = 0;

    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) == -1) {
        snprintf(why, len, "it cannot be read: %s", strerror(errno));
        return -1;
    }
    for (i = 0; i < 2; i++) {
        if (pread(fd, meta, sizeof(meta), (off_t) i * psize) != (ssize_t) sizeof(meta)) {
            break;
        }
        memcpy(&magic, meta + META_MAGIC, sizeof(magic));
        if (i == 0) {
            memcpy(&psize, meta + META_DBS, sizeof(psize));
        }
        if (!(get_half(meta + 10) & P_META) || magic != MDB_MAGIC_WORD || psize < 512) {
            break;
        }
        if (!found || get_word(meta + META_TXNID) > best) {
            best = get_word(meta + META_TXNID);
            *need = (get_word(meta + META_LAST_PG) + 1) * psize;
        }
        found = 1;
    }
    close(fd);
    if (!found) {
        snprintf(why, len, "it has no meta page any more");
        return -1;
    }
    return 0;
}

/* A worker's, before it opens the file: whether path and its lock file are
 * still the ones the master checked (sc), the data file no shorter than it
 * was then nor than its pages. 0, or -1 with what changed in why. */
static int
same_store(const ric_idem_store_conf_t *sc, const char *lock, char *why, size_t len)
{
    struct stat st;
    uint64_t need = 0;

    if (stat(sc->path, &st) != 0) {
        snprintf(why, len, "it is gone since the master checked it (%s)", strerror(errno));
        return -1;
    }
    if (st.st_dev != sc->dev || st.st_ino != sc->ino) {
        snprintf(why, len, "another file took its path since the master checked it (replaced or "
                 "moved)");
        return -1;
    }
    if ((int64_t) st.st_size < sc->checked_size) {
        snprintf(why, len, "it was truncated to %lld bytes since the master checked it (it had "
                 "%lld)", (long long) st.st_size, (long long) sc->checked_size);
        return -1;
    }
    if (meta_need(sc->path, &need, why, len) != 0) {
        return -1;
    }
    if (need > (uint64_t) st.st_size) {
        snprintf(why, len, "it is truncated: its pages reach byte %llu, the file has %lld",
                 (unsigned long long) need, (long long) st.st_size);
        return -1;
    }
    if (stat(lock, &st) != 0) {
        snprintf(why, len, "its lock file %s is gone (%s): a process that made a new one would "
                 "not exclude the writers holding the old", lock, strerror(errno));
        return -1;
    }
    if (st.st_dev != sc->lock_dev || st.st_ino != sc->lock_ino) {
        snprintf(why, len, "its lock file %s is not the one the master checked: writers would "
                 "not exclude each other", lock);
        return -1;
    }
    return 0;
}

/* Before each write transaction and each tick: whether the files are
 * still the ones this store opened, and the data file as long as its map
 * needs (a shorter one faults the process with SIGBUS). 0, or RC_REFUSED,
 * from then on, logged once. One fstat and two stats: a write transaction
 * serves a whole turn of the loop. */
static int
store_sound(lmdb_store_t *s)
{
    struct stat st;
    char why[256];
    int fd;

    if (s->broken[0] != '\0') {
        return RC_REFUSED;
    }
    if (mdb_env_get_fd(s->env, &fd) != 0 || fstat(fd, &st) != 0) {
        snprintf(why, sizeof(why), "it cannot be looked at: %s", strerror(errno));
    } else if ((int64_t) st.st_size < s->file_size) {
        snprintf(why, sizeof(why), "it was truncated to %lld bytes while in use (it had %lld)",
                 (long long) st.st_size, (long long) s->file_size);
    } else if (stat(s->base.conf->path, &st) != 0) {
        snprintf(why, sizeof(why), "it is gone from its path while in use (%s)", strerror(errno));
    } else if (st.st_dev != s->dev || st.st_ino != s->ino) {
        snprintf(why, sizeof(why), "another file took its path while in use (replaced or moved)");
    } else if (stat(s->lock_path, &st) != 0) {
        snprintf(why, sizeof(why), "its lock file %s is gone (%s): a process that made a new one "
                 "would not exclude this one's writes", s->lock_path, strerror(errno));
    } else if (st.st_dev != s->lock_dev || st.st_ino != s->lock_ino) {
        snprintf(why, sizeof(why), "its lock file %s was replaced while in use: writers would not "
                 "exclude each other", s->lock_path);
    } else {
        return 0;
    }
    snprintf(s->broken, sizeof(s->broken), "\"%s\" is not the store this worker opened: %s",
             s->base.conf->path, why);
    ric_log_error(RIC_LOG_ALERT, 0, "idempotency store \"%s\": %s: it is no longer read nor "
                  "written, and keyed requests on it fail (idempotency_store_failure) until the "
                  "gateway is restarted on a sound file (ricochet -t checks it)",
                  s->base.conf->spec, s->broken);
    return RC_REFUSED;
}

/* Another process (a reload that raised size=, another gateway) grew the
 * map past this one's: its size, now in the file, is taken at once (LMDB
 * 0.9's remedy for MDB_MAP_RESIZED), and its pages reserved on disk. */
static int
adopt_size(lmdb_store_t *s)
{
    MDB_envinfo info;
    struct stat st;
    size_t was = s->map_size;
    int rc, fd;

    pthread_mutex_lock(&s->map_mu);
    rc = mdb_env_set_mapsize(s->env, 0);
    pthread_mutex_unlock(&s->map_mu);
    if (rc != 0 || (rc = mdb_env_info(s->env, &info)) != 0) {
        ric_log_error(RIC_LOG_ERR, 0, "idempotency store \"%s\": cannot take the map's new size: "
                      "%s", s->base.conf->spec, mdb_strerror(rc));
        return rc;
    }
    s->map_size = info.me_mapsize;
    s->map = s->writemap ? info.me_mapaddr : NULL;
    if (mdb_env_get_fd(s->env, &fd) == 0) {
        if (s->writemap && fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, (off_t) s->map_size) != 0) {
            ric_log_error(RIC_LOG_CRIT, 0, "idempotency store \"%s\": cannot reserve the map's "
                          "new %zu bytes on disk: %s (a full disk would stop the worker that "
                          "writes there)", s->base.conf->spec, s->map_size, strerror(errno));
        }
        if (fstat(fd, &st) == 0 && (int64_t) st.st_size > s->file_size) {
            s->file_size = (int64_t) st.st_size;
        }
    }
    ric_log_error(RIC_LOG_NOTICE, 0, "idempotency store \"%s\": its map grew from %zu to %zu "
                  "bytes (size= raised elsewhere): taken", s->base.conf->spec, was, s->map_size);
    return 0;
}

/* Every write transaction begins here: on a store still sound, at the
 * map's current size. 0, RC_REFUSED, or LMDB's error. */
static int
txn_begin(lmdb_store_t *s, MDB_txn **txn)
{
    int rc;

    if (store_sound(s) != 0) {
        return RC_REFUSED;
    }
    rc = mdb_txn_begin(s->env, NULL, 0, txn);
    if (rc == MDB_MAP_RESIZED && adopt_size(s) == 0) {
        rc = mdb_txn_begin(s->env, NULL, 0, txn);
    }
    return rc;
}

/* The files as open: recorded for store_sound, and (a worker's) compared
 * with the ones the master checked. 0, or -1 with why. */
static int
note_files(lmdb_store_t *s, int worker, char *why, size_t len)
{
    const ric_idem_store_conf_t *sc = s->base.conf;
    struct stat st;
    int fd;

    if (mdb_env_get_fd(s->env, &fd) != 0 || fstat(fd, &st) != 0) {
        snprintf(why, len, "cannot look at \"%s\": %s", sc->path, strerror(errno));
        return -1;
    }
    s->dev = st.st_dev;
    s->ino = st.st_ino;
    s->file_size = (int64_t) st.st_size;
    if (stat(s->lock_path, &st) != 0) {
        snprintf(why, len, "cannot look at \"%s\": %s", s->lock_path, strerror(errno));
        return -1;
    }
    s->lock_dev = st.st_dev;
    s->lock_ino = st.st_ino;
    if (worker && sc->ino != 0
        && (s->dev != sc->dev || s->ino != sc->ino || s->lock_dev != sc->lock_dev
            || s->lock_ino != sc->lock_ino)) {
        snprintf(why, len, "\"%s\" or its lock file changed while it was opened", sc->path);
        return -1;
    }
    return 0;
}

ric_idem_store_t *
ric_idem_lmdb_open(ric_idem_store_conf_t *sc, struct event_base *base, char *err, size_t errlen)
{
    lmdb_store_t *s = ric_xcalloc(1, sizeof(*s));
    MDB_txn *txn;
    MDB_envinfo info;
    struct timeval tv;
    struct stat st;
    sigset_t all, mask;
    size_t n = strlen(sc->path) + sizeof("-lock");
    int rc, dead, reserved;

    s->base.kind = RIC_IDEM_STORE_LMDB;
    s->base.conf = sc;
    s->map_size = (size_t) sc->map_size;
    s->efd = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_init(&s->map_mu, NULL);
    s->lock_path = ric_xmalloc(n);
    snprintf(s->lock_path, n, "%s-lock", sc->path);
    /* a worker (a respawned one too) opens the file its generation's master
     * checked, or none: never a fresh store made in place of a lost one */
    if (base != NULL && sc->ino != 0 && same_store(sc, s->lock_path, s->broken,
                                                   sizeof(s->broken)) != 0) {
        snprintf(err, errlen, "\"%s\" is not the store the master checked: %s (restart the "
                 "gateway on a sound file: ricochet -t checks it)", sc->path, s->broken);
        ric_idem_lmdb_close(&s->base);
        return NULL;
    }
    /* a map smaller than the file would cut it (LMDB sizes a written-in-
     * place file to its map), under the processes whose map is larger: the
     * larger of size= and the file's own is taken */
    if (stat(sc->path, &st) == 0 && st.st_size > sc->map_size) {
        s->map_size = (size_t) st.st_size;
    }
    if ((rc = mdb_env_create(&s->env)) != 0) {
        goto failed;
    }
    if ((rc = mdb_env_set_mapsize(s->env, s->map_size)) != 0) {
        goto failed;
    }
    /* one file, shared by every worker; fsync is ours to schedule. The
     * map is written in place (WRITEMAP) where it is reserved on disk: no
     * copy of each dirty page per commit, and what a commit wrote is in
     * the page cache, so a gateway that crashes loses nothing */
    reserved = reserve(sc->path, (int64_t) s->map_size);
    if (reserved < 0) {
        rc = errno;
        if (rc == ENOSPC || rc == EDQUOT || rc == EFBIG) {
            snprintf(err, errlen, "cannot reserve the %lld bytes of the LMDB map \"%s\" on "
                     "disk: %s (lower size=, or free space)", (long long) sc->map_size,
                     sc->path, strerror(rc));
            ric_idem_lmdb_close(&s->base);
            return NULL;
        }
        goto failed;
    }
    rc = mdb_env_open(s->env, sc->path,
                      MDB_NOSUBDIR | MDB_NOTLS | MDB_NOSYNC | MDB_NORDAHEAD
                          | (reserved ? MDB_WRITEMAP | MDB_MAPASYNC : 0), 0600);
    if (rc != 0) {
        goto failed;
    }
    mdb_reader_check(s->env, &dead); /* slots of readers that were killed */
    if ((rc = mdb_txn_begin(s->env, NULL, 0, &txn)) != 0) {
        goto failed;
    }
    if ((rc = mdb_dbi_open(txn, NULL, 0, &s->dbi)) != 0) {
        mdb_txn_abort(txn);
        goto failed;
    }
    if ((rc = mdb_txn_commit(txn)) != 0) {
        goto failed; /* a failed commit frees the transaction itself */
    }
    s->writemap = reserved;
    if (mdb_env_info(s->env, &info) == 0) {
        s->map_size = info.me_mapsize;
        s->map = reserved ? info.me_mapaddr : NULL;
    }
    if (note_files(s, base != NULL, err, errlen) != 0) {
        ric_idem_lmdb_close(&s->base);
        return NULL;
    }
    if (base == NULL) {
        return &s->base; /* the master's check: no loop, no thread */
    }
    s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->efd == -1) {
        rc = errno;
        goto failed;
    }
    /* the flusher takes no signal: every one is the worker's loop's, and
     * the script alarm's handler must run on the thread that runs Lua */
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &mask);
    rc = pthread_create(&s->thread, NULL, flusher, s);
    pthread_sigmask(SIG_SETMASK, &mask, NULL);
    if (rc != 0) {
        goto failed;
    }
    s->thread_started = 1;
    s->synced = event_new(base, s->efd, EV_READ | EV_PERSIST, on_synced, s);
    event_add(s->synced, NULL);
    s->batch = event_new(base, -1, 0, on_batch, s);
    s->queue_tail = &s->queue;
    s->tick = evtimer_new(base, on_tick, s);
    tv = ric_ms_to_tv(SWEEP_EVERY_MS);
    event_add(s->tick, &tv);
    return &s->base;

failed:
    snprintf(err, errlen, "cannot open LMDB file \"%s\": %s", sc->path, mdb_strerror(rc));
    ric_idem_lmdb_close(&s->base);
    return NULL;
}

void
ric_idem_lmdb_close(ric_idem_store_t *base)
{
    lmdb_store_t *s = (lmdb_store_t *) base;

    if (s->batch != NULL) {
        if (s->queue != NULL) {
            on_batch(-1, 0, s); /* the last settles of a stopping worker */
        }
        event_free(s->batch);
    }
    if (s->backlog.n > 0) {
        backlog_retry(s); /* a last try, then what is left is logged */
        ric_idem_backlog_drop(&s->backlog, s->base.conf);
    }
    if (s->thread_started) {
        pthread_mutex_lock(&s->mu);
        /* a last flush on the way out, of a file that is still ours */
        s->want_gen += s->broken[0] == '\0';
        s->stop = 1;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    if (s->tick != NULL) {
        event_free(s->tick);
    }
    if (s->synced != NULL) {
        event_free(s->synced);
    }
    if (s->efd != -1) {
        close(s->efd);
    }
    if (s->env != NULL) {
        mdb_env_close(s->env);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->map_mu);
    free(s->lock_path);
    free(s);
}

static const char *
write_failure(lmdb_store_t *s, int rc, char *buf, size_t len)
{
    if (rc == RC_REFUSED) {
        snprintf(buf, len, "%.*s", (int) len - 1, s->broken); /* logged whole once */
    } else if (rc == MDB_MAP_FULL) {
        snprintf(buf, len, "the LMDB map of %lld bytes is full (raise size= of "
                 "idempotency_store, or lower idempotency_ttl)", (long long) s->map_size);
    } else if (rc == MDB_CORRUPTED || rc == MDB_PAGE_NOTFOUND || rc == MDB_BAD_TXN) {
        snprintf(buf, len, "\"%s\" looks damaged (%s): stop the gateway and run ricochet -t, "
                 "which says what is wrong and what to do", s->base.conf->path, mdb_strerror(rc));
    } else {
        snprintf(buf, len, "writing to \"%s\" failed: %s", s->base.conf->path,
                 mdb_strerror(rc));
    }
    return buf;
}

/* What mdb_get found under a key: 1 a live record (or a damaged one: its
 * claim's request is answered 503, never run), 0 none (missing, or a
 * sound record that expired), -1 a value no record can be (a damaged
 * node: its size past the map): never copied. */
static int
live_record(const lmdb_store_t *s, int rc, const MDB_val *v)
{
    const u_char *p = v->mv_data;
    ric_idem_record_t rec;

    if (rc != 0) {
        return 0;
    }
    if (v->mv_size > s->map_size
        || (s->map != NULL && (p < s->map || v->mv_size > (size_t) (s->map + s->map_size - p)))) {
        return -1;
    }
    if (ric_idem_record_live(p, v->mv_size)) {
        return 1;
    }
    /* a changed byte may make a record look expired: only a sound one frees its key */
    return ric_idem_record_parse(p, v->mv_size, &rec) != RIC_OK;
}

/* The error of a claim that met a damaged record. */
static void
damaged_record(lmdb_store_t *s, ric_idem_op_t *op)
{
    snprintf(op->error, sizeof(op->error), "a damaged record in \"%s\" (stop the gateway and run "
             "ricochet -t: it says what is wrong)", s->base.conf->path);
}

/* One write transaction: the live record under key into found (FOUND), or
 * rec put in place (CLAIMED); an LMDB error code otherwise. */
static int
claim_txn(lmdb_store_t *s, const u_char *key, u_char *rec, size_t len, ric_buf_t *found)
{
    MDB_txn *txn;
    MDB_val k, v;
    int rc;

    if ((rc = txn_begin(s, &txn)) != 0) {
        return rc;
    }
    k.mv_data = (void *) key;
    k.mv_size = RIC_IDEM_KEY_LEN;
    rc = mdb_get(txn, s->dbi, &k, &v);
    switch (live_record(s, rc, &v)) {
    case 1:
        found->len = 0; /* a batch that aborted may have filled it already */
        ric_buf_put(found, v.mv_data, v.mv_size);
        mdb_txn_abort(txn);
        return RIC_IDEM_FOUND;
    case -1:
        mdb_txn_abort(txn);
        return MDB_CORRUPTED;
    }
    if (nearly_full(s, txn)) {
        mdb_txn_abort(txn);
        return MDB_MAP_FULL;
    }
    v.mv_data = rec;
    v.mv_size = len;
    if ((rc = mdb_put(txn, s->dbi, &k, &v, 0)) != 0) {
        mdb_txn_abort(txn);
        return rc;
    }
    if ((rc = mdb_txn_commit(txn)) != 0) {
        return rc;
    }
    return RIC_IDEM_CLAIMED;
}

/* A claim on its own: with room made when the map is full. */
static int
claim_one(lmdb_store_t *s, const u_char *key, u_char *rec, size_t len, ric_idem_op_t *op)
{
    int rc = claim_txn(s, key, rec, len, &op->found);

    if (rc == MDB_MAP_FULL && make_room(s)) {
        rc = claim_txn(s, key, rec, len, &op->found);
    }
    if (rc != RIC_IDEM_FOUND && rc != RIC_IDEM_CLAIMED) {
        write_failure(s, rc, op->error, sizeof(op->error));
        return RIC_ERROR;
    }
    s->dirty |= rc == RIC_IDEM_CLAIMED;
    return rc;
}

/* Puts rec under key (NULL: deletes it) inside txn if the record there
 * holds token. 0 (done, or not ours), or an LMDB error. */
static int
settle_in(lmdb_store_t *s, MDB_txn *txn, const u_char *key, const u_char *token,
          const u_char *rec, size_t len)
{
    MDB_val k, v;
    u_char bare[RIC_IDEM_REC_HEAD];
    int rc;

    k.mv_data = (void *) key;
    k.mv_size = RIC_IDEM_KEY_LEN;
    rc = mdb_get(txn, s->dbi, &k, &v);
    if (rc == MDB_NOTFOUND && rec != NULL) {
        /* our lock lapsed (and was swept) and nobody claimed the key
         * since: the request did run, so its outcome is still kept */
    } else if (rc != 0 || v.mv_size < RIC_IDEM_REC_HEAD
        || memcmp((const u_char *) v.mv_data + RIC_IDEM_REC_TOKEN, token, RIC_IDEM_TOKEN_LEN)
               != 0) {
        return rc == MDB_NOTFOUND || rc == 0 ? 0 : rc; /* gone, or claimed again: not ours */
    }
    if (rec == NULL) {
        return mdb_del(txn, s->dbi, &k, NULL);
    }
    if (len > RIC_IDEM_REC_HEAD && filled_over(s, txn, len, ANSWERS_PCT)) {
        /* no room left for answers: the request still stays done */
        ric_idem_record_bare(rec, bare);
        rec = bare;
        len = sizeof(bare);
    }
    v.mv_data = (void *) rec;
    v.mv_size = len;
    return mdb_put(txn, s->dbi, &k, &v, 0);
}

/* A settle on its own: a full map is swept, and an answer that still does
 * not fit is kept as done without it. 0, or the LMDB error (logged). */
static int
settle_one(lmdb_store_t *s, const u_char *key, const u_char *token, const u_char *rec,
           size_t len)
{
    MDB_txn *txn;
    char why[256];
    u_char bare[RIC_IDEM_REC_HEAD];
    int rc, tries;

    for (tries = 0; tries < 3; tries++) {
        if ((rc = txn_begin(s, &txn)) != 0) {
            break;
        }
        if ((rc = settle_in(s, txn, key, token, rec, len)) != 0) {
            mdb_txn_abort(txn);
        } else if ((rc = mdb_txn_commit(txn)) == 0) {
            s->dirty = 1;
            return 0;
        }
        if (rc != MDB_MAP_FULL) {
            break;
        }
        if (!make_room(s) && rec != NULL && len > RIC_IDEM_REC_HEAD) {
            /* no room for the answer (a large one needs consecutive free
             * pages, which a scattered free list may not have at any use):
             * at least the request stays done */
            ric_log_error(RIC_LOG_NOTICE, 0, "idempotency store \"%s\": an answer of %zu bytes "
                          "does not fit in the map (no run of free pages that long: raise size=): "
                          "kept as done without it", s->base.conf->spec, len);
            ric_idem_record_bare(rec, bare);
            rec = bare;
            len = sizeof(bare);
        }
    }
    ric_log_error(RIC_LOG_ERR, 0, "idempotency store \"%s\": %s (the settle is tried again "
                  "every second)", s->base.conf->spec, write_failure(s, rc, why, sizeof(why)));
    return rc;
}

/* A settle that failed waits in the backlog, behind any older one. */
static void
settle_or_keep(lmdb_store_t *s, const u_char *key, const u_char *token, const u_char *rec,
               size_t len, int64_t lock_expires)
{
    if (s->backlog.n > 0 || settle_one(s, key, token, rec, len) != 0) {
        ric_idem_backlog_push(&s->backlog, s->base.conf, key, token, rec, len, 0, lock_expires);
    }
}

/* The settles that failed go again, oldest first, until one fails again. */
static void
backlog_retry(lmdb_store_t *s)
{
    ric_idem_pending_t *p;

    while ((p = ric_idem_backlog_take(&s->backlog, s->base.conf)) != NULL) {
        if (settle_one(s, p->key, p->token, p->rec, p->len) != 0) {
            ric_idem_backlog_unshift(&s->backlog, p);
            return;
        }
        ric_idem_pending_free(p);
    }
}

/* A claim is over: its request hears, or waits for the flush first. */
static void
claim_over(lmdb_store_t *s, ric_idem_op_t *op, int rc, int durable, uint64_t *gen)
{
    op->pending = NULL;
    if (rc == RIC_IDEM_CLAIMED && durable) {
        /* the lock counts once it is on disk: the flusher says when */
        if (*gen == 0) {
            *gen = flush_ask(s); /* one flush for the turn's durable claims */
        }
        op->sync_gen = *gen;
        op->next = s->waiting;
        s->waiting = op;
        return;
    }
    op->rc = rc;
    op->done(op);
}

/* One transaction for every claim and settle of this turn of the loop;
 * should it fail (a full map), each goes again on its own. */
static void
on_batch(evutil_socket_t fd, short what, void *arg)
{
    lmdb_store_t *s = arg;
    batch_item_t *list = s->queue, *it, *next;
    MDB_txn *txn = NULL;
    MDB_val k, v;
    uint64_t gen = 0;
    int rc = 0;

    (void) fd;
    (void) what;
    s->queue = NULL;
    s->queue_tail = &s->queue;
    if (s->backlog.n > 0) {
        backlog_retry(s);
    }
    for (it = list; it && s->backlog.n > 0; it = it->next) {
        if (!it->claim) {
            /* settles keep their order: these go after the ones that wait */
            ric_idem_backlog_push(&s->backlog, s->base.conf, it->key, it->token, it->rec, it->len,
                                  0, it->lock_expires);
            it->kept = 1;
        }
    }
    if (txn_begin(s, &txn) != 0) {
        txn = NULL;
    } else if (nearly_full(s, txn)) {
        rc = MDB_MAP_FULL; /* each on its own, with room made first */
    }
    for (it = list; it && txn != NULL && rc == 0; it = it->next) {
        if (!it->claim) {
            if (!it->kept) {
                rc = settle_in(s, txn, it->key, it->token, it->rec, it->len);
            }
            continue;
        }
        if (it->op == NULL) {
            continue; /* its request gave up: nothing is written for it */
        }
        k.mv_data = it->key;
        k.mv_size = RIC_IDEM_KEY_LEN;
        rc = mdb_get(txn, s->dbi, &k, &v);
        switch (live_record(s, rc, &v)) {
        case 1:
            it->op->found.len = 0;
            ric_buf_put(&it->op->found, v.mv_data, v.mv_size);
            it->rc = RIC_IDEM_FOUND;
            rc = 0;
            continue;
        case -1:
            damaged_record(s, it->op);
            it->rc = RIC_ERROR;
            rc = 0;
            continue;
        }
        v.mv_data = it->rec;
        v.mv_size = it->len;
        rc = mdb_put(txn, s->dbi, &k, &v, 0);
        it->rc = RIC_IDEM_CLAIMED;
    }
    if (txn != NULL && rc == 0 && (rc = mdb_txn_commit(txn)) == 0) {
        s->dirty = 1;
        txn = NULL;
    } else {
        if (txn != NULL && rc != 0) {
            mdb_txn_abort(txn);
        }
        txn = NULL;
        rc = -1; /* each on its own */
    }
    for (it = list; it; it = next) {
        next = it->next;
        if (rc != 0) {
            if (!it->claim && !it->kept) {
                settle_or_keep(s, it->key, it->token, it->rec, it->len, it->lock_expires);
            } else if (it->op != NULL) {
                it->rc = claim_one(s, it->key, it->rec, it->len, it->op);
            }
        }
        /* a done() may end other requests, and give up their claims */
        if (it->claim && it->op != NULL) {
            claim_over(s, it->op, it->rc, it->durable, &gen);
        }
        free(it->rec);
        free(it);
    }
}

static batch_item_t *
enqueue(lmdb_store_t *s, const u_char *key, const u_char *rec, size_t len)
{
    batch_item_t *it = ric_xcalloc(1, sizeof(*it));

    memcpy(it->key, key, RIC_IDEM_KEY_LEN);
    if (rec != NULL) {
        it->rec = ric_xmalloc(len ? len : 1);
        memcpy(it->rec, rec, len);
        it->len = len;
    }
    if (s->queue == NULL) {
        /* after the events of this turn: their claims join this one */
        event_active(s->batch, EV_TIMEOUT, 1);
    }
    *s->queue_tail = it;
    s->queue_tail = &it->next;
    return it;
}

static int
lmdb_claim(ric_idem_store_t *base, const u_char *key, u_char *rec, size_t len, int64_t ttl_ms,
           int durable, ric_idem_op_t *op)
{
    lmdb_store_t *s = (lmdb_store_t *) base;
    batch_item_t *it;

    (void) ttl_ms; /* a lock's time is in the record */
    if (s->batch == NULL) {
        return op->rc = claim_one(s, key, rec, len, op); /* no loop: at once */
    }
    it = enqueue(s, key, rec, len);
    it->claim = 1;
    it->op = op;
    it->durable = durable && s->thread_started;
    op->pending = it;
    op->async.cancel = cancel_wait;
    op->async.data = op;
    return RIC_AGAIN;
}

static void
lmdb_settle(ric_idem_store_t *base, const u_char *key, const u_char *token, const u_char *rec,
            size_t len, int64_t ttl_ms, int64_t lock_expires)
{
    lmdb_store_t *s = (lmdb_store_t *) base;
    batch_item_t *it;

    (void) ttl_ms; /* a record's time is in it */
    if (s->batch == NULL) {
        settle_one(s, key, token, rec, len);
        return;
    }
    it = enqueue(s, key, rec, len);
    memcpy(it->token, token, RIC_IDEM_TOKEN_LEN);
    it->lock_expires = lock_expires;
}

/* The master's check: the file verified, then opened (made when new) and
 * closed again. */
static int
lmdb_check(ric_idem_store_conf_t *sc, char *err, size_t errlen)
{
    ric_idem_store_t *s;
    lmdb_store_t *ls;
    int rc;

    /* a damaged file is never opened for writing: the config decides
     * (idempotency_store_recover) what becomes of it */
    sc->damaged[0] = '\0';
    rc = ric_idem_lmdb_verify(sc, sc->damaged, sizeof(sc->damaged));
    if (rc == RIC_DECLINED) {
        return RIC_OK;
    }
    if (rc == RIC_ERROR) {
        /* not a finding about the file: nothing is moved aside for it */
        snprintf(err, errlen, "cannot check LMDB file \"%s\": %s", sc->path, sc->damaged);
        sc->damaged[0] = '\0';
        return RIC_ERROR;
    }
    sc->damaged[0] = '\0';
    s = ric_idem_lmdb_open(sc, NULL, err, errlen);
    if (s == NULL) {
        return RIC_ERROR;
    }
    /* what this generation's workers will open, and nothing else */
    ls = (lmdb_store_t *) s;
    sc->dev = ls->dev;
    sc->ino = ls->ino;
    sc->lock_dev = ls->lock_dev;
    sc->lock_ino = ls->lock_ino;
    sc->checked_size = ls->file_size;
    ric_idem_lmdb_close(s);
    return RIC_OK;
}

/* idempotency_store_recover rename: a damaged file moved aside to
 * PATH.damaged-TIMESTAMP and made again empty (with test, only said). */
static int
lmdb_recover(ric_idem_store_conf_t *sc, int test, char *err, size_t errlen)
{
    char aside[4200], lock[4200];
    struct tm tm;
    time_t now = time(NULL);

    {
        if (sc->damaged[0] == '\0') {
            return RIC_OK;
        }
        localtime_r(&now, &tm);
        snprintf(aside, sizeof(aside), "%s.damaged-%04d%02d%02dT%02d%02d%02d", sc->path,
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
        if (test) {
            fprintf(stderr, "ricochet: [warn] idempotency store \"%s\" is damaged (%s): at start "
                    "it is moved aside to %s and a new, empty store is made "
                    "(idempotency_store_recover rename)\n", sc->spec, sc->damaged, aside);
            return RIC_OK;
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
        if (lmdb_check(sc, err, errlen) != RIC_OK) {
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

static ric_idem_store_t *
lmdb_open(ric_idem_store_conf_t *sc, struct event_base *base, char *err, size_t errlen)
{
    return ric_idem_lmdb_open(sc, base, err, errlen);
}

const ric_idem_store_ops_t ric_idem_lmdb_ops = {
    "lmdb", lmdb_check, lmdb_recover, lmdb_open, ric_idem_lmdb_close, lmdb_claim, lmdb_settle
};
