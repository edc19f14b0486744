/* attempt.h: the attempts phase: one try at a time, each ending in the one attempt-done entry. */
#ifndef RIC_ATTEMPT_H
#define RIC_ATTEMPT_H

#include "ric_core.h"
#include "metrics.h"
#include "http1_client.h"
#include "retry.h"

#include <event2/event_struct.h>

/* One try: made per attempt, torn down whole before the next begins
 * (unless its whole response is kept as the answer of last resort). A
 * hedged request has two out at once: the first and its hedge. */
struct ric_attempt_s {
    ric_request_t *r;
    int number;          /* from 1 */
    struct event try_timer; /* per_try_timeout, bounded by the deadline */
    int64_t start_us;
    int64_t wait_us;     /* the wait before it */
    ric_wait_regime_t regime; /* ...and what chose it */
    int64_t paid;        /* what it cost the budget (a retry), thousandths of a token */
    int peeked;          /* classify_body_max: 1 the body is in client.buf, -1 too large, 0 not read */
    int classified;      /* the route script's word on its outcome (RIC_CLASSIFY_*) */
    int failed;          /* its outcome counted as a failure (health, the budget) */
    int hedge;           /* 1: sent as the hedge of the first attempt (retry_hedge) */
    int timer_is_deadline; /* try_timer ends at the request's deadline, not per_try_timeout */
    int recycled;        /* freed, and kept for a next attempt (attempt.c) */
    ric_http1_t client;  /* the exchange with the upstream server (last: ric_http1_init
                          * clears it, attempt_new the rest) */
};

/* The attempts phase's state, kept in the request across tries (made
 * when the phase first runs). */
typedef struct ric_attempts_s {
    int count;                /* attempts started */
    ric_attempt_t *current;   /* NULL while waiting */
    ric_attempt_t *racing;    /* the other attempt of a hedged pair, while both are out */
    ric_attempt_t *kept;      /* the last whole response dropped for a retry */
    ric_attempt_t *draining;  /* a dropped response still arriving, beside the next attempt */
    ric_peer_t *prev_peer;    /* a retry prefers another server */
    ric_buf_t head;           /* the request head, rebuilt per attempt */
    ric_buf_t hedge_head;     /* the hedge's request head (the first's is still being sent) */
    struct event hedge_timer; /* retry_hedge: when the first attempt gets a second */
    int64_t hedge_after_ms;
    struct event wait_timer;  /* the backoff before the next attempt */
    ric_async_t wait_async;   /* the wait, as the request's pending operation */
    int waiting;
    int holding;              /* 1: the attempts ended with draining still arriving: held for
                               * it; 2: held, and over */
    int hold_status;          /* ...and how they ended (attempts_end's status and why) */
    ric_retry_reason_t hold_why;
    int64_t wait_until_ms;
    int64_t wait_us;
    ric_wait_regime_t regime; /* what chose the wait */
    int64_t retry_cost;       /* what the retry being waited for costs the budget */
    int64_t paid;             /* what it paid (0: nothing, or a probe) */
    int paid_for;             /* the budget let it go */
    ric_retry_reason_t stop;  /* RIC_RETRY_YES, or why the next attempt is not made */
    int fail_status;          /* the gateway's answer if the budget refuses it */
    ric_mclass_t last_mc;     /* what the last attempt ended met (metrics.h) */
    int last_classified;      /* ...the route script's word on it */
    int last_transient;       /* ...and whether retry_on would have retried it */
} ric_attempts_t;

/* The phase (pipeline.c's table): sets up the retry policy and the
 * deadline, then runs attempts until an answer is chosen. */
int ric_attempts_phase(ric_request_t *r);

/* More of a streamed upload was staged for the current attempt. */
void ric_attempts_upload_kick(ric_request_t *r);

/* The upload broke (the client's body): no attempt follows. */
void ric_attempts_stop(ric_request_t *r);

/* The worker stops gracefully: no attempt starts after deadline_ms, and a
 * wait past it ends now with the answer at hand. */
void ric_attempts_shutdown(ric_request_t *r, int64_t deadline_ms);

#endif /* RIC_ATTEMPT_H */
