/* retry.h: the retry decision — the one place that says whether an attempt is retried, and after what wait. */
#ifndef RIC_RETRY_H
#define RIC_RETRY_H

#include "ric_core.h"
#include "backoff.h"
#include "budget.h"

/* Attempt outcome classes, as bits for retry_on. */
#define RIC_CLASS_CONNECT_ERROR 0x01 /* not sent: refused, connect timeout, handshake */
#define RIC_CLASS_RESET 0x02         /* lost after sending, before a whole response head */
#define RIC_CLASS_TIMEOUT 0x04       /* per-try timer */
#define RIC_CLASS_BAD_RESPONSE 0x08  /* unparseable response head or framing */
#define RIC_CLASS_STATUS 0x10        /* a response arrived: its status decides */

/* retry_on: classes, and statuses (100..599) as a bitmap. */
typedef struct ric_retry_on_s {
    unsigned classes;
    uint64_t statuses[10]; /* bit s%64 of word s/64, for s < 640 */
} ric_retry_on_t;

/* A location's retry policy, from its settings. */
typedef struct {
    int enabled;               /* retries on, and no RICOCHET_NO_RETRY=1 */
    int64_t attempts;          /* in total; 0: bounded only by the deadline */
    ric_backoff_t backoff;
    int adaptive;              /* retry_backoff ... adaptive=on: the wait follows the upstream's regime */
    int64_t retry_after_max_ms;
    const ric_retry_on_t *retry_on;
} ric_retry_policy_t;

/* What happened, and what the request allows. */
/* A classifier's word on an outcome, above retry_on (a route script's
 * classify): RIC_CLASSIFY_DEFAULT leaves it to retry_on. */
#define RIC_CLASSIFY_DEFAULT 0
#define RIC_CLASSIFY_RETRY 1  /* transient, whatever retry_on says */
#define RIC_CLASSIFY_FINAL 2  /* final: "accept" and "fail" */

typedef struct {
    unsigned class;        /* RIC_CLASS_* of the attempt that just ended */
    int classified;        /* RIC_CLASSIFY_* */
    int status;            /* with RIC_CLASS_STATUS */
    int attempt;           /* that attempt's number, from 1 */
    int replay_safe;       /* idempotent method, a key under an idempotency
                            * contract, or marked safe by the route */
    int key_no_contract;   /* not replay-safe, though its script set a key: the
                            * route lacks idempotency_key on|auto */
    int body_replayable;   /* the whole body is held for replay */
    int response_started;  /* a byte of this request's answer reached the client */
    int has_retry_after;   /* a valid Retry-After came with the response */
    int64_t retry_after_ms;
    int has_script_delay;  /* the route script's "retry", seconds: the wait */
    int64_t script_delay_ms;
    int64_t now_ms;
    int64_t deadline_ms;   /* the request's deadline on the same clock */
    int64_t backoff_share; /* adaptive: the share of the schedule's wait to take, in thousandths
                            * (ric_budget_backoff_share); 1000 without adaptive */
} ric_retry_input_t;

/* Why an attempt is, or is not, followed by another: the verdict's reason,
 * with a name for logs and the access log ("not_retried"). */
typedef enum {
    RIC_RETRY_YES = 0,          /* "retry" */
    RIC_RETRY_OFF,              /* "retries_off": retries off or RICOCHET_NO_RETRY=1 */
    RIC_RETRY_RESPONSE_STARTED, /* "response_started": a byte went to the client */
    RIC_RETRY_FINAL_STATUS,     /* "final_status": a status not in retry_on */
    RIC_RETRY_CLASS_NOT_LISTED, /* "class_not_retried": a class not in retry_on */
    RIC_RETRY_UNSAFE,           /* "unsafe_method": not replay-safe and it was sent */
    RIC_RETRY_BODY_NOT_KEPT,    /* "body_not_replayable": the body streamed through */
    RIC_RETRY_ATTEMPTS,         /* "attempts_exhausted" */
    RIC_RETRY_DEADLINE,         /* "deadline": the wait would end past the deadline */
    RIC_RETRY_BUDGET,           /* "budget": the retry budget refused it */
    RIC_RETRY_SHUTDOWN,         /* "shutting_down": the worker is stopping */
    RIC_RETRY_KEY_NO_CONTRACT   /* "key_without_contract": unsafe, its script set a key, and the
                                 * route has no idempotency_key on|auto */
} ric_retry_reason_t;

/* What chose a retry's wait (the access log's "regime"). */
typedef enum {
    RIC_WAIT_SCHEDULE = 0, /* "backoff": the configured schedule, whole */
    RIC_WAIT_FAST,         /* "fast": adaptive, retries work: a few ms at most */
    RIC_WAIT_SCALED,       /* "scaled": adaptive, between the two */
    RIC_WAIT_RETRY_AFTER,  /* "retry_after": the upstream's Retry-After */
    RIC_WAIT_SCRIPT,       /* "script": the route script's classify */
    RIC_WAIT_BUDGET        /* "budget": then the retry budget held it (attempt.c) */
} ric_wait_regime_t;

/* A retry in the fast regime waits a jittered [0, RIC_BACKOFF_FAST_MS]:
 * at once (as a proxy without backoff retries; failures that look
 * independent gain nothing from waiting). */
#define RIC_BACKOFF_FAST_MS 0

typedef struct {
    int retry;                 /* 1: make another attempt after wait_ms */
    int64_t wait_ms;
    ric_retry_reason_t reason; /* RIC_RETRY_YES, or why not */
    ric_wait_regime_t regime;  /* what chose wait_ms */
} ric_retry_decision_t;

/* The regime's name for logs: "backoff", "fast", ... */
const char *ric_retry_regime_name(ric_wait_regime_t regime);

/* Adaptive backoff: the wait for a drawn schedule wait w, taking share
 * thousandths of it (1000: w; 0: the fast regime's, from the same draw). */
int64_t ric_retry_adaptive_wait(int64_t w, int64_t share);

/* The reason's name for logs: "unsafe_method", ... */
const char *ric_retry_reason_name(ric_retry_reason_t reason);

/* Whether RICOCHET_NO_RETRY=1 turned every retry off (read once at start). */
extern int ric_retry_killed;

/* Decides whether the attempt described by in is retried, in this order:
 * a transient class/status (retry_on, or the script's word: ric_retry_final);
 * retries enabled; not after a byte of the answer went to the client; replay-safe
 * unless the attempt never reached the upstream (connect_error); a
 * replayable body; attempts left; the wait (the script's delay, else a
 * valid Retry-After up to retry_after_max, else jittered backoff) ending
 * before the deadline; and last the budget, which refuses
 * only a retry it can neither pay for nor let wait (the retry is paid for
 * with ric_budget_take when it is about to be sent). rnd/ctx draw the
 * jitter. Pure: the budget is only read. */
ric_retry_decision_t ric_retry_decide(const ric_retry_policy_t *policy,
                                      const ric_retry_input_t *in, ric_budget_t *budget,
                                      ric_rand_pt rnd, void *ctx);

/* What a retry after an attempt of this class costs the budget
 * (thousandths of a token): a timeout costs double. */
int64_t ric_retry_cost(unsigned class);

/* The one rule for "final": whether an outcome (class, and status with
 * RIC_CLASS_STATUS) is final rather than worth another try by someone.
 * The route script's word (classified) wins; else an outcome is
 * transient when transient lists it. The retry decision asks it with
 * retry_on; the idempotency store with its release set (every 5xx, 408,
 * 409, 425, 429 and idempotency_store_status), whatever the retry policy. */
int ric_retry_final(const ric_retry_on_t *transient, unsigned class, int status, int classified);

/* Whether status or class is in retry_on. */
int ric_retry_on_match(const ric_retry_on_t *on, unsigned class, int status);

/* Parses retry_on arguments ("connect_error", "reset", "timeout",
 * "bad_response", "5xx", "4xx" and status codes) into on. Returns NULL or
 * the bad word. */
const char *ric_retry_on_parse(ric_retry_on_t *on, char **words, int n);

/* Whether a method may be repeated by itself (RFC 9110 §9.2.2). */
int ric_retry_method_idempotent(int method);

/* A route's idempotency_key: the key contract with its upstream. */
#define RIC_IDEMPOTENCY_OFF 0  /* none: a key makes nothing safe */
#define RIC_IDEMPOTENCY_ON 1   /* the upstream honours the client's or the script's key */
#define RIC_IDEMPOTENCY_AUTO 2 /* ...and the gateway makes one when there is none */

/* Replay safety: what may make a request safe to send again. */
typedef struct {
    int method;            /* RIC_HTTP_* */
    int script_idempotent; /* the route script's req.idempotent: 1 true, -1 false, 0 not set */
    int script_key;        /* its script set a key (req:set_idempotency_key) */
    int client_key;        /* one key field, not empty, that the script did not remove */
    int key_mode;          /* the route's RIC_IDEMPOTENCY_* */
} ric_replay_input_t;

typedef struct {
    int safe;            /* it may be sent again */
    int mint_key;        /* safe by a key the gateway makes (idempotency_key auto) */
    int key_no_contract; /* not safe, though its script set a key: the route lacks the contract */
} ric_replay_t;

/* The rules, in order: the method's nature, unless the route script said
 * otherwise; a script's false is final; with the route's key contract (on
 * or auto), the script's key, or else the client's one key (when the
 * script said nothing), or else with auto a key the gateway makes. */
ric_replay_t ric_retry_replay(const ric_replay_input_t *in);

/* Safe to repeat with no key at all: its method, or its route script's
 * word. The idempotency store dedupes only requests that are not. */
int ric_retry_repeatable(int method, int script_idempotent);

/* Parses a client's deadline header: milliseconds ("1500") or a duration
 * with a unit ("1.5s", "250ms", "2m"). RIC_OK with *ms, or RIC_ERROR. */
int ric_retry_parse_deadline(const u_char *v, size_t len, int64_t *ms);

/* The class name for logs ("connect_error", ...). */
const char *ric_retry_class_name(unsigned class);

#endif /* RIC_RETRY_H */
