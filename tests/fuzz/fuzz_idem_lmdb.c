/* fuzz_idem_lmdb.c: libFuzzer driver for the check of an LMDB file at start (ric_idem_lmdb_verify) and the record reader behind it, fed whole files with damaged pages. Whatever the check lets through must be readable, record by record, without a crash. */
#include "idem_store.h"

#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char dir[64], path[128], lock[160];

static void
write_file(const uint8_t *data, size_t size)
{
    FILE *f;

    if (dir[0] == '\0') {
        snprintf(dir, sizeof(dir), "/tmp/ric-fuzz-lmdb-XXXXXX");
        if (mkdtemp(dir) == NULL) {
            abort();
        }
        snprintf(path, sizeof(path), "%s/idem.mdb", dir);
        snprintf(lock, sizeof(lock), "%s-lock", path);
    }
    unlink(lock);
    f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
        abort();
    }
}

/* What a worker does with a file the check passed: read every record. */
static void
read_all(const ric_idem_store_conf_t *sc)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_cursor *cur;
    MDB_dbi dbi;
    MDB_val k, v;
    ric_idem_record_t rec;
    int rc;

    if (mdb_env_create(&env) != 0) {
        return;
    }
    mdb_env_set_mapsize(env, (size_t) sc->map_size);
    if (mdb_env_open(env, sc->path, MDB_NOSUBDIR | MDB_RDONLY, 0600) == 0
        && mdb_txn_begin(env, NULL, MDB_RDONLY, &txn) == 0) {
        if (mdb_dbi_open(txn, NULL, 0, &dbi) == 0 && mdb_cursor_open(txn, dbi, &cur) == 0) {
            for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
                 rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
                if (k.mv_size == RIC_IDEM_KEY_LEN) {
                    /* the check found each parses: it must, here too */
                    ric_assert(ric_idem_record_parse(v.mv_data, v.mv_size, &rec) == RIC_OK);
                }
            }
            mdb_cursor_close(cur);
        }
        mdb_txn_abort(txn);
    }
    mdb_env_close(env);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ric_idem_store_conf_t sc;
    char why[400];
    int rc;

    if (size > (1 << 20)) {
        return 0;
    }
    write_file(data, size);
    memset(&sc, 0, sizeof(sc));
    sc.kind = RIC_IDEM_STORE_LMDB;
    sc.path = path;
    sc.spec = path;
    sc.map_size = 1 << 20;
    rc = ric_idem_lmdb_verify(&sc, why, sizeof(why));
    ric_assert(rc == RIC_OK || rc == RIC_DECLINED);
    ric_assert(rc == RIC_OK ? why[0] == '\0' : why[0] != '\0');
    if (rc == RIC_OK && size > 0) {
        read_all(&sc);
    }
    unlink(path);
    unlink(lock);
    return 0;
}
