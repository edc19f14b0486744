/* budget.h: the retry budget of an upstream (adaptive tokens, or a ratio over 10 s), shared by all workers. */
#ifndef RIC_BUDGET_H
#define RIC_BUDGET_H

#include "ric_core.h"

#include <stdatomic.h>

#define RIC_BUDGET_BUCKETS 10 /* ratio form: one-second buckets, a 10 s window */

/*
 * The adaptive rule (the default), in tokens; one token pays for one retry.
 *   - the bucket starts with RIC_BUDGET_START tokens and holds at most max;
 *   - an attempt answered well earns RIC_BUDGET_EARN;
 *   - a retry pays RIC_BUDGET_COST when it is sent (RIC_BUDGET_COST_TIMEOUT
 *     after a timeout) and gets it back when it is answered well, so
 *     retries that work pay for themselves and only failing ones drain it;
 *   - a retry the bucket cannot pay waits and asks again (waiting costs the
 *     upstream nothing) while the bucket was at least half full within the
 *     last `wait`: an upstream that worked a moment ago is browned out, and
 *     its requests ride it out; otherwise (it never earned its tokens, or
 *     has failed for longer than `wait`) the retry is refused at once;
 *   - while retries wait, one of them goes unpaid every RIC_BUDGET_PROBE_MS
 *     (across all workers; never a request's last attempt): a probe, whose success is the first earning
 *     when the upstream is back, so the waiting retries do not depend on
 *     new requests arriving to refill the bucket.
 * Amounts are kept in thousandths of a token.
 */
#define RIC_BUDGET_MILLI 1000
#define RIC_BUDGET_START (10 * RIC_BUDGET_MILLI)
#define RIC_BUDGET_EARN (RIC_BUDGET_MILLI / 2)
#define RIC_BUDGET_COST RIC_BUDGET_MILLI
#define RIC_BUDGET_COST_TIMEOUT (2 * RIC_BUDGET_MILLI)
#define RIC_BUDGET_MAX_DEFAULT 100
#define RIC_BUDGET_WAIT_DEFAULT 5000 /* ms */
#define RIC_BUDGET_PROBE_MS 100

typedef enum {
    RIC_BUDGET_ADAPTIVE = 0,
    RIC_BUDGET_RATIO, /* retries <= max(ratio * requests, min/s * 10) over 10 s (Linkerd's) */
    RIC_BUDGET_OFF    /* every retry allowed */
} ric_budget_kind_t;

/* A budget rule, as retry_budget wrote it. */
typedef struct ric_budget_conf_s {
    ric_budget_kind_t kind;
    int64_t max_tokens;  /* adaptive: the bucket's size, in tokens */
    int64_t wait_ms;     /* adaptive: how long after it was last half full a retry may wait */
    double ratio;        /* ratio: retries allowed per request */
    int64_t min_per_sec; /* ratio: retries allowed per second regardless */
    const char *file;    /* where it was set; NULL: the built-in default */
    int line;
    unsigned ctx;        /* RIC_CONF_* of the block that set it */
} ric_budget_conf_t;

/* The state of one budget, in the shared zone (every worker's view of it):
 * atomics only, never a lock. */
typedef struct {
    _Atomic int64_t tokens;     /* adaptive, in thousandths */
    _Atomic int64_t healthy_ms; /* adaptive: last time it held >= max/2; INT64_MIN: never */
    _Atomic int64_t probe_ms;   /* adaptive: when the last unpaid probe went; INT64_MIN: never */
    _Atomic int64_t bucket_sec[RIC_BUDGET_BUCKETS]; /* ratio: the second each bucket holds */
    _Atomic int64_t requests[RIC_BUDGET_BUCKETS];
    _Atomic int64_t retries[RIC_BUDGET_BUCKETS];
    _Atomic int64_t granted; /* retries paid for, ever (for metrics) */
    _Atomic int64_t refused; /* retries refused, ever */
    _Atomic int64_t waits;   /* times a retry waited for the budget, ever */
    _Atomic int64_t retry_score; /* adaptive backoff: how well recent retries did, in
                                  * thousandths (a moving average, RIC_BACKOFF_SCORE_*) */
} ric_budget_state_t;

/* A budget: its rule and its (shared) state. */
typedef struct {
    const ric_budget_conf_t *conf;
    ric_budget_state_t *st;
} ric_budget_t;

typedef enum {
    RIC_BUDGET_GRANTED = 0, /* go ahead (take: paid for) */
    RIC_BUDGET_WAIT,        /* ask again after a while */
    RIC_BUDGET_REFUSED      /* no retry */
} ric_budget_verdict_t;

/* The default rule: adaptive max=100 wait=5s. */
void ric_budget_conf_default(ric_budget_conf_t *c);

/* Whether two rules are the same (where they were set aside). */
int ric_budget_same_rule(const ric_budget_conf_t *a, const ric_budget_conf_t *b);

/* The rule as retry_budget would write it: "adaptive max=100 wait=5s". */
const char *ric_budget_rule_text(const ric_budget_conf_t *c, char *buf, size_t size);

/* A fresh state for rule c. */
void ric_budget_reset(ric_budget_state_t *st, const ric_budget_conf_t *c);

/* Counts a new client request at now_ms (the ratio form's denominator). */
void ric_budget_request(ric_budget_t *b, int64_t now_ms);

/* Whether a retry costing cost (thousandths) could be paid now, without
 * paying: GRANTED, WAIT or REFUSED (counted as refused). */
ric_budget_verdict_t ric_budget_check(ric_budget_t *b, int64_t cost, int64_t now_ms);

/* Pays for a retry that is about to be sent: GRANTED (*paid: what it paid,
 * 0 for a probe), WAIT (counted as a wait) or REFUSED (counted as refused).
 * may_probe: the retry may go as an unpaid probe (its request has another
 * attempt left after it, so a failed probe does not end the request). */
ric_budget_verdict_t ric_budget_take(ric_budget_t *b, int64_t cost, int64_t now_ms,
                                     int may_probe, int64_t *paid);

/* Pays for a hedge (a second attempt sent while the first is still out,
 * retry_hedge) one retry's cost, at once or not at all: 1 when paid
 * (*paid: what it paid), 0 when the budget could not (never a wait or a
 * probe, and not counted among the retries refused or waiting). */
int ric_budget_take_hedge(ric_budget_t *b, int64_t now_ms, int64_t *paid);

/* The outcome of an attempt that paid `paid` (0 for a first attempt):
 * failed (its answer counts as a failure) or not. A success earns, and
 * gets back what it paid. */
void ric_budget_outcome(ric_budget_t *b, int failed, int64_t paid, int64_t now_ms);

/* Gives back what a retry paid when its outcome will never be known (its
 * request ended first). */
void ric_budget_refund(ric_budget_t *b, int64_t paid);

/*
 * Adaptive backoff: the budget also keeps how well the upstream's recent
 * retries did, a moving average of their outcomes (each retry moves it a
 * thirty-second of the way to 1000 when it was answered well, to 0 when
 * it failed), starting at RIC_BACKOFF_SCORE_START. While it is at least
 * RIC_BACKOFF_SCORE_FAST (failures look independent: retries mostly work,
 * as with random drops or one bad server), a retry goes at once; at
 * RIC_BACKOFF_SCORE_SLOW or below (they look correlated: retries fail too,
 * as in an overload or a brownout), and whenever the adaptive bucket holds
 * less than half of the tokens it starts with, it waits the whole
 * configured schedule; in between, in proportion. With 30% independent
 * failures the average sits near 700, about 3.5 standard deviations above
 * the fast bound (below it 0.02% of the time); from there 11 failed
 * retries in a row leave the fast regime and 34 reach the slow one. An
 * upstream failing 65% of the time sits near 365: half the schedule.
 */
#define RIC_BACKOFF_SCORE_START 750
#define RIC_BACKOFF_SCORE_FAST 500
#define RIC_BACKOFF_SCORE_SLOW 250
#define RIC_BACKOFF_SCORE_STEP 32 /* a retry moves the average 1/32 of the way */

/* A retry's outcome, for adaptive backoff. */
void ric_budget_retried(ric_budget_t *b, int failed);

/* The share of the configured backoff a retry waits now, in thousandths:
 * 0 (retries work: go at once) to 1000 (the whole schedule). */
int64_t ric_budget_backoff_share(const ric_budget_t *b);

/* Tokens in the bucket now, in thousandths (adaptive; for plan and tests). */
int64_t ric_budget_tokens(const ric_budget_t *b);

#endif /* RIC_BUDGET_H */
