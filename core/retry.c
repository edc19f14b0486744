/* retry.c: the retry decision and retry_on, kept apart from I/O so every invariant is unit-tested. */
#include "retry.h"
#include "http_parse.h"

#include <stdlib.h>

int ric_retry_killed;

int
ric_retry_method_idempotent(int method)
{
    switch (method) {
    case RIC_HTTP_GET:
    case RIC_HTTP_HEAD:
    case RIC_HTTP_OPTIONS:
    case RIC_HTTP_TRACE:
    case RIC_HTTP_PUT:
    case RIC_HTTP_DELETE:
        return 1;
    }
    return 0;
}

int
ric_retry_repeatable(int method, int script_idempotent)
{
    return script_idempotent != 0 ? script_idempotent > 0 : ric_retry_method_idempotent(method);
}

ric_replay_t
ric_retry_replay(const ric_replay_input_t *in)
{
    ric_replay_t out = { 0, 0, 0 };

    out.safe = ric_retry_repeatable(in->method, in->script_idempotent);
    if (in->script_idempotent < 0 || in->key_mode == RIC_IDEMPOTENCY_OFF) {
        /* the script said never, or the route has no key contract */
        out.key_no_contract = !out.safe && in->script_key && in->script_idempotent == 0;
    } else if (in->script_key) {
        out.safe = 1; /* a key under the route's contract, set by its script */
    } else if (in->script_idempotent == 0) {
        if (in->client_key) {
            out.safe = 1; /* the route's contract: its upstream honours keys */
        } else if (in->key_mode == RIC_IDEMPOTENCY_AUTO && !out.safe) {
            out.safe = out.mint_key = 1;
        }
    }
    return out;
}

const char *
ric_retry_class_name(unsigned class)
{
    switch (class) {
    case RIC_CLASS_CONNECT_ERROR: return "connect_error";
    case RIC_CLASS_RESET: return "reset";
    case RIC_CLASS_TIMEOUT: return "timeout";
    case RIC_CLASS_BAD_RESPONSE: return "bad_response";
    case RIC_CLASS_STATUS: return "status";
    }
    return "unknown";
}

int
ric_retry_on_match(const ric_retry_on_t *on, unsigned class, int status)
{
    if (class != RIC_CLASS_STATUS) {
        return (on->classes & class) != 0;
    }
    if (status < 0 || status >= 640) {
        return 0;
    }
    return (on->statuses[status / 64] >> (status % 64)) & 1;
}

int
ric_retry_final(const ric_retry_on_t *transient, unsigned class, int status, int classified)
{
    if (classified != RIC_CLASSIFY_DEFAULT) {
        return classified == RIC_CLASSIFY_FINAL; /* the route script's word wins */
    }
    return !ric_retry_on_match(transient, class, status);
}

static void
set_status(ric_retry_on_t *on, int s)
{
    on->statuses[s / 64] |= (uint64_t) 1 << (s % 64);
}

const char *
ric_retry_on_parse(ric_retry_on_t *on, char **words, int n)
{
    int i, s;
    char *end;

    memset(on, 0, sizeof(*on));
    for (i = 0; i < n; i++) {
        const char *w = words[i];
        if (strcmp(w, "connect_error") == 0) {
            on->classes |= RIC_CLASS_CONNECT_ERROR;
        } else if (strcmp(w, "reset") == 0) {
            on->classes |= RIC_CLASS_RESET;
        } else if (strcmp(w, "timeout") == 0) {
            on->classes |= RIC_CLASS_TIMEOUT;
        } else if (strcmp(w, "bad_response") == 0) {
            on->classes |= RIC_CLASS_BAD_RESPONSE;
        } else if (strcmp(w, "5xx") == 0 || strcmp(w, "4xx") == 0) {
            for (s = (w[0] - '0') * 100; s < (w[0] - '0') * 100 + 100; s++) {
                set_status(on, s);
            }
        } else {
            s = (int) strtol(w, &end, 10);
            if (*end != '\0' || end - w != 3 || s < 100 || s > 599) {
                return w;
            }
            set_status(on, s);
        }
    }
    return NULL;
}

int
ric_retry_parse_deadline(const u_char *v, size_t len, int64_t *ms)
{
    const u_char *p = v, *end = v + len;
    int64_t whole = 0, frac = 0, frac_div = 1, unit;

    while (p < end && (*p == ' ' || *p == '\t')) {
        p++;
    }
    while (end > p && (end[-1] == ' ' || end[-1] == '\t')) {
        end--;
    }
    if (p == end || *p < '0' || *p > '9') {
        return RIC_ERROR;
    }
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
        if (whole > (INT64_MAX / 1000 - 9) / 10) {
            return RIC_ERROR;
        }
        whole = whole * 10 + (*p - '0');
    }
    if (p < end && *p == '.') {
        p++;
        if (p == end || *p < '0' || *p > '9') {
            return RIC_ERROR;
        }
        for (; p < end && *p >= '0' && *p <= '9'; p++) {
            if (frac_div < 1000000) {
                frac = frac * 10 + (*p - '0');
                frac_div *= 10;
            }
        }
    }
    if (p == end) {
        unit = 1; /* bare number: milliseconds */
        if (frac_div != 1) {
            return RIC_ERROR;
        }
    } else if (end - p == 2 && p[0] == 'm' && p[1] == 's') {
        unit = 1;
    } else if (end - p == 1 && *p == 's') {
        unit = 1000;
    } else if (end - p == 1 && *p == 'm') {
        unit = 60000;
    } else {
        return RIC_ERROR;
    }
    if (whole > INT64_MAX / 1000 / unit) {
        return RIC_ERROR;
    }
    *ms = whole * unit + frac * unit / frac_div;
    return RIC_OK;
}

const char *
ric_retry_reason_name(ric_retry_reason_t reason)
{
    static const char *const names[] = {
        "retry", "retries_off", "response_started", "final_status", "class_not_retried",
        "unsafe_method", "body_not_replayable", "attempts_exhausted", "deadline",
        "budget", "shutting_down", "key_without_contract"
    };

    return (size_t) reason < ric_nelems(names) ? names[reason] : "unknown";
}

static ric_retry_decision_t
no(ric_retry_reason_t reason)
{
    ric_retry_decision_t d = { 0, 0, reason, RIC_WAIT_SCHEDULE };
    return d;
}

ric_retry_decision_t
ric_retry_decide(const ric_retry_policy_t *policy, const ric_retry_input_t *in,
                 ric_budget_t *budget, ric_rand_pt rnd, void *ctx)
{
    ric_retry_decision_t d = { 1, 0, RIC_RETRY_YES, RIC_WAIT_SCHEDULE };

    /* what the outcome is comes first: a final answer is final whatever
     * the policy (the idempotency store keeps it, retries on or off) */
    if (ric_retry_final(policy->retry_on, in->class, in->status, in->classified)) {
        return no(in->class == RIC_CLASS_STATUS ? RIC_RETRY_FINAL_STATUS : RIC_RETRY_CLASS_NOT_LISTED);
    }
    if (!policy->enabled || ric_retry_killed) {
        return no(RIC_RETRY_OFF);
    }
    /* once a byte went to the client the request is final */
    if (in->response_started) {
        return no(RIC_RETRY_RESPONSE_STARTED);
    }
    /* an unsafe request is repeated only when it provably
     * never reached the upstream */
    if (!in->replay_safe && in->class != RIC_CLASS_CONNECT_ERROR) {
        return no(in->key_no_contract ? RIC_RETRY_KEY_NO_CONTRACT : RIC_RETRY_UNSAFE);
    }
    if (!in->body_replayable) {
        return no(RIC_RETRY_BODY_NOT_KEPT);
    }
    if (policy->attempts > 0 && in->attempt >= policy->attempts) {
        return no(RIC_RETRY_ATTEMPTS);
    }
    if (in->classified == RIC_CLASSIFY_RETRY && in->has_script_delay) {
        d.wait_ms = ric_max(in->script_delay_ms, (int64_t) 0);
        d.regime = RIC_WAIT_SCRIPT;
    } else if (in->class == RIC_CLASS_STATUS && in->has_retry_after && in->retry_after_ms >= 0
        && in->retry_after_ms <= policy->retry_after_max_ms) {
        d.wait_ms = in->retry_after_ms;
        d.regime = RIC_WAIT_RETRY_AFTER;
    } else {
        d.wait_ms = ric_backoff_wait(&policy->backoff, in->attempt, rnd, ctx);
        /* a rate limit (429), or an upstream asking for longer than
         * retry_after_max, says the failure is not a passing one: the
         * schedule, whatever the upstream's other retries did */
        if (policy->adaptive && in->backoff_share < 1000
            && !(in->class == RIC_CLASS_STATUS && (in->status == 429 || in->has_retry_after))) {
            d.wait_ms = ric_retry_adaptive_wait(d.wait_ms, in->backoff_share);
            d.regime = in->backoff_share <= 0 ? RIC_WAIT_FAST : RIC_WAIT_SCALED;
        }
    }
    /* a wait that would end at or past the deadline is not
     * taken; the client gets this answer now */
    if (in->now_ms + d.wait_ms >= in->deadline_ms) {
        return no(RIC_RETRY_DEADLINE);
    }
    /* refused only when the budget cannot pay and may not wait: a retry
     * that may wait is paid for (or waits on) when it is about to be sent */
    if (budget != NULL
        && ric_budget_check(budget, ric_retry_cost(in->class), in->now_ms) == RIC_BUDGET_REFUSED) {
        return no(RIC_RETRY_BUDGET);
    }
    return d;
}

int64_t
ric_retry_adaptive_wait(int64_t w, int64_t share)
{
    int64_t fast = w % (RIC_BACKOFF_FAST_MS + 1); /* the draw's own jitter, a few ms wide */

    share = ric_max(ric_min(share, (int64_t) 1000), (int64_t) 0);
    return (w * share + ric_min(fast, w) * (1000 - share)) / 1000;
}

const char *
ric_retry_regime_name(ric_wait_regime_t regime)
{
    static const char *const names[] = { "backoff", "fast", "scaled", "retry_after", "script",
                                         "budget" };

    return (size_t) regime < ric_nelems(names) ? names[regime] : "unknown";
}

int64_t
ric_retry_cost(unsigned class)
{
    return class == RIC_CLASS_TIMEOUT ? RIC_BUDGET_COST_TIMEOUT : RIC_BUDGET_COST;
}
