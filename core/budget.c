/* budget.c: the retry budget: adaptive tokens, or a ratio over ten one-second buckets; atomics only. */
#include "budget.h"

#include <math.h>
#include <stdio.h>

/* Every operation is a handful of atomic loads, adds and compare-and-swaps
 * on the shared state: workers never wait for each other, and a worker
 * killed halfway leaves at worst one count off. Relaxed ordering is
 * enough: each field is a counter on its own; nothing is published
 * through another. */
#define LOAD(p) atomic_load_explicit((p), memory_order_relaxed)
#define STORE(p, v) atomic_store_explicit((p), (v), memory_order_relaxed)
#define ADD(p, v) atomic_fetch_add_explicit((p), (v), memory_order_relaxed)
#define CAS(p, old, v) \
    atomic_compare_exchange_weak_explicit((p), (old), (v), memory_order_relaxed, \
                                          memory_order_relaxed)

/* Below any real second or millisecond. */
#define NEVER INT64_MIN

/* The healthy mark is written at most this often: a busy, healthy upstream
 * would otherwise store into a shared cache line on every request. */
#define HEALTHY_EVERY_MS 10

void
ric_budget_conf_default(ric_budget_conf_t *c)
{
    memset(c, 0, sizeof(*c));
    c->kind = RIC_BUDGET_ADAPTIVE;
    c->max_tokens = RIC_BUDGET_MAX_DEFAULT;
    c->wait_ms = RIC_BUDGET_WAIT_DEFAULT;
}

int
ric_budget_same_rule(const ric_budget_conf_t *a, const ric_budget_conf_t *b)
{
    if (a->kind != b->kind) {
        return 0;
    }
    switch (a->kind) {
    case RIC_BUDGET_ADAPTIVE:
        return a->max_tokens == b->max_tokens && a->wait_ms == b->wait_ms;
    case RIC_BUDGET_RATIO:
        return a->ratio == b->ratio && a->min_per_sec == b->min_per_sec;
    default:
        return 1;
    }
}

const char *
ric_budget_rule_text(const ric_budget_conf_t *c, char *buf, size_t size)
{
    switch (c->kind) {
    case RIC_BUDGET_ADAPTIVE:
        if (c->wait_ms % 1000 == 0) {
            snprintf(buf, size, "adaptive max=%lld wait=%llds", (long long) c->max_tokens,
                     (long long) (c->wait_ms / 1000));
        } else {
            snprintf(buf, size, "adaptive max=%lld wait=%lldms", (long long) c->max_tokens,
                     (long long) c->wait_ms);
        }
        break;
    case RIC_BUDGET_RATIO:
        snprintf(buf, size, "%g%% min=%lld/s", c->ratio * 100.0, (long long) c->min_per_sec);
        break;
    default:
        snprintf(buf, size, "off");
    }
    return buf;
}

void
ric_budget_reset(ric_budget_state_t *st, const ric_budget_conf_t *c)
{
    int i;

    STORE(&st->tokens, ric_min((int64_t) RIC_BUDGET_START, c->max_tokens * RIC_BUDGET_MILLI));
    STORE(&st->healthy_ms, NEVER);
    STORE(&st->probe_ms, NEVER);
    for (i = 0; i < RIC_BUDGET_BUCKETS; i++) {
        STORE(&st->bucket_sec[i], NEVER);
        STORE(&st->requests[i], 0);
        STORE(&st->retries[i], 0);
    }
    STORE(&st->granted, 0);
    STORE(&st->refused, 0);
    STORE(&st->waits, 0);
    STORE(&st->retry_score, RIC_BACKOFF_SCORE_START);
}

/* --- adaptive ---------------------------------------------------------------- */

static int
recently_healthy(const ric_budget_t *b, int64_t now)
{
    int64_t h = LOAD(&b->st->healthy_ms);

    return h != NEVER && now - h < b->conf->wait_ms;
}

static ric_budget_verdict_t
adaptive_take(ric_budget_t *b, int64_t cost, int64_t now, int may_probe, int64_t *paid)
{
    ric_budget_state_t *st = b->st;
    int64_t t = LOAD(&st->tokens), p;

    cost = ric_min(cost, b->conf->max_tokens * RIC_BUDGET_MILLI); /* max=1 pays a timeout too */
    while (t >= cost) {
        if (paid == NULL || CAS(&st->tokens, &t, t - cost)) {
            if (paid != NULL) {
                *paid = cost;
            }
            return RIC_BUDGET_GRANTED;
        }
    }
    if (!recently_healthy(b, now)) {
        return RIC_BUDGET_REFUSED;
    }
    if (paid != NULL && may_probe) {
        /* the first to ask after RIC_BUDGET_PROBE_MS goes, unpaid */
        p = LOAD(&st->probe_ms);
        if ((p == NEVER || now - p >= RIC_BUDGET_PROBE_MS) && CAS(&st->probe_ms, &p, now)) {
            *paid = 0;
            return RIC_BUDGET_GRANTED;
        }
    }
    return RIC_BUDGET_WAIT;
}

static void
adaptive_add(ric_budget_t *b, int64_t amount, int64_t now)
{
    ric_budget_state_t *st = b->st;
    int64_t max = b->conf->max_tokens * RIC_BUDGET_MILLI, t = LOAD(&st->tokens), n;

    do {
        if (t >= max) {
            n = t; /* full: nothing to write */
            break;
        }
        n = ric_min(t + amount, max);
    } while (!CAS(&st->tokens, &t, n));
    if (now != NEVER && n * 2 >= max) { /* a refund (NEVER) is no sign of health */
        t = LOAD(&st->healthy_ms);
        if (t == NEVER || now - t >= HEALTHY_EVERY_MS) {
            STORE(&st->healthy_ms, now);
        }
    }
}

/* --- ratio ------------------------------------------------------------------- */

/*
 * Bucket i holds second s when s mod 10 == i and bucket_sec[i] == s. A
 * bucket whose second is outside [now - 9, now] counts as zero and is reset
 * when its slot is reused, so a gap of any length needs no catch-up work.
 * Two workers reusing a slot at once both try to swap in the new second;
 * the one that wins zeroes it (a count landing in between is lost: the
 * window is an estimate).
 */
static int64_t
second_of(int64_t now_ms)
{
    return now_ms / 1000 - (now_ms % 1000 < 0);
}

static int
bucket_for(ric_budget_state_t *st, int64_t sec)
{
    int i = (int) (sec % RIC_BUDGET_BUCKETS);
    int64_t held;

    if (i < 0) {
        i += RIC_BUDGET_BUCKETS;
    }
    held = LOAD(&st->bucket_sec[i]);
    while (held < sec) {
        if (CAS(&st->bucket_sec[i], &held, sec)) {
            STORE(&st->requests[i], 0);
            STORE(&st->retries[i], 0);
            break;
        }
    }
    return i;
}

static void
window(ric_budget_state_t *st, int64_t sec, int64_t *requests, int64_t *retries)
{
    int64_t s;
    int i;

    *requests = *retries = 0;
    for (i = 0; i < RIC_BUDGET_BUCKETS; i++) {
        s = LOAD(&st->bucket_sec[i]);
        if (s != NEVER && s > sec - RIC_BUDGET_BUCKETS && s <= sec) {
            *requests += LOAD(&st->requests[i]);
            *retries += LOAD(&st->retries[i]);
        }
    }
}

static ric_budget_verdict_t
ratio_take(ric_budget_t *b, int64_t now, int64_t *paid)
{
    const ric_budget_conf_t *c = b->conf;
    int64_t sec = second_of(now), requests, retries, allowed, floor_min;
    double by_ratio;

    window(b->st, sec, &requests, &retries);
    /* floor(ratio * requests): a fraction of a retry is not a retry (20% of
     * 9 requests allows 1). The 1e-9 absorbs binary rounding, so 0.29 * 100
     * (28.999999999999996 in double) still allows 29. */
    by_ratio = requests > 0 ? floor(c->ratio * (double) requests + 1e-9) : 0;
    allowed = by_ratio < 9.2e18 ? (int64_t) by_ratio : INT64_MAX;
    floor_min = c->min_per_sec > INT64_MAX / RIC_BUDGET_BUCKETS
                    ? INT64_MAX
                    : c->min_per_sec * RIC_BUDGET_BUCKETS;
    allowed = ric_max(allowed, floor_min);
    /* retries + 1 <= allowed, without overflowing at INT64_MAX */
    if (retries >= allowed) {
        return RIC_BUDGET_REFUSED;
    }
    if (paid != NULL) {
        ADD(&b->st->retries[bucket_for(b->st, sec)], 1);
        *paid = 0;
    }
    return RIC_BUDGET_GRANTED;
}

/* --- the interface ----------------------------------------------------------- */

void
ric_budget_request(ric_budget_t *b, int64_t now_ms)
{
    if (b->conf->kind == RIC_BUDGET_RATIO) {
        ADD(&b->st->requests[bucket_for(b->st, second_of(now_ms))], 1);
    }
}

/* paid NULL: only asks. count: a refusal and a wait are counted. */
static ric_budget_verdict_t
decide(ric_budget_t *b, int64_t cost, int64_t now_ms, int may_probe, int64_t *paid, int count)
{
    ric_budget_verdict_t v;
    int pay = paid != NULL;

    switch (b->conf->kind) {
    case RIC_BUDGET_ADAPTIVE:
        v = adaptive_take(b, cost, now_ms, may_probe, paid);
        break;
    case RIC_BUDGET_RATIO:
        v = ratio_take(b, now_ms, paid);
        break;
    default:
        v = RIC_BUDGET_GRANTED;
        if (pay) {
            *paid = 0;
        }
    }
    if (v == RIC_BUDGET_REFUSED && count) {
        ADD(&b->st->refused, 1);
    } else if (v == RIC_BUDGET_WAIT && pay && count) {
        ADD(&b->st->waits, 1);
    } else if (v == RIC_BUDGET_GRANTED && pay && count) {
        ADD(&b->st->granted, 1);
    }
    return v;
}

ric_budget_verdict_t
ric_budget_check(ric_budget_t *b, int64_t cost, int64_t now_ms)
{
    return decide(b, cost, now_ms, 0, NULL, 1);
}

ric_budget_verdict_t
ric_budget_take(ric_budget_t *b, int64_t cost, int64_t now_ms, int may_probe, int64_t *paid)
{
    int64_t ignored;

    return decide(b, cost, now_ms, may_probe, paid != NULL ? paid : &ignored, 1);
}

int
ric_budget_take_hedge(ric_budget_t *b, int64_t now_ms, int64_t *paid)
{
    return decide(b, RIC_BUDGET_COST, now_ms, 0, paid, 0) == RIC_BUDGET_GRANTED;
}

void
ric_budget_outcome(ric_budget_t *b, int failed, int64_t paid, int64_t now_ms)
{
    if (b->conf->kind == RIC_BUDGET_ADAPTIVE && !failed) {
        adaptive_add(b, RIC_BUDGET_EARN + paid, now_ms);
    }
}

void
ric_budget_refund(ric_budget_t *b, int64_t paid)
{
    if (b->conf->kind == RIC_BUDGET_ADAPTIVE && paid > 0) {
        adaptive_add(b, paid, NEVER);
    }
}

void
ric_budget_retried(ric_budget_t *b, int failed)
{
    int64_t old = LOAD(&b->st->retry_score), next;

    do {
        next = failed ? old - old / RIC_BACKOFF_SCORE_STEP
                      : old + (1000 - old + RIC_BACKOFF_SCORE_STEP - 1) / RIC_BACKOFF_SCORE_STEP;
    } while (!atomic_compare_exchange_weak(&b->st->retry_score, &old, ric_min(next, (int64_t) 1000)));
}

int64_t
ric_budget_backoff_share(const ric_budget_t *b)
{
    int64_t score = LOAD(&b->st->retry_score);
    int64_t first = ric_min((int64_t) RIC_BUDGET_START, b->conf->max_tokens * RIC_BUDGET_MILLI);

    if (b->conf->kind == RIC_BUDGET_ADAPTIVE && LOAD(&b->st->tokens) < first / 2) {
        return 1000; /* the bucket is draining: the whole schedule */
    }
    if (score >= RIC_BACKOFF_SCORE_FAST) {
        return 0;
    }
    if (score <= RIC_BACKOFF_SCORE_SLOW) {
        return 1000;
    }
    return (RIC_BACKOFF_SCORE_FAST - score) * 1000 / (RIC_BACKOFF_SCORE_FAST - RIC_BACKOFF_SCORE_SLOW);
}

int64_t
ric_budget_tokens(const ric_budget_t *b)
{
    return LOAD(&b->st->tokens);
}
