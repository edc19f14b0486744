/* test_idem_lmdb.c: the LMDB store on a real file: claim, found, settle by the lock's holder only, expiry, a full map, the sweep, and two environments on one file. */
#include "../../core/idem_lmdb.c"
#include "unit.h"

#include <stdio.h>

static char dir[256];

static ric_idem_store_conf_t
conf_for(const char *name, int64_t size)
{
    ric_idem_store_conf_t sc;
    static char path[2][512];
    static int n;

    memset(&sc, 0, sizeof(sc));
    sc.kind = RIC_IDEM_STORE_LMDB;
    sc.ops = &ric_idem_lmdb_ops;
    n = (n + 1) % 2;
    snprintf(path[n], sizeof(path[n]), "%s/%s", dir, name);
    sc.path = path[n];
    sc.spec = path[n];
    sc.map_size = size;
    return sc;
}

/* A record of len bytes (what follows the head is the caller's, written
 * before), as idem.c makes one: a lock lapses on the boot clock, in this
 * boot; sealed. */
static void
make_record(u_char *rec, size_t len, int state, u_char token, int64_t ttl_ms)
{
    memset(rec, 0, RIC_IDEM_REC_HEAD);
    rec[0] = (u_char) state;
    ric_idem_put64(rec + RIC_IDEM_REC_EXPIRES, (uint64_t) (ric_idem_wall_ms() + ttl_ms));
    memset(rec + RIC_IDEM_REC_FP, 0xab, 32);
    memset(rec + RIC_IDEM_REC_TOKEN, token, RIC_IDEM_TOKEN_LEN);
    if (state == RIC_IDEM_LOCKED) {
        ric_idem_put64(rec + RIC_IDEM_REC_LAPSE, (uint64_t) (ric_idem_boot_ms() + ttl_ms));
        memcpy(rec + RIC_IDEM_REC_BOOT, ric_idem_boot_id(), RIC_IDEM_ID_LEN);
    }
    ric_idem_record_seal(rec, len);
}

/* Both clocks a test moves: every lock and record written before is
 * that much older. */
static void
later(int64_t ms)
{
    ric_idem_wall_skew_ms += ms;
    ric_idem_boot_skew_ms += ms;
}

static void
test_claim_and_settle(void)
{
    ric_idem_store_conf_t sc = conf_for("a.mdb", 1 << 20), sc2;
    char err[512];
    ric_idem_store_t *s = ric_idem_lmdb_open(&sc, NULL, err, sizeof(err)), *s2;
    u_char key[RIC_IDEM_KEY_LEN], lock[RIC_IDEM_REC_HEAD], other[RIC_IDEM_REC_HEAD];
    u_char done[RIC_IDEM_REC_HEAD + 10], token1[RIC_IDEM_TOKEN_LEN], token2[RIC_IDEM_TOKEN_LEN];
    ric_idem_op_t op;

    UNIT_CASE("claim a new key");
    UNIT_CHECK(s != NULL);
    if (s == NULL) {
        fprintf(stderr, "%s\n", err);
        return;
    }
    memset(key, 7, sizeof(key));
    memset(&op, 0, sizeof(op));
    make_record(lock, sizeof(lock), RIC_IDEM_LOCKED, 1, 60000);
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, lock, sizeof(lock), 60000, 0, &op), RIC_IDEM_CLAIMED);

    UNIT_CASE("a second claim finds the lock, from another environment on the file too");
    make_record(other, sizeof(other), RIC_IDEM_LOCKED, 2, 60000);
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, other, sizeof(other), 60000, 0, &op), RIC_IDEM_FOUND);
    UNIT_CHECK_INT(op.found.len, RIC_IDEM_REC_HEAD);
    UNIT_CHECK(op.found.len > 0 && op.found.data[0] == RIC_IDEM_LOCKED
               && op.found.data[RIC_IDEM_REC_TOKEN] == 1);
    ric_buf_free(&op.found);
    sc2 = conf_for("a.mdb", 1 << 20);
    s2 = ric_idem_lmdb_open(&sc2, NULL, err, sizeof(err));
    UNIT_CHECK(s2 != NULL);
    if (s2 != NULL) {
        UNIT_CHECK_INT(ric_idem_store_claim(s2, key, other, sizeof(other), 60000, 0, &op),
                       RIC_IDEM_FOUND);
        ric_buf_free(&op.found);
    }

    UNIT_CASE("only the holder settles");
    memset(token1, 1, sizeof(token1));
    memset(token2, 2, sizeof(token2));
    memcpy(done + RIC_IDEM_REC_HEAD, "0123456789", 10);
    make_record(done, sizeof(done), RIC_IDEM_DONE, 2, 60000);
    ric_idem_store_settle(s, key, token2, done, sizeof(done), 60000, 0); /* not ours: ignored */
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, other, sizeof(other), 60000, 0, &op), RIC_IDEM_FOUND);
    UNIT_CHECK(op.found.len > 0 && op.found.data[0] == RIC_IDEM_LOCKED);
    ric_buf_free(&op.found);
    memcpy(done + RIC_IDEM_REC_HEAD, "0123456789", 10);
    make_record(done, sizeof(done), RIC_IDEM_DONE, 1, 60000);
    ric_idem_store_settle(s, key, token1, done, sizeof(done), 60000, 0);
    UNIT_CHECK_INT(ric_idem_store_claim(s2 ? s2 : s, key, other, sizeof(other), 60000, 0, &op),
                   RIC_IDEM_FOUND);
    UNIT_CHECK_INT(op.found.len, sizeof(done));
    UNIT_CHECK(op.found.len == sizeof(done) && op.found.data[0] == RIC_IDEM_DONE
               && memcmp(op.found.data + RIC_IDEM_REC_HEAD, "0123456789", 10) == 0);
    ric_buf_free(&op.found);

    UNIT_CASE("release, then the key is new again");
    ric_idem_store_settle(s, key, token1, NULL, 0, 0, 0);
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, other, sizeof(other), 60000, 0, &op), RIC_IDEM_CLAIMED);

    UNIT_CASE("an answer whose lock lapsed, with nobody claiming since, is still kept");
    key[0] = 0x71;
    key[1] = 0x72;
    ric_idem_store_settle(s, key, token1, NULL, 0, 0, 0); /* a release of nothing: nothing */
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, other, sizeof(other), 60000, 0, &op), RIC_IDEM_CLAIMED);
    ric_idem_store_settle(s, key, other + RIC_IDEM_REC_TOKEN, NULL, 0, 0, 0);
    ric_idem_store_settle(s, key, token1, done, sizeof(done), 60000, 0);
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, other, sizeof(other), 60000, 0, &op), RIC_IDEM_FOUND);
    UNIT_CHECK(op.found.len == sizeof(done) && op.found.data[0] == RIC_IDEM_DONE);
    ric_buf_free(&op.found);
    key[0] = key[1] = 0;

    UNIT_CASE("an expired record counts as none, and the sweep deletes it");
    key[0] = 9;
    make_record(lock, sizeof(lock), RIC_IDEM_LOCKED, 3, -1);
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, lock, sizeof(lock), 1, 0, &op), RIC_IDEM_CLAIMED);
    make_record(other, sizeof(other), RIC_IDEM_LOCKED, 4, 60000);
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, other, sizeof(other), 60000, 0, &op), RIC_IDEM_CLAIMED);
    key[0] = 10;
    make_record(lock, sizeof(lock), RIC_IDEM_LOCKED, 3, -1);
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, lock, sizeof(lock), 1, 0, &op), RIC_IDEM_CLAIMED);
    UNIT_CHECK_INT(sweep((lmdb_store_t *) s, 1000), 1);
    UNIT_CHECK_INT(sweep((lmdb_store_t *) s, 1000), 0);

    if (s2 != NULL) {
        ric_idem_lmdb_close(s2);
    }
    ric_idem_lmdb_close(s);
}

static void
test_full_map(void)
{
    ric_idem_store_conf_t sc = conf_for("full.mdb", 64 * 1024);
    char err[512];
    ric_idem_store_t *s = ric_idem_lmdb_open(&sc, NULL, err, sizeof(err));
    u_char key[RIC_IDEM_KEY_LEN], big[RIC_IDEM_REC_HEAD + 8192];
    ric_idem_op_t op;
    int i, rc = RIC_IDEM_CLAIMED;

    UNIT_CASE("a full map is an error with a clear reason, never a crash");
    UNIT_CHECK(s != NULL);
    if (s == NULL) {
        return;
    }
    memset(&op, 0, sizeof(op));
    memset(big, 'x', sizeof(big));
    make_record(big, sizeof(big), RIC_IDEM_LOCKED, 5, 60000);
    for (i = 0; i < 64 && rc == RIC_IDEM_CLAIMED; i++) {
        memset(key, 0, sizeof(key));
        key[0] = (u_char) i;
        rc = ric_idem_store_claim(s, key, big, sizeof(big), 60000, 0, &op);
    }
    UNIT_CHECK_INT(rc, RIC_ERROR);
    UNIT_CHECK(strstr(op.error, "is full") != NULL);

    UNIT_CASE("expired records make room");
    ric_idem_lmdb_close(s);
    sc = conf_for("full2.mdb", 64 * 1024);
    s = ric_idem_lmdb_open(&sc, NULL, err, sizeof(err));
    UNIT_CHECK(s != NULL);
    if (s == NULL) {
        return;
    }
    make_record(big, sizeof(big), RIC_IDEM_LOCKED, 5, 1);
    rc = RIC_IDEM_CLAIMED;
    for (i = 0; i < 64 && rc == RIC_IDEM_CLAIMED; i++) {
        key[0] = (u_char) i;
        rc = ric_idem_store_claim(s, key, big, sizeof(big), 60000, 0, &op);
    }
    later(1000); /* every record written has expired now */
    make_record(big, sizeof(big), RIC_IDEM_LOCKED, 6, 60000);
    key[0] = 200;
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, big, sizeof(big), 60000, 0, &op), RIC_IDEM_CLAIMED);
    ric_idem_lmdb_close(s);
}

/* Small records filling a map, all expired: the map must take claims again. */
static void
test_full_of_small(void)
{
    ric_idem_store_conf_t sc = conf_for("small.mdb", 1 << 20);
    char err[512];
    ric_idem_store_t *s = ric_idem_lmdb_open(&sc, NULL, err, sizeof(err));
    u_char key[RIC_IDEM_KEY_LEN], rec[RIC_IDEM_REC_HEAD + 1024];
    ric_idem_op_t op;
    int i, rc = RIC_IDEM_CLAIMED, filled = 0, after = 0;

    UNIT_CASE("a map full of small expired records takes claims again");
    UNIT_CHECK(s != NULL);
    if (s == NULL) {
        return;
    }
    memset(&op, 0, sizeof(op));
    memset(rec, 'y', sizeof(rec));
    make_record(rec, sizeof(rec), RIC_IDEM_LOCKED, 7, 60000);
    memset(key, 0, sizeof(key));
    for (i = 0; i < 100000 && rc == RIC_IDEM_CLAIMED; i++) {
        memcpy(key, &i, sizeof(i));
        rc = ric_idem_store_claim(s, key, rec, sizeof(rec), 60000, 0, &op);
        filled += rc == RIC_IDEM_CLAIMED;
    }
    UNIT_CHECK_INT(rc, RIC_ERROR);
    UNIT_CHECK(filled > 100);
    later(120000); /* two minutes later: every record has expired */
    make_record(rec, sizeof(rec), RIC_IDEM_LOCKED, 8, 60000);
    for (i = 0; i < filled / 2; i++) {
        int n = 1000000 + i;
        memcpy(key, &n, sizeof(n));
        after += ric_idem_store_claim(s, key, rec, sizeof(rec), 60000, 0, &op) == RIC_IDEM_CLAIMED;
    }
    UNIT_CHECK_INT(after, filled / 2);
    ric_idem_lmdb_close(s);
}

/* The backlog of settles a store could not take: in order, bounded, each
 * given up only with a log line. */
static void
test_backlog(void)
{
    ric_idem_store_conf_t sc = conf_for("backlog.mdb", 1 << 20);
    ric_idem_backlog_t b;
    ric_idem_pending_t *p;
    u_char key[RIC_IDEM_KEY_LEN], token[RIC_IDEM_TOKEN_LEN], rec[RIC_IDEM_REC_HEAD], *big;
    int i, ordered = 1, level = ric_log->level;

    ric_log->level = RIC_LOG_CRIT; /* 10,000 "given up" lines are the point, not the output */
    UNIT_CASE("settles wait in the order they were made, and go in it");
    memset(&b, 0, sizeof(b));
    memset(token, 5, sizeof(token));
    memset(rec, 'D', sizeof(rec));
    for (i = 0; i < 3; i++) {
        memset(key, i, sizeof(key));
        ric_idem_backlog_push(&b, &sc, key, token, i == 1 ? NULL : rec, sizeof(rec), 1000,
                              ric_idem_wall_ms() + 60000);
    }
    UNIT_CHECK_INT(b.n, 3);
    p = ric_idem_backlog_take(&b, &sc);
    UNIT_CHECK(p != NULL && p->key[0] == 0 && p->rec != NULL && p->len == sizeof(rec));
    ric_idem_backlog_unshift(&b, p); /* it could not go: first again */
    UNIT_CHECK_INT(b.n, 3);
    for (i = 0; i < 3; i++) {
        p = ric_idem_backlog_take(&b, &sc);
        ordered &= p != NULL && p->key[0] == i && (i == 1) == (p->rec == NULL);
        ric_idem_pending_free(p);
    }
    UNIT_CHECK(ordered);
    UNIT_CHECK(ric_idem_backlog_take(&b, &sc) == NULL);
    UNIT_CHECK_INT(b.n, 0);

    UNIT_CASE("a full backlog gives up its oldest, never grows past its bound");
    for (i = 0; i < RIC_IDEM_BACKLOG_MAX + 5; i++) {
        memset(key, 0, sizeof(key));
        ric_idem_put64(key, (uint64_t) i);
        ric_idem_backlog_push(&b, &sc, key, token, rec, sizeof(rec), 1000, 0);
    }
    UNIT_CHECK_INT(b.n, RIC_IDEM_BACKLOG_MAX);
    p = ric_idem_backlog_take(&b, &sc);
    UNIT_CHECK(p != NULL && ric_idem_get64(p->key) == 5);
    ric_idem_pending_free(p);
    ric_idem_backlog_drop(&b, &sc);
    UNIT_CHECK_INT(b.n, 0);
    UNIT_CHECK(b.head == NULL);
    UNIT_CHECK_INT(b.bytes, 0);

    UNIT_CASE("past its bytes, an answer waits as done without its body");
    big = ric_xmalloc(1 << 20);
    memset(big, 'x', 1 << 20);
    big[0] = RIC_IDEM_DONE;
    for (i = 0; i < 80; i++) {
        memset(key, i, sizeof(key));
        ric_idem_backlog_push(&b, &sc, key, token, big, 1 << 20, 1000, 0);
    }
    UNIT_CHECK_INT(b.n, 80);
    UNIT_CHECK(b.bytes <= RIC_IDEM_BACKLOG_BYTES + 80 * RIC_IDEM_REC_HEAD); /* bare ones are small */
    for (i = 0; i < 80; i++) {
        p = ric_idem_backlog_take(&b, &sc);
        if (i == 0) {
            UNIT_CHECK(p->len == (1 << 20) && p->rec[0] == RIC_IDEM_DONE);
        }
        if (i == 79) {
            UNIT_CHECK(p->len == RIC_IDEM_REC_HEAD && p->rec[0] == RIC_IDEM_DONE_BARE);
        }
        ric_idem_pending_free(p);
    }
    UNIT_CHECK_INT(b.bytes, 0);
    free(big);

    UNIT_CASE("a settle whose lock lapsed while it waited is lost once, however often it is tried");
    {
        ric_idem_counters_t counters;

        memset(&counters, 0, sizeof(counters));
        sc.counters = &counters;
        memset(key, 1, sizeof(key));
        ric_idem_backlog_push(&b, &sc, key, token, rec, sizeof(rec), 1000, 0); /* lapsed */
        ric_idem_backlog_push(&b, &sc, key, token, NULL, 0, 1000, 0);         /* a release */
        ric_idem_backlog_push(&b, &sc, key, token, rec, sizeof(rec), 1000,
                              ric_idem_wall_ms() + 60000);
        ric_idem_backlog_lapsed(&b, &sc);
        UNIT_CHECK_INT(counters.settles_lost, 1);
        for (i = 0; i < 3; i++) {
            p = ric_idem_backlog_take(&b, &sc); /* tried, and it could not go */
            ric_idem_backlog_unshift(&b, p);
            ric_idem_backlog_lapsed(&b, &sc);
        }
        UNIT_CHECK_INT(counters.settles_lost, 1);
        UNIT_CHECK_INT(b.n, 3);
        ric_idem_backlog_drop(&b, &sc); /* the lapsed one is not counted again */
        UNIT_CHECK_INT(counters.settles_lost, 2);
        sc.counters = NULL;
    }
    ric_log->level = level;
}

/* Locks are timed by the boot clock of this boot, never by the wall
 * clock; done records by the wall clock; old records (before the
 * checksum) by their wall expiry. */
static void
test_lock_clocks(void)
{
    ric_idem_store_conf_t sc = conf_for("clocks.mdb", 1 << 20);
    char err[512];
    ric_idem_store_t *s = ric_idem_lmdb_open(&sc, NULL, err, sizeof(err));
    u_char key[RIC_IDEM_KEY_LEN], lock[RIC_IDEM_REC_HEAD], other[RIC_IDEM_REC_HEAD];
    u_char old[RIC_IDEM_OLD_HEAD];
    ric_idem_op_t op;

    UNIT_CASE("a wall clock stepped past a lock's wall expiry leaves it live, and swept never");
    UNIT_CHECK(s != NULL);
    if (s == NULL) {
        return;
    }
    memset(&op, 0, sizeof(op));
    memset(key, 0x31, sizeof(key));
    make_record(lock, sizeof(lock), RIC_IDEM_LOCKED, 1, 60000);
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, lock, sizeof(lock), 60000, 0, &op),
                   RIC_IDEM_CLAIMED);
    ric_idem_wall_skew_ms += 90000; /* the wall clock steps +90 s */
    UNIT_CHECK_INT(sweep((lmdb_store_t *) s, 1000), 0);
    make_record(other, sizeof(other), RIC_IDEM_LOCKED, 2, 60000);
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, other, sizeof(other), 60000, 0, &op),
                   RIC_IDEM_FOUND);
    UNIT_CHECK(op.found.len > 0 && op.found.data[RIC_IDEM_REC_TOKEN] == 1);
    ric_buf_free(&op.found);
    UNIT_CHECK(!ric_idem_lock_lapsed((int64_t) ric_idem_get64(lock + RIC_IDEM_REC_LAPSE)));
    ric_idem_wall_skew_ms -= 180000; /* ...and back, past where it was */
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, other, sizeof(other), 60000, 0, &op),
                   RIC_IDEM_FOUND);
    ric_buf_free(&op.found);
    ric_idem_wall_skew_ms += 90000;

    UNIT_CASE("a lock lapses on the boot clock, and is swept");
    ric_idem_boot_skew_ms += 60000;
    UNIT_CHECK(ric_idem_lock_lapsed((int64_t) ric_idem_get64(lock + RIC_IDEM_REC_LAPSE)));
    UNIT_CHECK_INT(sweep((lmdb_store_t *) s, 1000), 1);
    ric_idem_boot_skew_ms -= 60000;

    UNIT_CASE("a lock of another boot has lapsed: the host restarted");
    make_record(lock, sizeof(lock), RIC_IDEM_LOCKED, 3, 60000);
    lock[RIC_IDEM_REC_BOOT] ^= 0xff;
    ric_idem_record_seal(lock, sizeof(lock));
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, lock, sizeof(lock), 60000, 0, &op),
                   RIC_IDEM_CLAIMED);
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, other, sizeof(other), 60000, 0, &op),
                   RIC_IDEM_CLAIMED);

    UNIT_CASE("a lock of the format before the checksum keeps its wall expiry");
    key[0] = 0x32;
    memset(old, 0, sizeof(old));
    old[0] = 'L';
    ric_idem_put64(old + RIC_IDEM_REC_EXPIRES, (uint64_t) (ric_idem_wall_ms() + 60000));
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, old, sizeof(old), 60000, 0, &op),
                   RIC_IDEM_CLAIMED);
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, other, sizeof(other), 60000, 0, &op),
                   RIC_IDEM_FOUND);
    ric_buf_free(&op.found);
    ric_idem_wall_skew_ms += 61000;
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, other, sizeof(other), 60000, 0, &op),
                   RIC_IDEM_CLAIMED);
    ric_idem_wall_skew_ms -= 61000;
    ric_idem_lmdb_close(s);
}

/* A changed byte anywhere in a record fails its checksum: the reader says
 * so, the check of the file names it, a claim finds it (never takes its
 * key, even when the byte makes it look expired), the sweep keeps it. */
static void
test_checksum(void)
{
    ric_idem_store_conf_t sc = conf_for("sum.mdb", 1 << 20);
    char err[512], why[400];
    ric_idem_store_t *s = ric_idem_lmdb_open(&sc, NULL, err, sizeof(err));
    u_char key[RIC_IDEM_KEY_LEN], token[RIC_IDEM_TOKEN_LEN], lock[RIC_IDEM_REC_HEAD];
    u_char done[RIC_IDEM_REC_HEAD + 6 + 16 + 4], old[RIC_IDEM_OLD_HEAD + 6 + 4];
    static const size_t at[] = { 0, RIC_IDEM_REC_EXPIRES + 7, RIC_IDEM_REC_CLIENT,
                                 RIC_IDEM_REC_SUM, RIC_IDEM_REC_HEAD + 3,
                                 RIC_IDEM_REC_HEAD + 6 + 16 + 2 };
    ric_idem_record_t rec;
    ric_idem_op_t op;
    size_t i;
    int declined = 1;

    UNIT_CASE("a flipped byte in the head, the field length or the body fails the checksum");
    UNIT_CHECK(s != NULL);
    if (s == NULL) {
        return;
    }
    memset(&op, 0, sizeof(op));
    memcpy(done + RIC_IDEM_REC_HEAD, "\x00\xc9\x00\x00\x00\x10X-Charge: ch_1\r\nbody", 26);
    make_record(done, sizeof(done), RIC_IDEM_DONE, 1, 60000);
    UNIT_CHECK_INT(ric_idem_record_parse(done, sizeof(done), &rec), RIC_OK);
    UNIT_CHECK(rec.status == 201 && rec.fields.len == 16 && rec.body.len == 4 && !rec.old);
    for (i = 0; i < ric_nelems(at); i++) {
        done[at[i]] ^= 0x01;
        declined &= ric_idem_record_parse(done, sizeof(done), &rec)
                    == (at[i] == 0 ? RIC_ERROR : RIC_DECLINED); /* 'd' ^ 1 is no state */
        done[at[i]] ^= 0x01;
    }
    UNIT_CHECK(declined);

    UNIT_CASE("a record of the format before the checksum is read by its structure");
    memset(old, 0, sizeof(old));
    old[0] = 'D';
    memcpy(old + RIC_IDEM_OLD_HEAD, "\x00\xc8\x00\x00\x00\x00" "body", 10);
    UNIT_CHECK_INT(ric_idem_record_parse(old, sizeof(old), &rec), RIC_OK);
    UNIT_CHECK(rec.old && rec.state == RIC_IDEM_DONE && rec.status == 200 && rec.body.len == 4
               && rec.client == NULL);
    old[RIC_IDEM_OLD_HEAD + 5] = 11; /* a field length past the record */
    UNIT_CHECK_INT(ric_idem_record_parse(old, sizeof(old), &rec), RIC_ERROR);

    UNIT_CASE("a damaged record is found by a claim, kept by the sweep, named by the check");
    memset(key, 0x41, sizeof(key));
    memset(token, 1, sizeof(token));
    make_record(lock, sizeof(lock), RIC_IDEM_LOCKED, 1, 60000);
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, lock, sizeof(lock), 60000, 0, &op),
                   RIC_IDEM_CLAIMED);
    done[RIC_IDEM_REC_HEAD + 6 + 16 + 2] ^= 0x01; /* a byte of its body */
    ric_idem_store_settle(s, key, token, done, sizeof(done), 60000, 0);
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, lock, sizeof(lock), 60000, 0, &op),
                   RIC_IDEM_FOUND);
    UNIT_CHECK(op.found.len == sizeof(done)
               && ric_idem_record_parse(op.found.data, op.found.len, &rec) == RIC_DECLINED);
    ric_buf_free(&op.found);
    ric_idem_wall_skew_ms += 61000; /* it expired: a sound one would go */
    UNIT_CHECK_INT(sweep((lmdb_store_t *) s, 1000), 0);
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, lock, sizeof(lock), 60000, 0, &op),
                   RIC_IDEM_FOUND);
    ric_buf_free(&op.found);
    ric_idem_wall_skew_ms -= 61000;
    ric_idem_lmdb_close(s);
    UNIT_CHECK_INT(ric_idem_lmdb_verify(&sc, why, sizeof(why)), RIC_DECLINED);
    UNIT_CHECK(strstr(why, "fails its checksum") != NULL);
}

/* A meta page whose page size LMDB would divide by (0) or wrap with: the
 * check refuses the file with the size it found, before LMDB reads it. */
static void
test_verify_page_size(void)
{
    ric_idem_store_conf_t sc = conf_for("psize.mdb", 1 << 20);
    char err[512], why[400];
    ric_idem_store_t *s = ric_idem_lmdb_open(&sc, NULL, err, sizeof(err));
    static const uint32_t bad[] = { 0, 16, 4095, 1 << 17 };
    uint32_t psize, v;
    size_t i;
    FILE *f;

    UNIT_CASE("the check refuses a meta page's page size LMDB cannot use, and says which");
    UNIT_CHECK(s != NULL);
    if (s == NULL) {
        return;
    }
    ric_idem_lmdb_close(s);
    UNIT_CHECK_INT(ric_idem_lmdb_verify(&sc, why, sizeof(why)), RIC_OK);
    f = fopen(sc.path, "r+b");
    UNIT_CHECK(f != NULL && fseek(f, META_DBS, SEEK_SET) == 0
               && fread(&psize, sizeof(psize), 1, f) == 1);
    for (i = 0; f != NULL && i < ric_nelems(bad); i++) {
        v = bad[i];
        fseek(f, META_DBS, SEEK_SET);
        fwrite(&v, sizeof(v), 1, f);
        fflush(f);
        UNIT_CHECK_INT(ric_idem_lmdb_verify(&sc, why, sizeof(why)), RIC_DECLINED);
        UNIT_CHECK(strstr(why, "gives a page size of") != NULL);
    }
    if (f != NULL) {
        /* the second meta page, at the first's size */
        fseek(f, META_DBS, SEEK_SET);
        fwrite(&psize, sizeof(psize), 1, f);
        v = 0;
        fseek(f, (long) psize + META_DBS, SEEK_SET);
        fwrite(&v, sizeof(v), 1, f);
        fclose(f);
        UNIT_CHECK_INT(ric_idem_lmdb_verify(&sc, why, sizeof(why)), RIC_DECLINED);
        UNIT_CHECK(strstr(why, "meta page 1 gives a page size of 0") != NULL);
    }
}

static int batch_done_calls;

static void
batch_done(ric_idem_op_t *op)
{
    (void) op;
    batch_done_calls++;
}

/* Writes records of about one page each until the map is full, then
 * deletes every other one: free pages everywhere, no two side by side,
 * and the map's tail in use. */
static void
fragment(lmdb_store_t *s)
{
    MDB_txn *txn;
    MDB_val k, v;
    u_char key[RIC_IDEM_KEY_LEN], rec[3000];
    int i, n, rc = 0;

    memset(rec, 'f', sizeof(rec));
    make_record(rec, sizeof(rec), RIC_IDEM_DONE_BARE, 9, 600000);
    memset(key, 0xee, sizeof(key));
    k.mv_data = key;
    k.mv_size = sizeof(key);
    for (n = 0; n < 100000 && rc == 0; n++) {
        memcpy(key, &n, sizeof(n));
        v.mv_data = rec;
        v.mv_size = sizeof(rec);
        if ((rc = mdb_txn_begin(s->env, NULL, 0, &txn)) != 0) {
            break;
        }
        if ((rc = mdb_put(txn, s->dbi, &k, &v, 0)) != 0) {
            mdb_txn_abort(txn);
            break;
        }
        rc = mdb_txn_commit(txn);
    }
    for (i = 0; i < n; i += 2) {
        memcpy(key, &i, sizeof(i));
        if (mdb_txn_begin(s->env, NULL, 0, &txn) == 0) {
            mdb_del(txn, s->dbi, &k, NULL);
            mdb_txn_commit(txn);
        }
    }
}

/* One turn's batch: a claim that finds an answer, then a settle too large
 * for the fragmented map (the batch aborts and each goes again alone): the
 * claim's answer is the stored record, byte for byte, once. */
static void
test_batch_redo(void)
{
    ric_idem_store_conf_t sc = conf_for("redo.mdb", 1 << 20);
    struct event_base *base = event_base_new();
    char err[512];
    ric_idem_store_t *s = ric_idem_lmdb_open(&sc, base, err, sizeof(err));
    u_char key[RIC_IDEM_KEY_LEN], key2[RIC_IDEM_KEY_LEN], lock[RIC_IDEM_REC_HEAD];
    u_char done[RIC_IDEM_REC_HEAD + 100], token[RIC_IDEM_TOKEN_LEN], *big;
    size_t big_len = 40 * 4096;
    ric_idem_op_t op;

    UNIT_CASE("a batch that aborts on a settle that does not fit redoes its claims cleanly");
    UNIT_CHECK(s != NULL);
    if (s == NULL) {
        fprintf(stderr, "%s\n", err);
        event_base_free(base);
        return;
    }
    memset(key, 0x31, sizeof(key));
    memset(token, 1, sizeof(token));
    make_record(done, sizeof(done), RIC_IDEM_DONE, 1, 600000);
    memcpy(done + RIC_IDEM_REC_HEAD, "\x00\xc9\x00\x00\x00\x00", 6);
    memset(done + RIC_IDEM_REC_HEAD + 6, 'a', sizeof(done) - RIC_IDEM_REC_HEAD - 6);
    ric_idem_record_seal(done, sizeof(done));
    UNIT_CHECK_INT(settle_one((lmdb_store_t *) s, key, token, done, sizeof(done)), 0);
    fragment((lmdb_store_t *) s);

    memset(&op, 0, sizeof(op));
    op.done = batch_done;
    make_record(lock, sizeof(lock), RIC_IDEM_LOCKED, 2, 60000);
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, lock, sizeof(lock), 60000, 0, &op), RIC_AGAIN);
    big = ric_xmalloc(big_len);
    memset(big, 'b', big_len);
    make_record(big, big_len, RIC_IDEM_DONE, 3, 600000);
    memcpy(big + RIC_IDEM_REC_HEAD, "\x00\xc9\x00\x00\x00\x00", 6);
    ric_idem_record_seal(big, big_len);
    memset(key2, 0x32, sizeof(key2));
    ric_idem_store_settle(s, key2, big + RIC_IDEM_REC_TOKEN, big, big_len, 60000, 0);
    batch_done_calls = 0;
    on_batch(-1, 0, s);
    UNIT_CHECK_INT(batch_done_calls, 1);
    UNIT_CHECK_INT(op.rc, RIC_IDEM_FOUND);
    UNIT_CHECK_INT(op.found.len, sizeof(done));
    UNIT_CHECK(op.found.len == sizeof(done) && memcmp(op.found.data, done, sizeof(done)) == 0);
    ric_buf_free(&op.found);
    free(big);
    ric_idem_lmdb_close(s);
    event_base_free(base);
}

/* A map grown by another environment with a larger size= is taken at the
 * next write; a smaller size= never cuts a larger file. */
static void
test_resize_adopted(void)
{
    ric_idem_store_conf_t sc1 = conf_for("grow.mdb", 1 << 20), sc2;
    char err[512];
    ric_idem_store_t *s1 = ric_idem_lmdb_open(&sc1, NULL, err, sizeof(err)), *s2, *s3;
    u_char key[RIC_IDEM_KEY_LEN], lock[RIC_IDEM_REC_HEAD], *rec;
    size_t len = 100 * 1024;
    ric_idem_op_t op;
    struct stat st;
    int i, stored = 0;

    UNIT_CASE("a map grown elsewhere is taken, and a smaller size= does not cut the file");
    sc2 = conf_for("grow.mdb", 4 << 20);
    s2 = ric_idem_lmdb_open(&sc2, NULL, err, sizeof(err));
    UNIT_CHECK(s1 != NULL && s2 != NULL);
    if (s1 == NULL || s2 == NULL) {
        return;
    }
    rec = ric_xmalloc(len);
    memset(rec, 'r', len);
    make_record(rec, len, RIC_IDEM_DONE, 4, 600000);
    memcpy(rec + RIC_IDEM_REC_HEAD, "\x00\xc9\x00\x00\x00\x00", 6);
    ric_idem_record_seal(rec, len);
    memset(key, 0x44, sizeof(key));
    for (i = 0; i < 16; i++) {
        key[0] = (u_char) i;
        stored += settle_one((lmdb_store_t *) s2, key, rec + RIC_IDEM_REC_TOKEN, rec, len) == 0;
    }
    UNIT_CHECK_INT(stored, 16);
    memset(&op, 0, sizeof(op));
    memset(key, 0x45, sizeof(key));
    make_record(lock, sizeof(lock), RIC_IDEM_LOCKED, 5, 60000);
    UNIT_CHECK_INT(ric_idem_store_claim(s1, key, lock, sizeof(lock), 60000, 0, &op),
                   RIC_IDEM_CLAIMED);
    UNIT_CHECK_INT(((lmdb_store_t *) s1)->map_size, 4 << 20);
    memset(key, 0x44, sizeof(key));
    key[0] = 15;
    UNIT_CHECK_INT(ric_idem_store_claim(s1, key, lock, sizeof(lock), 60000, 0, &op),
                   RIC_IDEM_FOUND);
    UNIT_CHECK(op.found.len == len && memcmp(op.found.data + RIC_IDEM_REC_HEAD + 6,
                                             rec + RIC_IDEM_REC_HEAD + 6, 100) == 0);
    ric_buf_free(&op.found);
    s3 = ric_idem_lmdb_open(&sc1, NULL, err, sizeof(err));
    UNIT_CHECK(s3 != NULL && stat(sc1.path, &st) == 0 && st.st_size >= (4 << 20));
    if (s3 != NULL) {
        ric_idem_lmdb_close(s3);
    }
    free(rec);
    ric_idem_lmdb_close(s2);
    ric_idem_lmdb_close(s1);
}

/* A data file truncated, or a lock file deleted, under an open store: it
 * is refused from then on, with what changed; nothing faults. */
static void
test_files_changed(void)
{
    ric_idem_store_conf_t sc = conf_for("cut.mdb", 1 << 20);
    char err[512], lock[600];
    ric_idem_store_t *s = ric_idem_lmdb_open(&sc, NULL, err, sizeof(err));
    u_char key[RIC_IDEM_KEY_LEN], rec[RIC_IDEM_REC_HEAD];
    ric_idem_op_t op;
    int level = ric_log->level;

    UNIT_CASE("a truncated data file is refused, never read");
    UNIT_CHECK(s != NULL);
    if (s == NULL) {
        return;
    }
    ric_log->level = RIC_LOG_EMERG; /* the alert lines are the point, not the output */
    memset(&op, 0, sizeof(op));
    memset(key, 0x51, sizeof(key));
    make_record(rec, sizeof(rec), RIC_IDEM_LOCKED, 6, 60000);
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, rec, sizeof(rec), 60000, 0, &op), RIC_IDEM_CLAIMED);
    UNIT_CHECK(truncate(sc.path, 8192) == 0);
    UNIT_CHECK_INT(ric_idem_store_claim(s, key, rec, sizeof(rec), 60000, 0, &op), RIC_ERROR);
    UNIT_CHECK(strstr(op.error, "truncated to 8192 bytes") != NULL);
    ric_idem_lmdb_close(s);

    UNIT_CASE("a deleted lock file is refused");
    sc = conf_for("unlocked.mdb", 1 << 20);
    s = ric_idem_lmdb_open(&sc, NULL, err, sizeof(err));
    UNIT_CHECK(s != NULL);
    if (s != NULL) {
        snprintf(lock, sizeof(lock), "%s-lock", sc.path);
        UNIT_CHECK(unlink(lock) == 0);
        UNIT_CHECK_INT(ric_idem_store_claim(s, key, rec, sizeof(rec), 60000, 0, &op), RIC_ERROR);
        UNIT_CHECK(strstr(op.error, "lock file") != NULL);
        ric_idem_lmdb_close(s);
    }
    ric_log->level = level;
}

int
main(void)
{
    char cmd[300];
    int rc;

    snprintf(dir, sizeof(dir), "/tmp/ric_test_lmdb.XXXXXX");
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    test_claim_and_settle();
    test_full_map();
    test_full_of_small();
    test_backlog();
    test_lock_clocks();
    test_checksum();
    test_verify_page_size();
    test_batch_redo();
    test_resize_adopted();
    test_files_changed();
    rc = UNIT_DONE("idem_lmdb");
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "could not remove %s\n", dir);
    }
    return rc;
}
