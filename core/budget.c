/* budget.c: a retry budget counted in ten one-second buckets, a sliding 10 s window. */
#include "budget.h"

#include <math.h>

/*
 * Bucket i holds second s when s mod 10 == i and bucket_sec[i] == s. A
 * bucket whose second is outside [now - 9, now] counts as zero and is reset
 * when its slot is reused, so a gap of any length needs no catch-up work.
 */

/* Below any real second: an unused bucket never falls inside a window. */
#define NO_SECOND INT64_MIN

void
ric_budget_init(ric_budget_t *b, double ratio, int64_t min_per_sec)
{
    int i;

    memset(b, 0, sizeof(*b));
    b->ratio = ratio > 0 ? ratio : 0; /* also maps NaN to 0 */
    b->min_per_sec = ric_max(min_per_sec, 0);
    for (i = 0; i < RIC_BUDGET_BUCKETS; i++) {
        b->bucket_sec[i] = NO_SECOND;
    }
}

/* The current second. A clock that steps back (it should not: callers pass
 * a monotonic time) counts into the newest bucket rather than wiping it. */
static int64_t
current_second(const ric_budget_t *b, int64_t now_ms)
{
    int64_t sec = now_ms / 1000 - (now_ms % 1000 < 0), newest = NO_SECOND;
    int i;

    for (i = 0; i < RIC_BUDGET_BUCKETS; i++) {
        newest = ric_max(newest, b->bucket_sec[i]);
    }
    return ric_max(sec, newest);
}

/* The bucket for second sec, reset if it held an older second. */
static int
bucket_for(ric_budget_t *b, int64_t sec)
{
    int i = (int) (sec % RIC_BUDGET_BUCKETS);

    if (i < 0) {
        i += RIC_BUDGET_BUCKETS;
    }
    if (b->bucket_sec[i] != sec) {
        b->bucket_sec[i] = sec;
        b->requests[i] = 0;
        b->retries[i] = 0;
    }
    return i;
}

void
ric_budget_request(ric_budget_t *b, int64_t now_ms)
{
    int i = bucket_for(b, current_second(b, now_ms));

    if (b->requests[i] < INT64_MAX) {
        b->requests[i]++;
    }
}

int
ric_budget_take(ric_budget_t *b, int64_t now_ms)
{
    int64_t sec = current_second(b, now_ms), requests = 0, retries = 0, allowed, floor_min;
    double by_ratio;
    int i;

    for (i = 0; i < RIC_BUDGET_BUCKETS; i++) {
        if (b->bucket_sec[i] != NO_SECOND && b->bucket_sec[i] > sec - RIC_BUDGET_BUCKETS
            && b->bucket_sec[i] <= sec) {
            requests += b->requests[i];
            retries += b->retries[i];
        }
    }

    /* floor(ratio * requests): a fraction of a retry is not a retry (20% of
     * 9 requests allows 1). The 1e-9 absorbs binary rounding, so 0.29 * 100
     * (28.999999999999996 in double) still allows 29. */
    by_ratio = requests > 0 ? floor(b->ratio * (double) requests + 1e-9) : 0;
    allowed = by_ratio < 9.2e18 ? (int64_t) by_ratio : INT64_MAX;
    floor_min = b->min_per_sec > INT64_MAX / RIC_BUDGET_BUCKETS
                    ? INT64_MAX
                    : b->min_per_sec * RIC_BUDGET_BUCKETS;
    allowed = ric_max(allowed, floor_min);

    /* retries + 1 <= allowed, without overflowing at INT64_MAX */
    if (retries >= allowed) {
        b->exhausted++;
        return 0;
    }
    i = bucket_for(b, sec);
    b->retries[i]++;
    return 1;
}
