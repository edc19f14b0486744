/* hedge.c: the running p95 of an upstream's response times, a decaying histogram in the shared zone. */
#include "hedge.h"

#define LOAD(p) atomic_load_explicit((p), memory_order_relaxed)
#define STORE(p, v) atomic_store_explicit((p), (v), memory_order_relaxed)
#define ADD(p, v) atomic_fetch_add_explicit((p), (v), memory_order_relaxed)

#define FIRST_OCTAVE 6 /* 64 us */
#define LAST_OCTAVE 26 /* 2^26 us: beyond, the last bucket */

int
ric_hedge_bucket(int64_t us)
{
    int e;

    if (us < ((int64_t) 1 << FIRST_OCTAVE)) {
        return 0;
    }
    if (us >= ((int64_t) 1 << LAST_OCTAVE)) {
        return RIC_HEDGE_BUCKETS - 1;
    }
    e = 63 - __builtin_clzll((unsigned long long) us);
    return 1 + (e - FIRST_OCTAVE) * 4 + (int) ((us >> (e - 2)) & 3);
}

int64_t
ric_hedge_bucket_upper(int b)
{
    int j = b - 1;

    if (b <= 0) {
        return (int64_t) 1 << FIRST_OCTAVE;
    }
    if (b >= RIC_HEDGE_BUCKETS - 1) {
        return INT64_MAX;
    }
    return (int64_t) (5 + j % 4) << (FIRST_OCTAVE + j / 4 - 2);
}

void
ric_hedge_observe(ric_hedge_state_t *st, int64_t us)
{
    int i;

    if (st == NULL) {
        return;
    }
    ADD(&st->n[ric_hedge_bucket(us)], 1);
    if (ADD(&st->seen, 1) + 1 == RIC_HEDGE_WINDOW) {
        /* the window is complete: the past weighs half from now on */
        for (i = 0; i < RIC_HEDGE_BUCKETS; i++) {
            STORE(&st->n[i], LOAD(&st->n[i]) / 2);
        }
        STORE(&st->seen, 0);
    }
}

int64_t
ric_hedge_p95_us(const ric_hedge_state_t *st)
{
    uint64_t counts[RIC_HEDGE_BUCKETS], total = 0, want, run = 0;
    int i;

    if (st == NULL) {
        return -1;
    }
    for (i = 0; i < RIC_HEDGE_BUCKETS; i++) {
        counts[i] = LOAD(&st->n[i]);
        total += counts[i];
    }
    if (total < RIC_HEDGE_MIN_SAMPLES) {
        return -1;
    }
    /* the smallest bound with at least 95% of the observations at or below */
    want = (total * RIC_HEDGE_QUANTILE_MILLI + 999) / 1000;
    for (i = 0; i < RIC_HEDGE_BUCKETS; i++) {
        run += counts[i];
        if (run >= want) {
            return ric_hedge_bucket_upper(i);
        }
    }
    return ric_hedge_bucket_upper(RIC_HEDGE_BUCKETS - 1);
}
