/* fuzz_idem_record.c: libFuzzer driver for the idempotency store's record reader (records come back from a store another gateway, or damage, may have written): each input read as given, then sealed with its checksum so the reader's structure checks are reached too. */
#include "idem_store.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
read_one(const uint8_t *data, size_t size)
{
    ric_idem_record_t rec;
    const u_char *end = data + size;

    if (ric_idem_record_parse(data, size, &rec) != RIC_OK) {
        return;
    }
    /* every span it hands out lies inside what it was given */
    ric_assert(rec.state == RIC_IDEM_LOCKED || rec.state == RIC_IDEM_DONE
               || rec.state == RIC_IDEM_DONE_BARE);
    ric_assert(rec.fp >= data && rec.fp + 32 <= end);
    ric_assert(rec.token >= data && rec.token + RIC_IDEM_TOKEN_LEN <= end);
    ric_assert(rec.old ? rec.client == NULL && rec.boot == NULL
                       : rec.client >= data && rec.client + RIC_IDEM_ID_LEN <= end
                         && rec.boot >= data && rec.boot + RIC_IDEM_ID_LEN <= end);
    if (rec.state == RIC_IDEM_DONE) {
        ric_assert(rec.status >= 100 && rec.status <= 599);
        ric_assert(rec.fields.data >= data && rec.fields.data + rec.fields.len <= end);
        ric_assert(rec.body.data == rec.fields.data + rec.fields.len);
        ric_assert(rec.body.data + rec.body.len == end);
    }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    u_char *copy;

    read_one(data, size);
    if (size >= RIC_IDEM_REC_HEAD) {
        copy = malloc(size);
        if (copy == NULL) {
            return 0;
        }
        memcpy(copy, data, size);
        ric_idem_record_seal(copy, size);
        read_one(copy, size);
        free(copy);
    }
    return 0;
}
