/* hedge.h: when to hedge: the running p95 of an upstream's response times (retry_hedge auto), shared by all workers. */
#ifndef RIC_HEDGE_H
#define RIC_HEDGE_H

#include "ric_core.h"

#include <stdatomic.h>

/*
 * retry_hedge auto sends the hedge when the first attempt has had no
 * answer for as long as 95% of the upstream's recent attempts took. The
 * times are kept as a histogram in the shared zone, every worker adding
 * to it with relaxed atomics:
 *   - buckets of a quarter octave (each 19% wider than the last), from
 *     64 us to 2^26 us (67 s), one below and one above;
 *   - every RIC_HEDGE_WINDOW observations, the one that completes the
 *     window halves every bucket, so the estimate follows the last few
 *     thousand attempts (an observation landing during the halving may be
 *     lost: the figure is an estimate);
 *   - the p95 is the upper bound of the bucket where 95% is reached, so a
 *     hedge goes a little after it, never before;
 *   - with fewer than RIC_HEDGE_MIN_SAMPLES observations, no estimate.
 * A first attempt that its hedge beat is observed with the time it had
 * run when it was cancelled: it took at least that long (longer than the
 * hedge's delay). So once the hedges work, the slow answers they cut short
 * stay near the delay instead of pushing the p95 up to themselves. A hedge
 * is observed only when it answered: a cancelled one ran only as long as
 * the first took beyond the delay, and counting that would pull the p95
 * down, and hedge more, without end.
 */
#define RIC_HEDGE_BUCKETS 82
#define RIC_HEDGE_WINDOW 512
#define RIC_HEDGE_MIN_SAMPLES 50
#define RIC_HEDGE_QUANTILE_MILLI 950

/* retry_hedge's value: off, auto, or a fixed delay in ms (> 0). */
#define RIC_HEDGE_OFF 0
#define RIC_HEDGE_AUTO (-2)

typedef struct ric_hedge_state_s {
    _Atomic uint32_t n[RIC_HEDGE_BUCKETS];
    _Atomic int64_t seen; /* observations since the last halving */
} ric_hedge_state_t;

/* An attempt's response time (to its head), or how long a cancelled or
 * timed-out one had run, in microseconds. */
void ric_hedge_observe(ric_hedge_state_t *st, int64_t us);

/* The running p95 in microseconds; -1 when there are too few
 * observations yet. */
int64_t ric_hedge_p95_us(const ric_hedge_state_t *st);

/* The bucket of us, and the bucket's upper bound (us; INT64_MAX for the
 * last). For tests and the docs' figures. */
int ric_hedge_bucket(int64_t us);
int64_t ric_hedge_bucket_upper(int b);

#endif /* RIC_HEDGE_H */
