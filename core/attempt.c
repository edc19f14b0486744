/* attempt.c: the attempts phase: start a try, time it, and end every try in one attempt-done entry (health, classify, decide, count, then wait, deliver or give up). */
#include "attempt.h"
#include "script.h"
#include "headers.h"
#include "hedge.h"
#include "log.h"
#include "request.h"
#include "respond.h"
#include "retry_after.h"
#include "upstream_request.h"

#include <errno.h>
#include <time.h>

static void attempt_start(ric_request_t *r);
static void record_attempt(ric_request_t *r, ric_attempt_t *u, const char *class, ric_mclass_t mc,
                           int status);
static void attempt_done(ric_attempt_t *u, unsigned class, int err, const char *what);
static void attempts_end(ric_request_t *r, ric_attempt_t *answer, int status,
                         ric_retry_reason_t why, const char *cut);

/* --- the client's callbacks ------------------------------------------------ */

static void
on_failed(ric_http1_t *h, unsigned class, int err, const char *what)
{
    attempt_done(h->data, class, err, what);
}

static void
on_head(ric_http1_t *h)
{
    ric_attempt_t *u = h->data;

    if (h->early_answer) {
        ric_request_body_unwanted(u->r);
    }
    attempt_done(u, RIC_CLASS_STATUS, 0, NULL);
}

static void
on_sent(ric_http1_t *h)
{
    ric_attempt_t *u = h->data;
    ric_request_t *r = u->r;
    int64_t ms;
    struct timeval tv;

    if (r->body_mode != RIC_REQ_BODY_STREAM) {
        return;
    }
    /* the client's upload pace is not the upstream's: the deadline and
     * per_try_timeout count from the end of a streamed body */
    r->deadline_ms = ric_now_ms() + r->deadline_span_ms;
    ms = ric_min(r->settings->per_try_timeout, r->deadline_span_ms);
    tv = ric_ms_to_tv(ric_max(ms, (int64_t) 1));
    event_add(&u->try_timer, &tv);
}

static void
on_upload_room(ric_http1_t *h)
{
    ric_attempt_t *u = h->data;

    ric_request_upload_room(u->r);
}

static void
on_body(ric_http1_t *h)
{
    ric_attempt_t *u = h->data;

    ric_respond_relay(u->r);
}

static void
on_body_failed(ric_http1_t *h, int err, const char *what)
{
    ric_attempt_t *u = h->data;

    /* the answer broke off after it was delivered: a failure of the server,
     * for passive health, though it can no longer be retried */
    ric_upstream_report(u->r->up, h->peer, 1, ric_now_ms());
    ric_respond_broken(u->r, err, what);
}

static void attempt_free(ric_attempt_t *u);
static void drain_over(ric_attempt_t *u, int whole);

static void
on_drained(ric_http1_t *h, int whole)
{
    drain_over(h->data, whole);
}

static void
on_peeked(ric_http1_t *h, int whole)
{
    ric_attempt_t *u = h->data;

    u->peeked = whole ? 1 : -1;
    attempt_done(u, RIC_CLASS_STATUS, 0, NULL);
}

static const ric_http1_handler_t handler = {
    on_failed, on_head, on_sent, on_upload_room, on_body, on_body_failed, on_drained, on_peeked
};

/* --- setting up ------------------------------------------------------------ */

/* The retry policy, the deadline and what makes this request safe to
 * repeat. */
static void
setup(ric_request_t *r)
{
    const ric_http_settings_t *s = r->settings;
    const ric_http_refs_t *refs = &r->location->refs;
    const u_char *in = r->c->in;
    int64_t now = ric_now_ms(), client_ms;
    ric_str_t v;
    ric_replay_input_t replay_in;
    ric_replay_t replay;

    r->policy.enabled = s->retries == 1;
    r->policy.attempts = s->retry_attempts;
    r->policy.backoff.initial_ms = s->retry_backoff_initial;
    r->policy.backoff.max_ms = s->retry_backoff_max;
    r->policy.backoff.factor = (double) s->retry_backoff_factor_milli / 1000.0;
    r->policy.backoff.jitter = (ric_jitter_t) s->retry_backoff_jitter;
    r->policy.adaptive = s->retry_backoff_adaptive == 1;
    r->policy.retry_after_max_ms = s->retry_after_max;
    r->policy.retry_on = refs->retry_on;

    r->deadline_span_ms = s->retry_timeout;
    v = ric_headers_find(in, r->msg, refs->client_deadline_header);
    if (v.data != NULL) {
        if (ric_retry_parse_deadline(v.data, v.len, &client_ms) == RIC_OK) {
            r->deadline_span_ms = ric_min(r->deadline_span_ms, client_ms);
        } else {
            ric_log_error(RIC_LOG_INFO, 0, "ignoring an invalid %s \"%.*s\", client: %s",
                          refs->client_deadline_header, (int) ric_min(v.len, (size_t) 64),
                          v.data, r->c->peer);
        }
    }
    r->deadline_ms = now + r->deadline_span_ms;

    v = r->script_key_removed ? (ric_str_t) ric_null_string
                              : ric_headers_find(in, r->msg, refs->idempotency_key_header);
    replay_in.method = (int) r->msg->method;
    replay_in.script_idempotent = r->script_idempotent;
    replay_in.script_key = r->script_key != NULL;
    replay_in.client_key = v.data != NULL && v.len > 0
                           && ric_headers_count(in, r->msg, refs->idempotency_key_header) == 1;
    replay_in.key_mode = (int) s->idempotency_key;
    replay = ric_retry_replay(&replay_in);
    r->replay_safe = replay.safe;
    r->key_no_contract = replay.key_no_contract;
    if (replay.mint_key) {
        ric_uuid_v4(r->minted_key);
    }
    r->body_replayable = r->body_mode != RIC_REQ_BODY_STREAM
                         && ric_body_size(&r->body) <= (uint64_t) s->retry_body_max;

    ric_budget_request(&r->up->budget, now);
}

/* --- attempts and waits ---------------------------------------------------- */

/* Request heads' buffers, of HEAD_SIZE (one that grew past it goes),
 * and freed attempts, kept for the next requests. */
#define HEAD_SIZE 4096

static ric_keep_t heads = RIC_KEEP(32);
static ric_keep_t attempts = RIC_KEEP(32);

static void
head_take(ric_buf_t *b)
{
    b->data = ric_keep_take(&heads);
    if (b->data == NULL) {
        b->data = ric_xmalloc(HEAD_SIZE);
    }
    b->size = HEAD_SIZE;
    b->len = 0;
}

static void
head_give(ric_buf_t *b)
{
    if (b->size == HEAD_SIZE && ric_keep_give(&heads, b->data)) {
        b->data = NULL;
        b->len = b->size = 0;
        return;
    }
    ric_buf_free(b);
}

static void
attempt_free(ric_attempt_t *u)
{
    if (u == NULL) {
        return;
    }
    ric_assert(!u->recycled); /* freed twice would be handed out twice */
    event_del(&u->try_timer);
    ric_http1_free(&u->client);
    u->recycled = 1;
    if (!ric_keep_give(&attempts, u)) {
        free(u);
    }
}

static void
wait_stop(ric_request_t *r)
{
    ric_attempts_t *a = r->attempts;

    a->waiting = 0;
    event_del(&a->wait_timer);
    ric_request_async_end(r, &a->wait_async);
}

static void
wait_start(ric_request_t *r, int64_t ms)
{
    ric_attempts_t *a = r->attempts;
    struct timeval tv = ric_ms_to_tv(ms);

    event_add(&a->wait_timer, &tv);
    ric_request_async_begin(r, &a->wait_async);
}

/* Every attempt, the kept response and the wait: released at finalize. */
static void
attempts_cleanup(void *data)
{
    ric_request_t *r = data;
    ric_attempts_t *a = r->attempts;

    /* the attempt under way, if the request ends under it */
    attempts_end(r, NULL, 0, RIC_RETRY_YES,
                 r->end == RIC_END_SHUTDOWN ? "shutdown"
                 : r->end == RIC_END_CLIENT_GONE ? "client_closed" : NULL);
    if (r->log.upstream == NULL && (a->current != NULL || a->prev_peer != NULL)) {
        r->log.upstream = (a->current ? a->current->client.peer : a->prev_peer)->conf->addr_text;
    }
    event_del(&a->hedge_timer);
    attempt_free(a->current);
    attempt_free(a->racing);
    attempt_free(a->kept);
    attempt_free(a->draining);
    if (r->answer != a->current && r->answer != a->kept && r->answer != a->draining) {
        attempt_free(r->answer);
    }
    a->current = a->racing = a->kept = a->draining = r->answer = NULL;
    head_give(&a->head);
    ric_buf_free(&a->hedge_head);
}

static void
cancel_wait(ric_async_t *async)
{
    ric_request_t *r = async->data;

    event_del(&r->attempts->wait_timer);
}

static void
arm_try_timer(ric_attempt_t *u)
{
    ric_request_t *r = u->r;
    int64_t left = ric_max(r->deadline_ms - ric_now_ms(), (int64_t) 1);
    int64_t ms = ric_min(r->settings->per_try_timeout, left);
    struct timeval tv = ric_ms_to_tv(ms);

    u->timer_is_deadline = ms == left;

    event_add(&u->try_timer, &tv);
}

static void
on_try_timeout(evutil_socket_t fd, short what, void *arg)
{
    ric_attempt_t *u = arg;

    (void) fd;
    (void) what;
    attempt_done(u, u->client.state == RIC_HTTP1_CONNECTING
                            || u->client.state == RIC_HTTP1_HANDSHAKE ? RIC_CLASS_CONNECT_ERROR
                                                                      : RIC_CLASS_TIMEOUT,
                 0, "upstream timed out (per_try_timeout)");
}

/* A new attempt (number ++count) and its request head, built into head. */
static ric_attempt_t *
attempt_new(ric_request_t *r, ric_buf_t *head)
{
    ric_attempts_t *a = r->attempts;
    const ric_http_settings_t *s = r->settings;
    ric_attempt_t *u = ric_keep_take(&attempts);

    if (u == NULL) {
        u = ric_xmalloc(sizeof(*u));
    }
    memset(u, 0, offsetof(ric_attempt_t, client)); /* the client: ric_http1_init */
    u->r = r;
    u->number = ++a->count;
    ric_upstream_request_build(r, u->number, head);
    ric_http1_init(&u->client, &handler, u, r->up, r->msg->method);
    u->client.connect_timeout = s->proxy_connect_timeout;
    u->client.send_timeout = s->proxy_send_timeout;
    u->client.read_timeout = s->proxy_read_timeout;
    u->client.drain_max = (uint64_t) s->upstream_drain_max;
    u->client.drain_timeout = s->upstream_drain_timeout;
    evtimer_assign(&u->try_timer, r->c->base, on_try_timeout, u);
    return u;
}

/* Sends u to peer. */
static void
attempt_send(ric_attempt_t *u, ric_peer_t *peer, const ric_buf_t *head)
{
    ric_request_t *r = u->r;

    u->start_us = ric_now_exact_us(); /* the hedge's delay and the p95 count from the send */
    if (r->body_mode != RIC_REQ_BODY_STREAM) {
        arm_try_timer(u); /* a streamed body's clock starts when it has been sent */
    }
    /* a request that cannot be retried takes no chances with a pooled
     * connection: it is checked even when it was idle only a moment */
    if (ric_http1_start(&u->client, peer, !(r->replay_safe && r->body_replayable),
                        head->data, head->len, &r->body,
                        r->body_mode == RIC_REQ_BODY_STREAM ? &r->upload : NULL)
        != RIC_OK) {
        attempt_done(u, RIC_CLASS_CONNECT_ERROR, errno, "connect() failed");
    }
}

/* --- hedging (retry_hedge) --------------------------------------------------- */

/* The first attempt of a request that may be sent twice at once gets its
 * hedge timer: after retry_hedge, or the upstream's p95 (auto; none until
 * it has one). Only what may be retried is hedged: a replay-safe request
 * whose body is held, with retries on and an attempt left. */
static void
hedge_arm(ric_request_t *r)
{
    ric_attempts_t *a = r->attempts;
    int64_t ms = r->settings->retry_hedge, us;
    struct timeval tv;

    if (ms == RIC_HEDGE_OFF || a->count != 1 || !r->policy.enabled || ric_retry_killed
        || !r->replay_safe || r->key_no_contract || !r->body_replayable
        || (r->policy.attempts != 0 && r->policy.attempts < 2)) {
        return;
    }
    if (ms == RIC_HEDGE_AUTO) {
        us = ric_hedge_p95_us(r->up->hedge);
        if (us < 0 || us > r->deadline_span_ms * 1000) {
            return;
        }
        ms = ric_max((us + 999) / 1000, (int64_t) 1);
    }
    if (ric_now_ms() + ms >= r->deadline_ms) {
        return;
    }
    a->hedge_after_ms = ms;
    tv = ric_ms_to_tv(ms);
    event_add(&a->hedge_timer, &tv);
}

/* The first attempt still has no answer: its hedge goes to another server
 * (the same one when the upstream has no other up), paid from the budget. */
static void
on_hedge_time(evutil_socket_t fd, short what, void *arg)
{
    ric_request_t *r = arg;
    ric_attempts_t *a = r->attempts;
    ric_attempt_t *first = a->current, *u;
    int64_t now = ric_now_ms(), paid = 0;

    (void) fd;
    (void) what;
    struct timeval tv;
    int64_t early_us;

    if (first == NULL || first->number != 1 || a->racing != NULL || r->responding
        || first->client.state > RIC_HTTP1_HEAD || now >= r->deadline_ms) {
        return;
    }
    /* the loop's timers run on a cached, coarse clock and may fire a
     * millisecond or two early: a hedge never goes before its delay */
    early_us = a->hedge_after_ms * 1000 - (ric_now_exact_us() - first->start_us);
    if (early_us > 0) {
        tv.tv_sec = 0;
        tv.tv_usec = (suseconds_t) ric_min(early_us + 100, (int64_t) 999999);
        event_add(&a->hedge_timer, &tv);
        return;
    }
    if (!ric_budget_take_hedge(&r->up->budget, now, &paid)) {
        ric_metrics_hedge(r->location->metrics, r->up->conf->metrics, RIC_MH_REFUSED);
        ric_log_error(RIC_LOG_INFO, 0, "the retry budget of upstream \"%s\" refused a hedge, "
                      "client: %s", r->up->conf->name, r->c->peer);
        return;
    }
    u = attempt_new(r, &a->hedge_head);
    u->hedge = 1;
    u->paid = paid;
    u->wait_us = ric_now_exact_us() - first->start_us;
    a->racing = u;
    ric_log_error(RIC_LOG_INFO, 0, "hedging: attempt %d, no answer from %s after %lldms, "
                  "client: %s", u->number, first->client.peer->conf->addr_text,
                  (long long) a->hedge_after_ms, r->c->peer);
    attempt_send(u, ric_upstream_pick(r->up, first->client.peer, now), &a->hedge_head);
}

/* The other attempt of a hedged pair answered first: this one is closed
 * (its connection with it, never pooled half-read). What a hedge paid is
 * not given back: the upstream had its load. */
static void
attempt_cancel(ric_request_t *r, ric_attempt_t *u)
{
    event_del(&u->try_timer);
    record_attempt(r, u, "cancelled", RIC_MC_CANCELLED, 0);
    attempt_free(u);
}

static void
attempt_start(ric_request_t *r)
{
    ric_attempts_t *a = r->attempts;
    ric_attempt_t *u;

    /* a dropped response still arriving goes on beside it (a->draining) */
    a->waiting = 0;

    u = attempt_new(r, &a->head);
    u->wait_us = a->wait_us;
    u->regime = a->regime;
    u->paid = a->paid;
    a->paid = 0;
    a->paid_for = 0;
    a->current = u;
    hedge_arm(r);
    attempt_send(u, ric_upstream_pick(r->up, a->prev_peer, ric_now_ms()), &a->head);
}

/* Waiting for the budget: asked again after about the first backoff
 * window, kept within these bounds (a 1 ms backoff must not spin, a long
 * one must not sleep through the upstream's return). */
#define BUDGET_POLL_MIN_MS 100
#define BUDGET_POLL_MAX_MS 1000

/* A retry is paid for when it is about to be sent, not when it is
 * decided: waiting costs the upstream nothing. A budget that cannot pay
 * may let it wait and ask again (never past the deadline), or refuse it:
 * then a->stop says why and the next attempt is not made.
 * RIC_OK: go on; RIC_AGAIN: waiting again. */
static int
budget_gate(ric_request_t *r, int64_t now)
{
    ric_attempts_t *a = r->attempts;
    int64_t poll, ms;
    int may_probe;

    if (a->count == 0 || a->paid_for || a->stop != RIC_RETRY_YES) {
        return RIC_OK;
    }
    /* a probe that fails must leave its request an attempt of its own */
    may_probe = r->policy.attempts == 0 || a->count + 1 < r->policy.attempts;
    switch (ric_budget_take(&r->up->budget, a->retry_cost, now, may_probe, &a->paid)) {
    case RIC_BUDGET_GRANTED:
        a->paid_for = 1;
        return RIC_OK;
    case RIC_BUDGET_WAIT:
        /* jittered over [poll/2, 3 poll/2), so the waiting requests of a
         * brownout come back spread out, not in a herd */
        poll = ric_min(ric_max(r->policy.backoff.initial_ms, (int64_t) BUDGET_POLL_MIN_MS),
                       (int64_t) BUDGET_POLL_MAX_MS);
        ms = poll / 2 + (int64_t) (ric_backoff_rand(NULL) % (uint64_t) poll);
        if (now + ms < r->deadline_ms) {
            a->wait_us += ms * 1000;
            a->regime = RIC_WAIT_BUDGET;
            a->wait_until_ms = now + ms;
            wait_start(r, ms);
            return RIC_AGAIN;
        }
        ric_log_error(RIC_LOG_INFO, 0, "the retry budget of upstream \"%s\" held attempt %d "
                      "until the deadline, client: %s", r->up->conf->name, a->count + 1,
                      r->c->peer);
        break;
    case RIC_BUDGET_REFUSED:
        ric_log_error(RIC_LOG_INFO, 0, "the retry budget of upstream \"%s\" refused attempt %d, "
                      "client: %s", r->up->conf->name, a->count + 1, r->c->peer);
        break;
    }
    a->stop = RIC_RETRY_BUDGET;
    return RIC_OK;
}

/* The attempts ended while a dropped response was still arriving; the
 * wait for it is over (it came, or not in time): they end now, once. */
static void
hold_over(ric_request_t *r)
{
    ric_attempts_t *a = r->attempts;

    a->holding = 2;
    attempts_end(r, NULL, a->hold_status, a->hold_why, NULL);
}

/* The wait is over: the next attempt, unless the budget stopped it. */
static void
next_attempt(ric_request_t *r)
{
    ric_attempts_t *a = r->attempts;

    if (a->stop != RIC_RETRY_YES) {
        attempts_end(r, NULL, a->fail_status, a->stop, NULL);
        return;
    }
    attempt_start(r);
}

static void
on_wait_done(evutil_socket_t fd, short what, void *arg)
{
    ric_request_t *r = arg;
    ric_attempts_t *a = r->attempts;
    int64_t now = ric_now_ms();

    (void) fd;
    (void) what;
    ric_request_async_end(r, &a->wait_async);
    if (a->holding == 1) {
        hold_over(r); /* the dropped response still arriving had its time */
        return;
    }
    if ((a->waiting || a->count == 0) && now >= r->deadline_ms) {
        /* a client that allowed no time at all gets its 504 without
         * bothering the upstream */
        attempts_end(r, NULL, 504, RIC_RETRY_DEADLINE, NULL);
        return;
    }
    if (budget_gate(r, now) != RIC_OK) {
        return;
    }
    next_attempt(r);
}

/* A response dropped for a retry was read to its end (whole: the answer
 * of last resort now) or is not kept. */
static void
drain_over(ric_attempt_t *u, int whole)
{
    ric_request_t *r = u->r;
    ric_attempts_t *a = r->attempts;

    a->draining = NULL;
    if (whole) {
        attempt_free(a->kept);
        a->kept = u;
    } else {
        attempt_free(u);
    }
    if (a->holding == 1) {
        /* the attempts had ended and only this read held their answer back */
        wait_stop(r);
        hold_over(r);
    }
}

/* The attempt-done entry: the attempt goes into the access log and the
 * metrics (what it met; a retry, by what the attempt before it met). */
static void
record_attempt(ric_request_t *r, ric_attempt_t *u, const char *class, ric_mclass_t mc,
               int status)
{
    ric_attempts_t *a = r->attempts;
    ric_access_entry_t *e = &r->log;
    ric_attempt_record_t *rec;
    int64_t took = ric_now_exact_us() - u->start_us;

    e->attempts_total++;
    if (e->nattempts >= RIC_MAX_ATTEMPTS) {
        /* a long schedule keeps its first attempts and its latest one */
        e->nattempts = RIC_MAX_ATTEMPTS - 1;
    }
    rec = &e->attempts[e->nattempts++];
    rec->server = u->client.peer ? u->client.peer->conf->addr_text : NULL;
    rec->class = class;
    rec->status = status;
    rec->duration_us = took;
    rec->wait_us = u->wait_us;
    rec->regime = u->number > 1 && !u->hedge ? ric_retry_regime_name(u->regime) : NULL;
    rec->hedge = u->hedge;
    ric_metrics_attempt(r->location->metrics, r->up->conf->metrics, mc,
                        status != 0 ? took : -1, u->number > 1 && !u->hedge ? (int) a->last_mc : -1,
                        u->wait_us);
    if (r->settings->retry_hedge == RIC_HEDGE_AUTO
        && (status != 0 || (!u->hedge && (mc == RIC_MC_TIMEOUT || mc == RIC_MC_CANCELLED)))) {
        /* how long the upstream takes to answer: a timed-out attempt, or a
         * first one cancelled for its hedge, took at least this long (it
         * had run past the hedge's delay). A cancelled hedge says nothing:
         * it ran only as long as the first took beyond that delay. */
        ric_hedge_observe(r->up->hedge, took);
    }
    if (u->hedge) {
        int how = mc == RIC_MC_CANCELLED || mc == RIC_MC_CUT || mc == RIC_MC_CLIENT_BODY
                      ? RIC_MH_LOST : u->failed ? RIC_MH_FAILED : RIC_MH_WON;
        ric_metrics_hedge(r->location->metrics, r->up->conf->metrics, how);
        e->hedge = ric_metrics_hedge_name(how);
    }
    a->last_mc = mc;
    a->last_classified = u->classified;
}

/* The route script's word on the outcome, above retry_on; *failed (the
 * built-in view: a class, or a status in retry_on) becomes the script's
 * when it spoke. */
static int
classify(ric_request_t *r, ric_attempt_t *u, unsigned class, int64_t *delay_ms, int *failed)
{
    int word = ric_script_classify(r, u, class, delay_ms, failed);

    if (word == RIC_CLASSIFY_RETRY && !r->replay_safe && class != RIC_CLASS_CONNECT_ERROR) {
        ric_log_error(RIC_LOG_WARN, 0, "route script %s asked to retry a request that is not "
                      "replay-safe: refused (an unsafe method without an idempotency key), client: %s",
                      r->location->refs.script->path, r->c->peer);
    }
    return word;
}

static const char *
doing(const ric_attempt_t *u)
{
    switch (u->client.state) {
    case RIC_HTTP1_CONNECTING:
        return "connecting to upstream";
    case RIC_HTTP1_HANDSHAKE:
        return "performing the TLS handshake with upstream";
    case RIC_HTTP1_SENDING:
        return "sending the request to upstream";
    case RIC_HTTP1_PEEK:
        return "reading the response body from upstream (classify_body_max)";
    default:
        return "reading the response head from upstream";
    }
}

/* The response of u is the answer. */
static void
deliver(ric_attempt_t *u)
{
    ric_request_t *r = u->r;
    ric_attempts_t *a = r->attempts;

    if (a->current == u) {
        a->current = NULL;
    } else if (a->kept == u) {
        a->kept = NULL;
    }
    attempt_free(a->kept);
    attempt_free(a->draining);
    a->kept = a->draining = NULL;
    wait_stop(r);
    r->answer = u;
    r->answer_classified = u->classified;
    r->log.upstream = u->client.peer->conf->addr_text;
    ric_request_resume(r);
}

/* A retry the outcome asked for and that was not made, counted by why:
 * the decision's reason, the kill switch, or the route script calling a
 * retryable outcome final. */
static void
refusal_count(ric_request_t *r, ric_retry_reason_t why)
{
    ric_attempts_t *a = r->attempts;
    ric_route_shard_t *sh = ric_metrics_route(r->location->metrics);
    int n = why;

    if (sh == NULL || a->count == 0) {
        return;
    }
    if (why == RIC_RETRY_OFF && ric_retry_killed) {
        n = RIC_MR_KILL_SWITCH;
    } else if (why == RIC_RETRY_KEY_NO_CONTRACT) {
        n = RIC_RETRY_UNSAFE; /* unsafe, whoever set the key */
    } else if ((why == RIC_RETRY_FINAL_STATUS || why == RIC_RETRY_CLASS_NOT_LISTED)
               && a->last_classified == RIC_CLASSIFY_FINAL && a->last_transient) {
        n = RIC_MR_SCRIPT;
    }
    if (ric_metrics_refusal_name(n) != NULL) {
        ric_metric_add(&sh->refused[n], 1);
    }
}

/* The one end of the attempts, whatever ends them: the decision, the
 * budget, the deadline at the end of a wait, a worker stopping, the
 * client's body breaking, the client leaving (the finalize's cleanup). The
 * attempt still under way is recorded as `cut` (nothing is said of its
 * server's health: the fault is not the server's), and what the budget
 * was paid for a retry whose outcome nobody will know goes back. why, unless it is "retry" or final_status, is the
 * request's not-retried reason: set here and nowhere else. The answer is
 * answer's response, else the last whole one kept, else the gateway's own
 * status; status 0: no answer from here (the request gives its own, or
 * has ended). */
static void
attempts_end(ric_request_t *r, ric_attempt_t *answer, int status, ric_retry_reason_t why,
             const char *cut)
{
    ric_attempts_t *a = r->attempts;
    ric_attempt_t *kept = a->kept;

    ric_attempt_t *out[2] = { a->current, a->racing };
    int64_t hold;
    int i;

    /* no response to give, while the last one dropped is still arriving
     * (its retry went without waiting for it): it may be the answer, held
     * for within its drain's bound, and half of what the deadline leaves */
    hold = ric_min(r->settings->upstream_drain_timeout, (r->deadline_ms - ric_now_ms()) / 2);
    if (answer == NULL && status != 0 && a->draining != NULL && !a->holding && hold > 0) {
        a->holding = 1;
        a->hold_status = status;
        a->hold_why = why;
        wait_start(r, hold);
        return;
    }
    for (i = 0; i < 2; i++) {
        if (out[i] == NULL || out[i] == answer) {
            continue;
        }
        if (cut != NULL) {
            record_attempt(r, out[i], cut,
                           strcmp(cut, "client_body") == 0 ? RIC_MC_CLIENT_BODY : RIC_MC_CUT, 0);
        }
        /* a retry paid for whose outcome nobody will know: its token goes back */
        if (out[i]->paid > 0) {
            ric_budget_refund(&r->up->budget, out[i]->paid);
            out[i]->paid = 0;
        }
    }
    event_del(&a->hedge_timer);
    if (a->paid > 0) { /* ...and one granted for a retry that is not made */
        ric_budget_refund(&r->up->budget, a->paid);
        a->paid = 0;
    }
    wait_stop(r);
    if (why != RIC_RETRY_YES && why != RIC_RETRY_FINAL_STATUS) {
        r->not_retried = why;
    }
    refusal_count(r, why);
    if (a->count > 0 && r->log.verdict == NULL) {
        r->log.verdict = answer != NULL ? "passed" : status == 0 ? "cut" : "gave_up";
        r->log.reason = why != RIC_RETRY_YES ? ric_retry_reason_name(why) : cut ? cut : "cut";
    }
    if (status == 0 && answer == NULL) {
        return;
    }
    if (answer != NULL) {
        if (answer->number > 1 || why != RIC_RETRY_FINAL_STATUS) {
            ric_log_error(RIC_LOG_INFO, 0, "passing on %d from upstream after %d attempt%s (%s), "
                          "client: %s", answer->client.resp.status, answer->number,
                          answer->number > 1 ? "s" : "", ric_retry_reason_name(why), r->c->peer);
        }
        deliver(answer);
        return;
    }
    if (a->count > 0) {
        ric_log_error(RIC_LOG_INFO, 0, "giving up after %d attempt%s (%s), client: %s", a->count,
                      a->count > 1 ? "s" : "", ric_retry_reason_name(why), r->c->peer);
    }
    if (kept != NULL && ric_http1_read_body(&kept->client, kept->client.resp.body
                                            == RIC_BODY_CHUNKED && r->msg->version == 10)
                            == RIC_OK) {
        ric_log_error(RIC_LOG_INFO, 0, "passing on the last response (%d) after %d attempts, "
                      "client: %s", kept->client.resp.status, a->count, r->c->peer);
        r->log.verdict = "kept";
        deliver(kept);
        return;
    }
    if (a->prev_peer != NULL) {
        r->log.upstream = a->prev_peer->conf->addr_text; /* the last one tried, as nginx logs it */
    }
    ric_request_answer(r, status, 0);
    ric_request_resume(r);
}

/* The gateway's answer when attempts end without a response: 504 when the
 * upstream ran out of time (a per-try timeout, a connect that timed out),
 * 502 when it failed (refused, reset, a bad response, TLS). */
static int
failure_status(unsigned class, int err, int tls_failed)
{
    return class == RIC_CLASS_TIMEOUT
           || (class == RIC_CLASS_CONNECT_ERROR && err == 0 && !tls_failed) ? 504 : 502;
}

/* A response dropped for a retry (or for the other attempt of a pair):
 * kept whole as an answer of last resort, or read on beside the next
 * attempt (which never waits for it), or left to its connection's drain. */
static void
keep_dropped(ric_request_t *r, ric_attempt_t *u, unsigned class)
{
    ric_attempts_t *a = r->attempts;
    int rc = class == RIC_CLASS_STATUS ? ric_http1_drop(&u->client) : -1;

    if (rc == 1) {
        /* an answer of last resort, if no response follows; an older one
         * still arriving is not wanted now (its connection drains alone) */
        attempt_free(a->kept);
        attempt_free(a->draining);
        a->draining = NULL;
        a->kept = u;
    } else if (rc == 0) {
        attempt_free(a->draining);
        a->draining = u;
    } else {
        attempt_free(u);
    }
}

/* The one end of every attempt: passive health, classification, the
 * decision, the attempt log, then a wait and a retry, the answer, or the
 * end of trying. */
static void
attempt_done(ric_attempt_t *u, unsigned class, int err, const char *what)
{
    ric_request_t *r = u->r;
    ric_attempts_t *a = r->attempts;
    ric_http1_t *h = &u->client;
    ric_retry_input_t in;
    ric_retry_decision_t d;
    int64_t now = ric_now_ms();
    int status = class == RIC_CLASS_STATUS ? h->resp.status : 0, failed, rc;
    int tls_failed = h->tls_failed; /* u may be freed before it is needed */
    int yield;
    ric_str_t ra;
    ric_attempt_t *rival; /* the other attempt of a hedged pair, still out */

    /* a route script that classifies by the body gets it first, when it is
     * small (classify_body_max); the per-try timer still runs meanwhile */
    if (class == RIC_CLASS_STATUS && u->peeked == 0 && r->settings->classify_body_max > 0
        && h->resp.body != RIC_BODY_NONE && ric_script_classifies(r)) {
        rc = ric_http1_peek(h, (size_t) r->settings->classify_body_max);
        if (rc == RIC_AGAIN) {
            return; /* on_peeked, or on_failed, comes back here */
        }
        if (rc == RIC_ERROR) {
            attempt_done(u, RIC_CLASS_BAD_RESPONSE, 0, "upstream sent an invalid chunked body");
            return;
        }
        u->peeked = rc == 1 ? 1 : -1;
    }
    event_del(&u->try_timer);
    if (u->number == 1) {
        event_del(&a->hedge_timer); /* the first attempt has its outcome: no hedge */
    }
    rival = u == a->current ? a->racing : u == a->racing ? a->current : NULL;
    if (class != RIC_CLASS_STATUS) {
        ric_log_error(RIC_LOG_ERR, err, "%s while %s, client: %s, upstream: %s, attempt: %d",
                      what, doing(u), r->c->peer, h->peer->conf->addr_text, u->number);
    }

    /* health: a status in retry_on counts against the server, as a
     * failure, unless the route script says otherwise */
    failed = class != RIC_CLASS_STATUS
             || ric_retry_on_match(r->policy.retry_on, RIC_CLASS_STATUS, status);
    memset(&in, 0, sizeof(in));
    in.class = class;
    in.classified = classify(r, u, class, &in.script_delay_ms, &failed);
    u->classified = in.classified;
    in.has_script_delay = in.script_delay_ms >= 0;
    ric_upstream_report(r->up, h->peer, failed, now);
    in.status = status;
    in.attempt = u->number;
    in.replay_safe = r->replay_safe;
    in.key_no_contract = r->key_no_contract;
    in.body_replayable = r->body_replayable;
    /* a try timer that was the deadline's is the deadline, though
     * libevent's cached, coarse clock may ring it a millisecond or two
     * before ours reaches it: no retry is sent into what is left */
    in.now_ms = class == RIC_CLASS_TIMEOUT && u->timer_is_deadline ? ric_max(now, r->deadline_ms)
                                                                   : now;
    in.deadline_ms = r->deadline_ms;
    in.response_started = r->responding; /* an answer already under way is never taken back */
    if (class == RIC_CLASS_STATUS) {
        ra = ric_http_field(&h->resp, h->buf, "retry-after");
        if (ra.data != NULL
            && ric_retry_after_parse(ra.data, ra.len, time(NULL), &in.retry_after_ms) == RIC_OK) {
            in.has_retry_after = 1;
        }
    }
    in.backoff_share = r->policy.adaptive ? ric_budget_backoff_share(&r->up->budget) : 1000;
    d = ric_retry_decide(&r->policy, &in, &r->up->budget, ric_backoff_rand, NULL);
    u->failed = failed;
    /* of a hedged pair, the first answer that is not a failure wins; a
     * failure leaves the other to go on alone */
    yield = rival != NULL && (failed || d.retry || class != RIC_CLASS_STATUS);

    if (!yield && !d.retry && class == RIC_CLASS_STATUS
        && ric_http1_read_body(h, h->resp.body == RIC_BODY_CHUNKED && r->msg->version == 10)
               != RIC_OK) {
        /* nothing has reached the client yet: it gets a clean answer */
        attempt_done(u, RIC_CLASS_BAD_RESPONSE, 0, "upstream sent an invalid chunked body");
        return;
    }
    ric_budget_outcome(&r->up->budget, failed, u->paid, now);
    if (u->number > 1 && !u->hedge) {
        ric_budget_retried(&r->up->budget, failed); /* adaptive backoff's regime */
    }
    u->paid = 0;
    if (rival != NULL && !yield) {
        ric_log_error(RIC_LOG_INFO, 0, "attempt %d answered first: cancelling attempt %d "
                      "(upstream: %s), client: %s", u->number, rival->number,
                      rival->client.peer->conf->addr_text, r->c->peer);
        attempt_cancel(r, rival);
        a->current = u;
        a->racing = NULL;
    }
    a->last_transient = ric_retry_on_match(r->policy.retry_on, class, status);
    record_attempt(r, u, ric_retry_class_name(class), ric_metrics_class(class, status, tls_failed),
                   status);
    a->prev_peer = h->peer;

    if (d.reason == RIC_RETRY_KEY_NO_CONTRACT && !r->location->warned_key_contract) {
        /* once per location and worker: the author's fix is one directive */
        r->location->warned_key_contract = 1;
        ric_log_error(RIC_LOG_WARN, 0, "route script %s set an idempotency key, but location \"%s\" "
                      "(%s:%d) has no idempotency_key on|auto, so its unsafe requests are not "
                      "retried: add \"idempotency_key on;\" if its upstream honours keys",
                      r->location->refs.script ? r->location->refs.script->path : "?",
                      r->location->path, r->location->file, r->location->line);
    }
    if (yield) {
        ric_log_error(RIC_LOG_INFO, 0, "attempt %d failed while attempt %d is still out: "
                      "waiting for it, client: %s", u->number, rival->number, r->c->peer);
        a->current = rival;
        a->racing = NULL;
        keep_dropped(r, u, class);
        return;
    }
    if (d.retry) {
        char after[32] = "";
        if (class == RIC_CLASS_STATUS) {
            snprintf(after, sizeof(after), " %d", status);
        }
        ric_log_error(RIC_LOG_WARN, 0, "retrying after %s%s%s: attempt %d%s%lld in %lldms, "
                      "client: %s, upstream: %s", ric_retry_class_name(class), after,
                      in.classified == RIC_CLASSIFY_RETRY ? " (the route script's classify)" : "",
                      u->number + 1, r->policy.attempts ? "/" : "",
                      (long long) r->policy.attempts, (long long) d.wait_ms, r->c->peer,
                      h->peer->conf->addr_text);
        a->current = NULL;
        keep_dropped(r, u, class);
        a->waiting = 1;
        a->retry_cost = ric_retry_cost(class);
        a->paid = 0;
        a->paid_for = 0;
        a->stop = RIC_RETRY_YES;
        a->fail_status = failure_status(class, err, tls_failed);
        a->wait_us = d.wait_ms * 1000;
        a->regime = d.regime;
        a->wait_until_ms = now + d.wait_ms;
        wait_start(r, d.wait_ms);
        return;
    }

    a->current = NULL;
    if (class == RIC_CLASS_STATUS) {
        attempts_end(r, u, 0, d.reason, NULL);
        return;
    }
    attempt_free(u);
    attempts_end(r, NULL, failure_status(class, err, tls_failed), d.reason, NULL);
}

/* --- the phase ------------------------------------------------------------- */

int
ric_attempts_phase(ric_request_t *r)
{
    ric_attempts_t *a = r->attempts;

    if (r->up == NULL) {
        return ric_request_answer(r, 404, 0); /* the route does not proxy */
    }
    if (a == NULL) {
        a = r->attempts = ric_pcalloc(r->pool, sizeof(*a));
        head_take(&a->head);
        setup(r);
        evtimer_assign(&a->wait_timer, r->c->base, on_wait_done, r);
        evtimer_assign(&a->hedge_timer, r->c->base, on_hedge_time, r);
        a->wait_async.cancel = cancel_wait;
        a->wait_async.data = r;
        ric_request_cleanup_add(r, attempts_cleanup, r);
        /* the first attempt starts from the loop, not from inside the
         * client's read: a request that ends at once must not answer, and
         * move the connection on, underneath the caller */
        event_active(&a->wait_timer, EV_TIMEOUT, 1);
        ric_request_async_begin(r, &a->wait_async);
        return RIC_AGAIN;
    }
    if (r->answer != NULL) {
        return RIC_OK;
    }
    return r->own_answer ? RIC_DONE : RIC_AGAIN;
}

void
ric_attempts_upload_kick(ric_request_t *r)
{
    if (r->attempts != NULL && r->attempts->current != NULL) {
        ric_http1_upload_kick(&r->attempts->current->client);
    }
}

void
ric_attempts_stop(ric_request_t *r)
{
    if (r->attempts == NULL) {
        return;
    }
    /* the request answers with the body's status */
    attempts_end(r, NULL, 0, RIC_RETRY_YES, "client_body");
    attempts_cleanup(r);
}

void
ric_attempts_shutdown(ric_request_t *r, int64_t deadline_ms)
{
    ric_attempts_t *a = r->attempts;

    r->deadline_ms = ric_min(r->deadline_ms, deadline_ms);
    if (a != NULL && a->waiting && a->wait_until_ms >= r->deadline_ms) {
        attempts_end(r, NULL, 502, RIC_RETRY_SHUTDOWN, NULL);
    }
}
