/* test_hedge.c: retry_hedge auto's running p95: its buckets, its quantile, its decay, and how it behaves under the hedging it drives. */
#include "../../core/hedge.c"
#include "unit.h"

#include <stdlib.h>

static void
test_buckets(void)
{
    int64_t us;
    int b, last = 0;

    UNIT_CASE("the first buckets");
    UNIT_CHECK_INT(ric_hedge_bucket(0), 0);
    UNIT_CHECK_INT(ric_hedge_bucket(63), 0);
    UNIT_CHECK_INT(ric_hedge_bucket(64), 1);
    UNIT_CHECK_INT(ric_hedge_bucket_upper(0), 64);
    UNIT_CHECK_INT(ric_hedge_bucket_upper(1), 80);
    UNIT_CHECK_INT(ric_hedge_bucket(79), 1);
    UNIT_CHECK_INT(ric_hedge_bucket(80), 2);
    UNIT_CHECK_INT(ric_hedge_bucket_upper(4), 128);
    UNIT_CHECK_INT(ric_hedge_bucket(128), 5);

    UNIT_CASE("every time is below its bucket's bound and at or above the one before; buckets only grow");
    for (us = 1; us < ((int64_t) 1 << 27); us += 1 + us / 97) {
        b = ric_hedge_bucket(us);
        if (b < last || b >= RIC_HEDGE_BUCKETS || us >= ric_hedge_bucket_upper(b)
            || (b > 0 && us < ric_hedge_bucket_upper(b - 1))) {
            UNIT_CHECK(!"bucket of us");
            fprintf(stderr, "    us=%lld bucket=%d\n", (long long) us, b);
            return;
        }
        last = b;
    }
    UNIT_CHECK_INT(last, RIC_HEDGE_BUCKETS - 1);
    UNIT_CHECK(ric_hedge_bucket_upper(RIC_HEDGE_BUCKETS - 1) == INT64_MAX);
    UNIT_CASE("a bucket is at most a quarter octave wide (19%)");
    for (b = 2; b < RIC_HEDGE_BUCKETS - 1; b++) {
        UNIT_CHECK(ric_hedge_bucket_upper(b) * 100 <= ric_hedge_bucket_upper(b - 1) * 126);
    }
}

static void
test_quantile(void)
{
    ric_hedge_state_t st;
    int i;

    UNIT_CASE("no estimate below the minimum of observations");
    memset(&st, 0, sizeof(st));
    UNIT_CHECK_INT(ric_hedge_p95_us(&st), -1);
    UNIT_CHECK_INT(ric_hedge_p95_us(NULL), -1);
    for (i = 0; i < RIC_HEDGE_MIN_SAMPLES - 1; i++) {
        ric_hedge_observe(&st, 5000);
    }
    UNIT_CHECK_INT(ric_hedge_p95_us(&st), -1);
    ric_hedge_observe(&st, 5000);
    UNIT_CHECK_INT(ric_hedge_p95_us(&st), ric_hedge_bucket_upper(ric_hedge_bucket(5000)));
    UNIT_CHECK(ric_hedge_p95_us(&st) > 5000 && ric_hedge_p95_us(&st) <= 5000 * 119 / 100 + 1);

    UNIT_CASE("exactly 95% fast: the p95 is the fast answers' bound; one more slow: the slow one's");
    memset(&st, 0, sizeof(st));
    for (i = 0; i < 95; i++) {
        ric_hedge_observe(&st, 5000);
    }
    for (i = 0; i < 5; i++) {
        ric_hedge_observe(&st, 1000000);
    }
    UNIT_CHECK_INT(ric_hedge_p95_us(&st), ric_hedge_bucket_upper(ric_hedge_bucket(5000)));
    ric_hedge_observe(&st, 1000000);
    UNIT_CHECK_INT(ric_hedge_p95_us(&st), ric_hedge_bucket_upper(ric_hedge_bucket(1000000)));

    UNIT_CASE("a spread: 1..1000 ms evenly, the p95 near 950 ms");
    memset(&st, 0, sizeof(st));
    for (i = 1; i <= 400; i++) {
        ric_hedge_observe(&st, (int64_t) i * 2500);
    }
    UNIT_CHECK(ric_hedge_p95_us(&st) >= 950000 && ric_hedge_p95_us(&st) <= 950000 * 120 / 100);
}

static void
test_decay(void)
{
    ric_hedge_state_t st;
    uint64_t total;
    int i, j;

    UNIT_CASE("every window halves the past: the total stays bounded");
    memset(&st, 0, sizeof(st));
    for (i = 0; i < 20 * RIC_HEDGE_WINDOW; i++) {
        ric_hedge_observe(&st, 3000);
    }
    for (total = 0, j = 0; j < RIC_HEDGE_BUCKETS; j++) {
        total += st.n[j];
    }
    UNIT_CHECK(total <= 2 * RIC_HEDGE_WINDOW && total >= RIC_HEDGE_WINDOW / 2);

    UNIT_CASE("an upstream that was slow and is fast now: the estimate follows within a few windows");
    memset(&st, 0, sizeof(st));
    for (i = 0; i < 5000; i++) {
        ric_hedge_observe(&st, 800000);
    }
    UNIT_CHECK_INT(ric_hedge_p95_us(&st), ric_hedge_bucket_upper(ric_hedge_bucket(800000)));
    for (i = 0; i < 6 * RIC_HEDGE_WINDOW; i++) {
        ric_hedge_observe(&st, 4000);
    }
    UNIT_CHECK_INT(ric_hedge_p95_us(&st), ric_hedge_bucket_upper(ric_hedge_bucket(4000)));
    UNIT_CASE("...and back when it turns slow");
    for (i = 0; i < 6 * RIC_HEDGE_WINDOW; i++) {
        ric_hedge_observe(&st, 800000);
    }
    UNIT_CHECK_INT(ric_hedge_p95_us(&st), ric_hedge_bucket_upper(ric_hedge_bucket(800000)));
}

/* A deterministic source: xorshift64*. */
static uint64_t rng = 88172645463325252ULL;

static double
uniform(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (double) ((rng * 2685821657736338717ULL) >> 11) / 9007199254740992.0;
}

/*
 * The benchmark's upstream, simulated: 5% of answers take 1 s, the rest
 * 5 ms (plus up to 1 ms of noise). Each request's first attempt is hedged
 * after the current p95 (none while there is no estimate); the hedge is
 * an answer of the same kind; the first to answer wins and the other is
 * observed with the time it had run when cancelled, a hedge only when it
 * answered (the attempt-done entry's rule). The estimate must settle on the fast answers, so that
 * nearly every slow answer is hedged soon after 5 ms, whatever the
 * fraction of slow ones a window happens to hold.
 */
static void
test_hedged_bimodal(void)
{
    ric_hedge_state_t st;
    int64_t d, first, hedge, won, late = 0, hedges = 0, worst = 0;
    int i, n = 200000;

    UNIT_CASE("under its own hedging, 5% of 1 s answers: the p95 stays with the fast ones");
    memset(&st, 0, sizeof(st));
    for (i = 0; i < n; i++) {
        first = (uniform() < 0.05 ? 1000000 : 5000) + (int64_t) (uniform() * 1000);
        d = ric_hedge_p95_us(&st);
        if (d < 0 || first <= d) {
            ric_hedge_observe(&st, first);
            won = first;
        } else {
            hedges++;
            hedge = (uniform() < 0.05 ? 1000000 : 5000) + (int64_t) (uniform() * 1000);
            won = d + hedge < first ? d + hedge : first;
            ric_hedge_observe(&st, won); /* the first: answered, or cancelled at won */
            if (won != first) {
                ric_hedge_observe(&st, hedge); /* a hedge only when it answered */
            }
        }
        if (i > 1000) {
            late += won > 100000;
            worst = d > worst ? d : worst;
        }
    }
    UNIT_CHECK(late * 100 < (int64_t) n / 2); /* under 0.5% above 100 ms: the p99 well below */
    UNIT_CHECK(hedges * 100 < (int64_t) n * 8); /* at most 8% hedged: 1.08 attempts a request */
    UNIT_CHECK(worst < 100000);
    if (late * 100 >= (int64_t) n / 2 || hedges * 100 >= (int64_t) n * 8 || worst >= 100000) {
        fprintf(stderr, "    late=%lld hedges=%lld worst p95=%lld us\n", (long long) late,
                (long long) hedges, (long long) worst);
    }
}

/* A healthy upstream whose answers spread from 5 to 7 ms: hedging at its
 * own p95 must not feed on itself (the cancelled hedges, had they been
 * counted with the little time they ran, would pull the p95 down and
 * hedge ever more). About 5% hedged, as the p95 says. */
static void
test_hedged_spread(void)
{
    ric_hedge_state_t st;
    int64_t d, first, hedge, hedges = 0;
    int i, n = 100000;

    UNIT_CASE("a spread of answers: hedging at the p95 hedges about 5%, no more");
    memset(&st, 0, sizeof(st));
    for (i = 0; i < n; i++) {
        first = 5000 + (int64_t) (uniform() * 2000);
        d = ric_hedge_p95_us(&st);
        if (d < 0 || first <= d) {
            ric_hedge_observe(&st, first);
            continue;
        }
        hedges++;
        hedge = 5000 + (int64_t) (uniform() * 2000);
        if (d + hedge < first) {
            ric_hedge_observe(&st, d + hedge); /* the first, cancelled */
            ric_hedge_observe(&st, hedge);
        } else {
            ric_hedge_observe(&st, first); /* the hedge, cancelled: not counted */
        }
    }
    UNIT_CHECK(hedges * 100 <= (int64_t) n * 7);
    if (hedges * 100 > (int64_t) n * 7) {
        fprintf(stderr, "    hedges=%lld of %d\n", (long long) hedges, n);
    }
}

int
main(void)
{
    test_buckets();
    test_quantile();
    test_decay();
    test_hedged_bimodal();
    test_hedged_spread();
    return UNIT_DONE("hedge");
}
