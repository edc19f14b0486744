/* test_budget.c: the retry budget's ratio, per-second minimum and sliding window, on an injected clock. */
#include "../../core/budget.c"
#include "unit.h"

static void
requests(ric_budget_t *b, int n, int64_t now_ms)
{
    while (n-- > 0) {
        ric_budget_request(b, now_ms);
    }
}

/* Takes up to n retries at now_ms; returns how many were allowed. */
static int
takes(ric_budget_t *b, int n, int64_t now_ms)
{
    int allowed = 0;

    while (n-- > 0) {
        allowed += ric_budget_take(b, now_ms);
    }
    return allowed;
}

static void
test_ratio(void)
{
    ric_budget_t b;
    int i;

    UNIT_CASE("20% of 100 requests: exactly 20 retries, then refused and counted");
    ric_budget_init(&b, 0.2, 0);
    requests(&b, 100, 1000);
    for (i = 0; i < 20; i++) {
        UNIT_CHECK_INT(ric_budget_take(&b, 1500), 1);
    }
    UNIT_CHECK_INT(b.exhausted, 0);
    UNIT_CHECK_INT(ric_budget_take(&b, 1500), 0);
    UNIT_CHECK_INT(b.exhausted, 1);
    UNIT_CHECK_INT(ric_budget_take(&b, 1999), 0);
    UNIT_CHECK_INT(b.exhausted, 2);

    UNIT_CASE("more requests make room again");
    requests(&b, 5, 2000);
    UNIT_CHECK_INT(takes(&b, 5, 2000), 1);
    UNIT_CHECK_INT(b.exhausted, 6);

    UNIT_CASE("requests spread over the window all count");
    ric_budget_init(&b, 0.2, 0);
    for (i = 0; i < 10; i++) {
        requests(&b, 10, 50000 + i * 1000 + 999);
    }
    UNIT_CHECK_INT(takes(&b, 30, 59999), 20);

    UNIT_CASE("ratio * requests is floored");
    ric_budget_init(&b, 0.2, 0);
    requests(&b, 4, 0);
    UNIT_CHECK_INT(takes(&b, 3, 0), 0);
    requests(&b, 5, 0);
    UNIT_CHECK_INT(takes(&b, 3, 0), 1); /* 1.8 -> 1 */
    ric_budget_init(&b, 0.29, 0);
    requests(&b, 100, 0);
    UNIT_CHECK_INT(takes(&b, 40, 0), 29); /* 0.29 * 100 is 28.999999999999996 in double */
    ric_budget_init(&b, 1.5, 0);
    requests(&b, 3, 0);
    UNIT_CHECK_INT(takes(&b, 10, 0), 4);

    UNIT_CASE("ratio 0, min 0: never");
    ric_budget_init(&b, 0, 0);
    UNIT_CHECK_INT(takes(&b, 5, 0), 0);
    requests(&b, 1000000, 0);
    UNIT_CHECK_INT(takes(&b, 5, 500), 0);
    UNIT_CHECK_INT(takes(&b, 5, 100000), 0);
    UNIT_CHECK_INT(b.exhausted, 15);

    UNIT_CASE("negative or NaN settings behave as 0");
    ric_budget_init(&b, -1, -5);
    requests(&b, 100, 0);
    UNIT_CHECK_INT(takes(&b, 5, 0), 0);
    ric_budget_init(&b, NAN, 0);
    requests(&b, 100, 0);
    UNIT_CHECK_INT(takes(&b, 5, 0), 0);
}

static void
test_minimum(void)
{
    ric_budget_t b;

    UNIT_CASE("min=10/s with no requests: 100 retries in a window");
    ric_budget_init(&b, 0.2, 10);
    UNIT_CHECK_INT(takes(&b, 150, 7000), 100);
    UNIT_CHECK_INT(b.exhausted, 50);

    UNIT_CASE("the larger of ratio and minimum applies");
    ric_budget_init(&b, 0.5, 1);
    requests(&b, 10, 0);
    UNIT_CHECK_INT(takes(&b, 20, 0), 10); /* max(5, 10) */
    ric_budget_init(&b, 0.5, 1);
    requests(&b, 100, 0);
    UNIT_CHECK_INT(takes(&b, 80, 0), 50); /* max(50, 10) */

    UNIT_CASE("a huge minimum does not overflow");
    ric_budget_init(&b, 0, INT64_MAX);
    UNIT_CHECK_INT(takes(&b, 1000, 0), 1000);
    ric_budget_init(&b, 1e300, 0);
    requests(&b, 1, 0);
    UNIT_CHECK_INT(takes(&b, 1000, 0), 1000);
}

static void
test_window(void)
{
    ric_budget_t b;

    UNIT_CASE("a bucket counts until its second is older than now - 9 s");
    ric_budget_init(&b, 0.2, 0);
    requests(&b, 100, 0);    /* second 0 */
    UNIT_CHECK_INT(takes(&b, 10, 5000), 10); /* second 5 */
    UNIT_CHECK_INT(takes(&b, 20, 9999), 10); /* second 9: all still in */
    UNIT_CHECK_INT(takes(&b, 1, 10000), 0);  /* second 10: the requests left */
    requests(&b, 100, 10000);
    UNIT_CHECK_INT(takes(&b, 30, 10000), 0); /* 20 retries (5 s, 9 s) still count */
    UNIT_CHECK_INT(takes(&b, 30, 15000), 10); /* the 5 s retries left */
    UNIT_CHECK_INT(takes(&b, 30, 19000), 10); /* the 9 s retries left, 15 s ones remain */
    UNIT_CHECK_INT(takes(&b, 30, 20000), 0);  /* and now the requests are gone */

    UNIT_CASE("min=10/s: the window refills as old retries age out");
    ric_budget_init(&b, 0, 10);
    UNIT_CHECK_INT(takes(&b, 100, 0), 100);
    UNIT_CHECK_INT(takes(&b, 1, 9999), 0);
    UNIT_CHECK_INT(takes(&b, 200, 10000), 100);
    UNIT_CHECK_INT(b.exhausted, 101);

    UNIT_CASE("gaps longer than the window: a reused slot starts from zero");
    ric_budget_init(&b, 0.5, 0);
    requests(&b, 100, 3000);                 /* second 3, slot 3 */
    UNIT_CHECK_INT(takes(&b, 10, 3000), 10);
    requests(&b, 10, 33500);                 /* second 33, slot 3 again */
    UNIT_CHECK_INT(b.requests[3], 10);
    UNIT_CHECK_INT(takes(&b, 10, 33500), 5); /* 10 requests, not 110; 0 old retries */
    requests(&b, 10, 1000000500);            /* a gap of ~11 days */
    UNIT_CHECK_INT(takes(&b, 10, 1000000500), 5);
    UNIT_CHECK_INT(takes(&b, 10, 1000009999), 0);
    UNIT_CHECK_INT(takes(&b, 10, 1000010000), 0);

    UNIT_CASE("a clock that steps back counts into the newest bucket");
    ric_budget_init(&b, 0.5, 0);
    requests(&b, 10, 5000);
    requests(&b, 10, 3000); /* into second 5, not a reset of anything */
    UNIT_CHECK_INT(b.requests[5], 20);
    UNIT_CHECK_INT(takes(&b, 20, 1000), 10);
    UNIT_CHECK_INT(b.retries[5], 10);

    UNIT_CASE("times before the epoch floor to the right second");
    ric_budget_init(&b, 0.5, 0);
    requests(&b, 10, -1);
    UNIT_CHECK_INT(b.bucket_sec[9], -1);
    UNIT_CHECK_INT(takes(&b, 10, 8999), 5);
    UNIT_CHECK_INT(takes(&b, 10, 9000), 0);
}

static void
test_steady(void)
{
    ric_budget_t b;
    int64_t req_per_sec[100], ok_per_sec[100];
    int s, w, ok = 1, total = 0;

    /* 37 requests a second, each failing and asking for 3 retries: every
     * 10 s window must hold no more retries than 20% of its requests. */
    UNIT_CASE("steady overload: every sliding window within the ratio");
    ric_budget_init(&b, 0.2, 0);
    for (s = 0; s < 100; s++) {
        req_per_sec[s] = 37;
        requests(&b, 37, s * 1000 + 10);
        ok_per_sec[s] = takes(&b, 111, s * 1000 + 500);
        total += (int) ok_per_sec[s];
    }
    for (s = 9; s < 100; s++) {
        int64_t r = 0, k = 0;
        for (w = s - 9; w <= s; w++) {
            r += req_per_sec[w];
            k += ok_per_sec[w];
        }
        ok &= k <= r / 5;
    }
    UNIT_CHECK(ok);
    UNIT_CHECK(total >= 700 && total <= 740); /* ~7.4 a second */
}

int
main(void)
{
    test_ratio();
    test_minimum();
    test_window();
    test_steady();
    return UNIT_DONE("budget");
}
