/* test_budget.c: the adaptive retry budget and the ratio form, on an injected clock, and across processes. */
#include "../../core/budget.c"
#include "shm.h"
#include "unit.h"

#include <sys/wait.h>
#include <unistd.h>

/* A budget with its own state, like one upstream's. */
typedef struct {
    ric_budget_conf_t conf;
    ric_budget_state_t st;
    ric_budget_t b;
} budget_t;

static ric_budget_t *
adaptive(budget_t *t, int64_t max, int64_t wait_ms)
{
    ric_budget_conf_default(&t->conf);
    t->conf.max_tokens = max;
    t->conf.wait_ms = wait_ms;
    ric_budget_reset(&t->st, &t->conf);
    t->b.conf = &t->conf;
    t->b.st = &t->st;
    return &t->b;
}

static ric_budget_t *
ratio(budget_t *t, double r, int64_t min)
{
    ric_budget_conf_default(&t->conf);
    t->conf.kind = RIC_BUDGET_RATIO;
    t->conf.ratio = r > 0 ? r : 0;
    t->conf.min_per_sec = min;
    ric_budget_reset(&t->st, &t->conf);
    t->b.conf = &t->conf;
    t->b.st = &t->st;
    return &t->b;
}

static void
requests(ric_budget_t *b, int n, int64_t now_ms)
{
    while (n-- > 0) {
        ric_budget_request(b, now_ms);
    }
}

/* Takes up to n retries at now_ms; returns how many were granted. */
static int
takes(ric_budget_t *b, int n, int64_t now_ms)
{
    int granted = 0;

    while (n-- > 0) {
        granted += ric_budget_take(b, RIC_BUDGET_COST, now_ms, 1, NULL) == RIC_BUDGET_GRANTED;
    }
    return granted;
}

/* n requests answered well at their first attempt. */
static void
successes(ric_budget_t *b, int n, int64_t now_ms)
{
    while (n-- > 0) {
        ric_budget_outcome(b, 0, 0, now_ms);
    }
}

/* A small deterministic generator (the test's own, reproducible). */
static uint64_t lcg = 88172645463325252ULL;

static double
uniform(void)
{
    lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double) (lcg >> 11) / 9007199254740992.0;
}

/*
 * Runs n requests, one a millisecond from *now, against an upstream whose
 * every attempt fails with probability p, with up to `attempts` attempts
 * each, the way attempt.c asks: check when deciding, take when sending,
 * report every outcome. A retry told to wait asks again 250 ms later
 * (simulated at once, on the clock). Returns the requests answered well;
 * *retries the retries sent; *refused the requests the budget cut short.
 */
static int
run(ric_budget_t *b, int n, double p, int attempts, int64_t *now, int *retries, int *refused)
{
    int i, a, good = 0, failed;
    int64_t t, paid;
    ric_budget_verdict_t v;

    *retries = *refused = 0;
    for (i = 0; i < n; i++, (*now)++) {
        t = *now;
        paid = 0;
        for (a = 1; a <= attempts; a++) {
            failed = uniform() < p;
            ric_budget_outcome(b, failed, paid, t);
            if (!failed) {
                good++;
                break;
            }
            if (a == attempts) {
                break;
            }
            if (ric_budget_check(b, RIC_BUDGET_COST, t) == RIC_BUDGET_REFUSED) {
                (*refused)++;
                break;
            }
            while ((v = ric_budget_take(b, RIC_BUDGET_COST, t, 1, &paid)) == RIC_BUDGET_WAIT) {
                t += 250;
            }
            if (v == RIC_BUDGET_REFUSED) {
                (*refused)++;
                break;
            }
            (*retries)++;
        }
    }
    return good;
}

static void
test_adaptive(void)
{
    budget_t t;
    ric_budget_t *b;
    int64_t now = 1000000, paid = -1;
    int good, retries, refused, probes, i;

    UNIT_CASE("the default rule: adaptive max=100 wait=5s");
    b = adaptive(&t, RIC_BUDGET_MAX_DEFAULT, RIC_BUDGET_WAIT_DEFAULT);
    UNIT_CHECK_INT(t.conf.kind, RIC_BUDGET_ADAPTIVE);
    UNIT_CHECK_INT(ric_budget_tokens(b), 10000);

    UNIT_CASE("a cold bucket pays for 10 failing retries, then refuses at once");
    UNIT_CHECK_INT(ric_budget_check(b, RIC_BUDGET_COST, now), RIC_BUDGET_GRANTED);
    UNIT_CHECK_INT(ric_budget_tokens(b), 10000); /* checking pays nothing */
    UNIT_CHECK_INT(takes(b, 15, now), 10);
    UNIT_CHECK_INT(ric_budget_check(b, RIC_BUDGET_COST, now), RIC_BUDGET_REFUSED);
    UNIT_CHECK_INT(LOAD(&t.st.refused), 6);
    UNIT_CHECK_INT(LOAD(&t.st.granted), 10);

    UNIT_CASE("a success earns half a token; a successful retry also gets its token back");
    b = adaptive(&t, 100, 5000);
    successes(b, 4, now);
    UNIT_CHECK_INT(ric_budget_tokens(b), 12000);
    UNIT_CHECK_INT(ric_budget_take(b, RIC_BUDGET_COST, now, 1, &paid), RIC_BUDGET_GRANTED);
    UNIT_CHECK_INT(paid, RIC_BUDGET_COST);
    UNIT_CHECK_INT(ric_budget_tokens(b), 11000);
    ric_budget_outcome(b, 0, paid, now); /* the retry worked */
    UNIT_CHECK_INT(ric_budget_tokens(b), 12500);
    UNIT_CHECK_INT(ric_budget_take(b, RIC_BUDGET_COST, now, 1, &paid), RIC_BUDGET_GRANTED);
    ric_budget_outcome(b, 1, paid, now); /* it failed: the token is spent */
    UNIT_CHECK_INT(ric_budget_tokens(b), 11500);
    ric_budget_outcome(b, 1, 0, now); /* a failed first attempt costs nothing */
    UNIT_CHECK_INT(ric_budget_tokens(b), 11500);

    UNIT_CASE("a retry after a timeout costs two tokens");
    UNIT_CHECK_INT(ric_budget_take(b, RIC_BUDGET_COST_TIMEOUT, now, 1, &paid), RIC_BUDGET_GRANTED);
    UNIT_CHECK_INT(paid, RIC_BUDGET_COST_TIMEOUT);
    UNIT_CHECK_INT(ric_budget_tokens(b), 9500);

    UNIT_CASE("the bucket holds at most max tokens");
    successes(b, 1000, now);
    UNIT_CHECK_INT(ric_budget_tokens(b), 100000);

    UNIT_CASE("30% random failures, 4 attempts: retries go on, ~99.2% succeed");
    b = adaptive(&t, 100, 5000);
    good = run(b, 20000, 0.3, 4, &now, &retries, &refused);
    UNIT_CHECK_INT(refused, 0);
    UNIT_CHECK(good >= 19750); /* 1 - 0.3^4 = 99.19%: 19838 expected */
    UNIT_CHECK(retries > 8000); /* ~0.42 a request */
    UNIT_CHECK(ric_budget_tokens(b) >= 50000);

    UNIT_CASE("40% random failures: still every retry");
    b = adaptive(&t, 100, 5000);
    run(b, 20000, 0.4, 4, &now, &retries, &refused);
    UNIT_CHECK_INT(refused, 0);

    UNIT_CASE("an outage from cold: at most 10 retries in all, then one attempt a request");
    b = adaptive(&t, 100, 5000);
    successes(b, 1, now); /* a sanity check before it went down */
    good = run(b, 1000, 1.0, 4, &now, &retries, &refused);
    UNIT_CHECK_INT(good, 0);
    UNIT_CHECK_INT(retries, 10);
    UNIT_CHECK_INT(refused, 997); /* 3 requests ran out of attempts, the 4th of budget */

    UNIT_CASE("an outage after healthy traffic: max retries, waits while recent, then refusals");
    b = adaptive(&t, 100, 5000);
    successes(b, 1000, now);
    UNIT_CHECK_INT(takes(b, 200, now), 101); /* 100 paid and one probe */
    UNIT_CHECK_INT(ric_budget_take(b, RIC_BUDGET_COST, now + 99, 1, NULL), RIC_BUDGET_WAIT);
    /* a request's last attempt never goes as a probe */
    UNIT_CHECK_INT(ric_budget_take(b, RIC_BUDGET_COST, now + 4999, 0, &paid), RIC_BUDGET_WAIT);
    UNIT_CHECK_INT(ric_budget_take(b, RIC_BUDGET_COST, now + 4999, 1, &paid), RIC_BUDGET_GRANTED);
    UNIT_CHECK_INT(paid, 0); /* a probe pays nothing */
    UNIT_CHECK_INT(ric_budget_take(b, RIC_BUDGET_COST, now + 4999, 1, NULL), RIC_BUDGET_WAIT);
    UNIT_CHECK_INT(ric_budget_check(b, RIC_BUDGET_COST, now + 4999), RIC_BUDGET_WAIT);
    UNIT_CHECK_INT(ric_budget_take(b, RIC_BUDGET_COST, now + 5000, 1, NULL), RIC_BUDGET_REFUSED);
    now += 5000;
    good = run(b, 1000, 1.0, 4, &now, &retries, &refused);
    UNIT_CHECK_INT(retries, 0);
    UNIT_CHECK_INT(refused, 1000);

    UNIT_CASE("recovery refills it: successes earn tokens back, then retries pay again");
    successes(b, 20, now);
    UNIT_CHECK_INT(ric_budget_tokens(b), 10000);
    UNIT_CHECK_INT(ric_budget_check(b, RIC_BUDGET_COST, now), RIC_BUDGET_GRANTED);
    good = run(b, 2000, 0.3, 4, &now, &retries, &refused);
    UNIT_CHECK_INT(refused, 0);
    UNIT_CHECK(good >= 1970);

    UNIT_CASE("a brownout after healthy traffic: retries wait it out, then all succeed");
    b = adaptive(&t, 100, 5000);
    successes(b, 1000, now);
    /* 1.5 s of failures at 1000 requests a second: the first 100 retries
     * are paid (and fail), one probe goes every 100 ms (and fails); every
     * other one is told to wait, not refused */
    for (i = 0, retries = refused = good = probes = 0; i < 1500; i++) {
        ric_budget_outcome(b, 1, 0, now + i);
        if (ric_budget_check(b, RIC_BUDGET_COST, now + i) == RIC_BUDGET_REFUSED) {
            refused++;
        } else if (ric_budget_take(b, RIC_BUDGET_COST, now + i, 1, &paid) == RIC_BUDGET_GRANTED) {
            retries += paid > 0;
            probes += paid == 0;
            ric_budget_outcome(b, 1, paid, now + i);
        } else {
            good++; /* waiting */
        }
    }
    UNIT_CHECK_INT(retries, 100);
    UNIT_CHECK_INT(probes, 14); /* from the 100th ms on */
    UNIT_CHECK_INT(refused, 0);
    UNIT_CHECK_INT(good, 1386);
    /* it recovers at 1.5 s and no new request arrives: the waiting ones ask
     * again every 10 ms; the next probe succeeds and earns, and what that
     * pays for comes back with more, until none is left waiting */
    now += 1500;
    for (i = 0; good > 0 && i < 1000; i++, now += 10) {
        int k, waiting = good;
        for (k = 0; k < waiting; k++) {
            if (ric_budget_take(b, RIC_BUDGET_COST, now, 1, &paid) != RIC_BUDGET_GRANTED) {
                break;
            }
            ric_budget_outcome(b, 0, paid, now); /* it works again */
            good--;
        }
    }
    UNIT_CHECK_INT(good, 0);
    UNIT_CHECK(i <= 12); /* within ~120 ms, long before wait=5s ran out */

    UNIT_CASE("wait=0 never waits");
    b = adaptive(&t, 100, 0);
    successes(b, 1000, now);
    UNIT_CHECK_INT(takes(b, 100, now), 100);
    UNIT_CHECK_INT(ric_budget_take(b, RIC_BUDGET_COST, now, 1, NULL), RIC_BUDGET_REFUSED);

    UNIT_CASE("a retry whose request ended first gets its token back, and is no sign of health");
    b = adaptive(&t, 100, 5000);
    UNIT_CHECK_INT(ric_budget_take(b, RIC_BUDGET_COST, now, 1, &paid), RIC_BUDGET_GRANTED);
    ric_budget_refund(b, paid);
    UNIT_CHECK_INT(ric_budget_tokens(b), 10000);
    successes(b, 80, now); /* 50 tokens: half full, healthy */
    UNIT_CHECK_INT(LOAD(&t.st.healthy_ms), now);
    UNIT_CHECK_INT(takes(b, 1, now + 10), 1);
    ric_budget_refund(b, RIC_BUDGET_COST);
    UNIT_CHECK_INT(LOAD(&t.st.healthy_ms), now);

    UNIT_CASE("max=1 still pays for a timeout's retry");
    b = adaptive(&t, 1, 5000);
    UNIT_CHECK_INT(ric_budget_take(b, RIC_BUDGET_COST_TIMEOUT, now, 1, &paid), RIC_BUDGET_GRANTED);
    UNIT_CHECK_INT(paid, RIC_BUDGET_COST);

    UNIT_CASE("a bucket smaller than the start holds max");
    b = adaptive(&t, 3, 5000);
    UNIT_CHECK_INT(ric_budget_tokens(b), 3000);
    for (i = 0; i < 3; i++) {
        UNIT_CHECK_INT(ric_budget_take(b, RIC_BUDGET_COST, now, 1, NULL), RIC_BUDGET_GRANTED);
    }
    UNIT_CHECK_INT(ric_budget_take(b, RIC_BUDGET_COST, now, 1, NULL), RIC_BUDGET_REFUSED);
}

static void
test_off(void)
{
    budget_t t;
    ric_budget_t *b = adaptive(&t, 100, 5000);

    UNIT_CASE("off: every retry granted");
    t.conf.kind = RIC_BUDGET_OFF;
    UNIT_CHECK_INT(takes(b, 100000, 0), 100000);
    ric_budget_outcome(b, 0, 0, 0);
    UNIT_CHECK_INT(ric_budget_tokens(b), 10000);
}

static void
test_hedge(void)
{
    budget_t t;
    ric_budget_t *b = adaptive(&t, 100, 5000);
    int64_t paid = -1;
    int i;

    UNIT_CASE("a hedge pays one token at once, and a win gives it back");
    UNIT_CHECK_INT(ric_budget_take_hedge(b, 1000, &paid), 1);
    UNIT_CHECK_INT(paid, RIC_BUDGET_COST);
    UNIT_CHECK_INT(ric_budget_tokens(b), RIC_BUDGET_START - RIC_BUDGET_COST);
    ric_budget_outcome(b, 0, paid, 1000);
    UNIT_CHECK_INT(ric_budget_tokens(b), RIC_BUDGET_START + RIC_BUDGET_EARN);

    UNIT_CASE("lost hedges drain the bucket; then none, never a wait or a probe, and no retry refused");
    for (i = 0; i < 10; i++) {
        UNIT_CHECK_INT(ric_budget_take_hedge(b, 1000, &paid), 1);
    }
    UNIT_CHECK_INT(ric_budget_take_hedge(b, 1000, &paid), 0); /* half a token left */
    UNIT_CHECK_INT(ric_budget_take_hedge(b, 200000, &paid), 0); /* a probe would be due: none */
    UNIT_CHECK_INT(t.st.refused, 0);
    UNIT_CHECK_INT(t.st.waits, 0);
    UNIT_CHECK_INT(t.st.granted, 0);

    UNIT_CASE("the ratio form: a hedge is one of its retries");
    b = ratio(&t, 0.2, 0);
    requests(b, 10, 1000);
    UNIT_CHECK_INT(ric_budget_take_hedge(b, 1500, &paid), 1);
    UNIT_CHECK_INT(ric_budget_take_hedge(b, 1500, &paid), 1);
    UNIT_CHECK_INT(ric_budget_take_hedge(b, 1500, &paid), 0);
    UNIT_CHECK_INT(ric_budget_take(b, RIC_BUDGET_COST, 1500, 1, NULL), RIC_BUDGET_REFUSED);

    UNIT_CASE("off: every hedge");
    b = adaptive(&t, 1, 5000);
    t.conf.kind = RIC_BUDGET_OFF;
    UNIT_CHECK_INT(ric_budget_take_hedge(b, 0, &paid), 1);
    UNIT_CHECK_INT(paid, 0);
}

static void
test_ratio(void)
{
    budget_t t;
    ric_budget_t *b;
    int i;

    UNIT_CASE("20% of 100 requests: exactly 20 retries, then refused and counted");
    b = ratio(&t, 0.2, 0);
    requests(b, 100, 1000);
    UNIT_CHECK_INT(ric_budget_check(b, RIC_BUDGET_COST, 1500), RIC_BUDGET_GRANTED);
    for (i = 0; i < 20; i++) {
        UNIT_CHECK_INT(ric_budget_take(b, RIC_BUDGET_COST, 1500, 1, NULL), RIC_BUDGET_GRANTED);
    }
    UNIT_CHECK_INT(LOAD(&t.st.refused), 0);
    UNIT_CHECK_INT(ric_budget_take(b, RIC_BUDGET_COST, 1500, 1, NULL), RIC_BUDGET_REFUSED);
    UNIT_CHECK_INT(LOAD(&t.st.refused), 1);
    UNIT_CHECK_INT(ric_budget_take(b, RIC_BUDGET_COST, 1999, 1, NULL), RIC_BUDGET_REFUSED);
    UNIT_CHECK_INT(LOAD(&t.st.refused), 2);

    UNIT_CASE("more requests make room again");
    requests(b, 5, 2000);
    UNIT_CHECK_INT(takes(b, 5, 2000), 1);
    UNIT_CHECK_INT(LOAD(&t.st.refused), 6);

    UNIT_CASE("requests spread over the window all count");
    b = ratio(&t, 0.2, 0);
    for (i = 0; i < 10; i++) {
        requests(b, 10, 50000 + i * 1000 + 999);
    }
    UNIT_CHECK_INT(takes(b, 30, 59999), 20);

    UNIT_CASE("ratio * requests is floored");
    b = ratio(&t, 0.2, 0);
    requests(b, 4, 0);
    UNIT_CHECK_INT(takes(b, 3, 0), 0);
    requests(b, 5, 0);
    UNIT_CHECK_INT(takes(b, 3, 0), 1); /* 1.8 -> 1 */
    b = ratio(&t, 0.29, 0);
    requests(b, 100, 0);
    UNIT_CHECK_INT(takes(b, 40, 0), 29); /* 0.29 * 100 is 28.999999999999996 in double */
    b = ratio(&t, 1.5, 0);
    requests(b, 3, 0);
    UNIT_CHECK_INT(takes(b, 10, 0), 4);

    UNIT_CASE("ratio 0, min 0: never; outcomes change nothing");
    b = ratio(&t, 0, 0);
    UNIT_CHECK_INT(takes(b, 5, 0), 0);
    requests(b, 1000000, 0);
    successes(b, 1000, 0);
    UNIT_CHECK_INT(takes(b, 5, 500), 0);
    UNIT_CHECK_INT(takes(b, 5, 100000), 0);
    UNIT_CHECK_INT(LOAD(&t.st.refused), 15);
}

static void
test_minimum(void)
{
    budget_t t;
    ric_budget_t *b;

    UNIT_CASE("min=10/s with no requests: 100 retries in a window");
    b = ratio(&t, 0.2, 10);
    UNIT_CHECK_INT(takes(b, 150, 7000), 100);
    UNIT_CHECK_INT(LOAD(&t.st.refused), 50);

    UNIT_CASE("the larger of ratio and minimum applies");
    b = ratio(&t, 0.5, 1);
    requests(b, 10, 0);
    UNIT_CHECK_INT(takes(b, 20, 0), 10); /* max(5, 10) */
    b = ratio(&t, 0.5, 1);
    requests(b, 100, 0);
    UNIT_CHECK_INT(takes(b, 80, 0), 50); /* max(50, 10) */

    UNIT_CASE("a huge minimum does not overflow");
    b = ratio(&t, 0, INT64_MAX);
    UNIT_CHECK_INT(takes(b, 1000, 0), 1000);
    b = ratio(&t, 1e300, 0);
    requests(b, 1, 0);
    UNIT_CHECK_INT(takes(b, 1000, 0), 1000);
}

static void
test_window(void)
{
    budget_t t;
    ric_budget_t *b;

    UNIT_CASE("a bucket counts until its second is older than now - 9 s");
    b = ratio(&t, 0.2, 0);
    requests(b, 100, 0);    /* second 0 */
    UNIT_CHECK_INT(takes(b, 10, 5000), 10); /* second 5 */
    UNIT_CHECK_INT(takes(b, 20, 9999), 10); /* second 9: all still in */
    UNIT_CHECK_INT(takes(b, 1, 10000), 0);  /* second 10: the requests left */
    requests(b, 100, 10000);
    UNIT_CHECK_INT(takes(b, 30, 10000), 0); /* 20 retries (5 s, 9 s) still count */
    UNIT_CHECK_INT(takes(b, 30, 15000), 10); /* the 5 s retries left */
    UNIT_CHECK_INT(takes(b, 30, 19000), 10); /* the 9 s retries left, 15 s ones remain */
    UNIT_CHECK_INT(takes(b, 30, 20000), 0);  /* and now the requests are gone */

    UNIT_CASE("min=10/s: the window refills as old retries age out");
    b = ratio(&t, 0, 10);
    UNIT_CHECK_INT(takes(b, 100, 0), 100);
    UNIT_CHECK_INT(takes(b, 1, 9999), 0);
    UNIT_CHECK_INT(takes(b, 200, 10000), 100);
    UNIT_CHECK_INT(LOAD(&t.st.refused), 101);

    UNIT_CASE("gaps longer than the window: a reused slot starts from zero");
    b = ratio(&t, 0.5, 0);
    requests(b, 100, 3000);                 /* second 3, slot 3 */
    UNIT_CHECK_INT(takes(b, 10, 3000), 10);
    requests(b, 10, 33500);                 /* second 33, slot 3 again */
    UNIT_CHECK_INT(LOAD(&t.st.requests[3]), 10);
    UNIT_CHECK_INT(takes(b, 10, 33500), 5); /* 10 requests, not 110; 0 old retries */
    requests(b, 10, 1000000500);            /* a gap of ~11 days */
    UNIT_CHECK_INT(takes(b, 10, 1000000500), 5);
    UNIT_CHECK_INT(takes(b, 10, 1000009999), 0);
    UNIT_CHECK_INT(takes(b, 10, 1000010000), 0);

    UNIT_CASE("a late count for an older second never wipes a newer bucket");
    b = ratio(&t, 0.5, 0);
    requests(b, 10, 15000);
    requests(b, 10, 5000); /* slot 5 holds second 15: counted there */
    UNIT_CHECK_INT(LOAD(&t.st.requests[5]), 20);
    UNIT_CHECK_INT(LOAD(&t.st.bucket_sec[5]), 15);

    UNIT_CASE("times before the epoch floor to the right second");
    b = ratio(&t, 0.5, 0);
    requests(b, 10, -1);
    UNIT_CHECK_INT(LOAD(&t.st.bucket_sec[9]), -1);
    UNIT_CHECK_INT(takes(b, 10, 8999), 5);
    UNIT_CHECK_INT(takes(b, 10, 9000), 0);
}

/* Two processes share one bucket in a shared zone, as two workers do:
 * pays and refunds from both never lose or invent a token. */
static void
test_shared(void)
{
    ric_shm_t *z = ric_shm_create(1 << 16);
    ric_budget_conf_t conf;
    ric_budget_t b;
    int created, i, status = -1, granted = 0;
    pid_t pid;

    UNIT_CASE("a bucket in the shared zone, paid from and refunded by two processes");
    UNIT_CHECK(z != NULL);
    if (z == NULL) {
        return;
    }
    ric_budget_conf_default(&conf);
    b.conf = &conf;
    b.st = ric_shm_entry(z, "budget:test", sizeof(ric_budget_state_t), &created);
    UNIT_CHECK_INT(created, 1);
    ric_budget_reset(b.st, &conf);
    UNIT_CHECK(ric_shm_entry(z, "budget:test", sizeof(ric_budget_state_t), &created) == b.st);
    UNIT_CHECK_INT(created, 0);
    UNIT_CHECK(ric_shm_entry(z, "budget:test", 8, &created) == NULL); /* another size */
    UNIT_CHECK(((uintptr_t) b.st & 63) == 0);

    pid = fork();
    for (i = 0; i < 200000; i++) {
        if (ric_budget_take(&b, RIC_BUDGET_COST, 1000, 1, NULL) == RIC_BUDGET_GRANTED) {
            granted++;
            /* gives back exactly what the take took: a success earns half
             * a token on top of what was paid */
            ric_budget_outcome(&b, 0, RIC_BUDGET_COST - RIC_BUDGET_EARN, 1000);
        }
    }
    if (pid == 0) {
        _exit(granted == 200000 ? 0 : 1);
    }
    UNIT_CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
    UNIT_CHECK_INT(status, 0);
    UNIT_CHECK_INT(granted, 200000);
    UNIT_CHECK_INT(ric_budget_tokens(&b), 10000);
    UNIT_CHECK_INT(LOAD(&b.st->granted), 400000);

    UNIT_CASE("a full zone says so");
    UNIT_CHECK(ric_shm_entry(z, "big", 1 << 20, &created) == NULL);
    ric_shm_destroy(z);
}

/* Adaptive backoff's regime, as the upstream's retries succeed and fail. */
static void
test_backoff_regime(void)
{
    budget_t t;
    ric_budget_t *b = adaptive(&t, 100, 5000);
    int i, n;

    UNIT_CASE("a fresh upstream's retries go at once");
    UNIT_CHECK_INT(ric_budget_backoff_share(b), 0);

    UNIT_CASE("30% independent failures keep the fast regime (a fixed pattern, 10000 retries)");
    for (i = 0, n = 0; i < 10000; i++) {
        ric_budget_retried(b, i % 10 == 2 || i % 10 == 5 || i % 10 == 8);
        n += ric_budget_backoff_share(b) > 0;
    }
    UNIT_CHECK_INT(n, 0);

    UNIT_CASE("failing retries take it to the whole schedule, in proportion on the way");
    for (i = 0, n = 0; i < 40 && ric_budget_backoff_share(b) < 1000; i++) {
        ric_budget_retried(b, 1);
        n += ric_budget_backoff_share(b) > 0 && ric_budget_backoff_share(b) < 1000;
    }
    UNIT_CHECK(i >= 14 && i <= 40);
    UNIT_CHECK(n > 5); /* a scaled stretch between the two */
    UNIT_CHECK_INT(ric_budget_backoff_share(b), 1000);

    UNIT_CASE("retries that work again bring the fast regime back");
    for (i = 0; i < 40 && ric_budget_backoff_share(b) > 0; i++) {
        ric_budget_retried(b, 0);
    }
    UNIT_CHECK(i < 40);
    UNIT_CHECK_INT(ric_budget_backoff_share(b), 0);

    UNIT_CASE("a bucket that spent half of its first tokens waits the whole schedule");
    STORE(&t.st.tokens, RIC_BUDGET_START / 2 - 1);
    UNIT_CHECK_INT(ric_budget_backoff_share(b), 1000);
    STORE(&t.st.tokens, RIC_BUDGET_START / 2);
    UNIT_CHECK_INT(ric_budget_backoff_share(b), 0);

    UNIT_CASE("a small bucket (max=4) is draining only below half of its own first tokens");
    b = adaptive(&t, 4, 5000);
    UNIT_CHECK_INT(ric_budget_backoff_share(b), 0);
    STORE(&t.st.tokens, 1999);
    UNIT_CHECK_INT(ric_budget_backoff_share(b), 1000);

    UNIT_CASE("the ratio form has no tokens: the retries' record alone");
    b = ratio(&t, 0.2, 10);
    UNIT_CHECK_INT(ric_budget_backoff_share(b), 0);
}

int
main(void)
{
    test_backoff_regime();
    test_adaptive();
    test_off();
    test_hedge();
    test_ratio();
    test_minimum();
    test_window();
    test_shared();
    return UNIT_DONE("budget");
}
