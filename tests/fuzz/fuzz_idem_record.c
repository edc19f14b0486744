/* fuzz_idem_record.c: libFuzzer driver for the idempotency store's record reader (records come back from a store another gateway, or damage, may have written). */
#include "idem_store.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ric_idem_record_t rec;
    const u_char *end = data + size;

    if (ric_idem_record_parse(data, size, &rec) != RIC_OK) {
        return 0;
    }
    /* every span it hands out lies inside what it was given */
    ric_assert(rec.state == RIC_IDEM_LOCKED || rec.state == RIC_IDEM_DONE
               || rec.state == RIC_IDEM_DONE_BARE);
    ric_assert(rec.fp >= data && rec.fp + 32 <= end);
    ric_assert(rec.token >= data && rec.token + RIC_IDEM_TOKEN_LEN <= end);
    if (rec.state == RIC_IDEM_DONE) {
        ric_assert(rec.status >= 100 && rec.status <= 599);
        ric_assert(rec.fields.data >= data && rec.fields.data + rec.fields.len <= end);
        ric_assert(rec.body.data == rec.fields.data + rec.fields.len);
        ric_assert(rec.body.data + rec.body.len == end);
    }
    return 0;
}
