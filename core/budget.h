/* budget.h: a retry budget over a sliding 10-second window (per upstream, per worker). */
#ifndef RIC_BUDGET_H
#define RIC_BUDGET_H

#include "ric_core.h"

#define RIC_BUDGET_BUCKETS 10 /* one-second buckets: a 10 s window */

typedef struct {
    double ratio;        /* retries allowed per request, e.g. 0.2 */
    int64_t min_per_sec; /* retries allowed per second regardless, e.g. 10 */
    int64_t bucket_sec[RIC_BUDGET_BUCKETS]; /* which second each bucket holds */
    int64_t requests[RIC_BUDGET_BUCKETS];
    int64_t retries[RIC_BUDGET_BUCKETS];
    int64_t exhausted;   /* retries refused, ever (for logs and metrics) */
} ric_budget_t;

/* ratio >= 0, min_per_sec >= 0. */
void ric_budget_init(ric_budget_t *b, double ratio, int64_t min_per_sec);

/* Counts a new client request at now_ms. */
void ric_budget_request(ric_budget_t *b, int64_t now_ms);

/* Asks for one retry at now_ms: within the last 10 s, retries so far + 1 <=
 * max(ratio * requests, min_per_sec * 10). Counts it and returns 1 when
 * allowed; returns 0 and counts an exhaustion otherwise. */
int ric_budget_take(ric_budget_t *b, int64_t now_ms);

#endif /* RIC_BUDGET_H */
