/* worker.c: a worker process: accepts on the inherited listeners and runs the event loop. */
#include "io.h"
#include "worker.h"
#include "access_log.h"
#include "conn.h"
#include "idem_store.h"
#include "pipeline.h"
#include "script.h"
#include "shared_dict.h"
#include "log.h"
#include "metrics.h"
#include "watchdog.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

ric_worker_t *ric_worker;

#define ACCEPTS_PER_WAKE 64
/* a TLS client costs a handshake (hundreds of microseconds of CPU): taking
 * a few at a time keeps the requests of connections already open from
 * waiting behind a burst of them */
#define TLS_ACCEPTS_PER_WAKE 4

static void
accept_enable(ric_worker_t *w, int on)
{
    size_t i;

    if (w->accepting == on) {
        return;
    }
    for (i = 0; i < w->naccept; i++) {
        if (on) {
            event_add(w->accept_events[i], NULL);
        } else {
            event_del(w->accept_events[i]);
        }
    }
    w->accepting = on;
}

static void admin_room(void *ctx, int room);

static void
on_accept(evutil_socket_t fd, short what, void *arg)
{
    ric_listener_t *ls = arg;
    ric_worker_t *w = ric_worker;
    struct sockaddr_storage ss;
    socklen_t len;
    int i, n = ls->ssl ? TLS_ACCEPTS_PER_WAKE : ACCEPTS_PER_WAKE, cfd;

    (void) what;
    for (i = 0; i < n && (ls->admin || w->accepting); i++) {
        cfd = ric_io_accept(fd, &ss, &len);
        if (cfd == -1) {
            if (errno == EAGAIN) {
                return; /* none waits: another worker took it, or the client gave up */
            }
            ric_log_error(RIC_LOG_ALERT, errno, "accept4() failed on %s", ls->text);
            if (errno == EMFILE || errno == ENFILE) {
                /* out of descriptors: pause accepting until one closes */
                if (ls->admin) {
                    admin_room(w, 0);
                } else {
                    accept_enable(w, 0);
                }
            }
            return;
        }
        ric_conn_accept(ls->admin ? &w->admin_conns : &w->conns, ls, cfd,
                        (struct sockaddr *) &ss, len);
    }
}

/* A set has room again, or a descriptor was freed: each listener that
 * paused takes up again, as far as its own set has room. */
static void
resume(ric_worker_t *w)
{
    if (!w->shutting_down && w->conns.n < w->conns.max) {
        accept_enable(w, 1);
    }
    if (w->admin_paused && !w->admin_closed && w->admin_conns.n < w->admin_conns.max) {
        event_add(w->admin_event, NULL);
        w->admin_paused = 0;
    }
}

static void
accept_room(void *ctx, int room)
{
    ric_worker_t *w = ctx;

    if (room) {
        resume(w);
    } else {
        accept_enable(w, 0);
    }
}

/* The admin listener pauses when its own connections are too many, or
 * out of descriptors; a close in either set takes it up again. */
static void
admin_room(void *ctx, int room)
{
    ric_worker_t *w = ctx;

    if (room) {
        resume(w);
    } else if (!w->admin_paused) {
        event_del(w->admin_event);
        w->admin_paused = 1;
    }
}

static void
admin_emptied(void *ctx)
{
    (void) ctx;
}

static void
all_closed(void *ctx)
{
    ric_worker_t *w = ctx;

    event_base_loopbreak(w->base);
}

static void
begin_graceful_shutdown(ric_worker_t *w)
{
    struct timeval tv;
    size_t i;

    if (w->shutting_down) {
        return;
    }
    ric_log_error(RIC_LOG_NOTICE, 0, "gracefully shutting down");
    accept_enable(w, 0);
    w->shutting_down = 1;
    for (i = 0; i < w->naccept; i++) {
        close(event_get_fd(w->accept_events[i]));
    }
    ric_conn_set_drain(&w->conns, w->conf->worker_shutdown_timeout * 9 / 10);
    /* when the instance itself stops, the admin listener still answers
     * (/readyz says 503), one request a connection, until the worker
     * exits; when a new generation or binary serves, it answers there */
    ric_conn_set_drain(&w->admin_conns, 0);
    if (w->admin_event != NULL && !ric_metrics_admin_stays()) {
        event_del(w->admin_event);
        close(event_get_fd(w->admin_event));
        w->admin_paused = 0;
        w->admin_closed = 1;
    }
    if (w->conns.n == 0) {
        event_base_loopbreak(w->base);
        return;
    }
    tv = ric_ms_to_tv(w->conf->worker_shutdown_timeout);
    event_add(w->shutdown_timer, &tv);
}

static void
on_shutdown_timeout(evutil_socket_t fd, short what, void *arg)
{
    ric_worker_t *w = arg;

    (void) fd;
    (void) what;
    ric_log_error(RIC_LOG_WARN, 0, "worker_shutdown_timeout: closing %lld connections",
                  (long long) w->conns.n);
    event_base_loopbreak(w->base);
}

static void
on_log_timer(evutil_socket_t fd, short what, void *arg)
{
    ric_worker_t *w = arg;

    (void) fd;
    (void) what;
    ric_access_log_flush_due(w->conf, ric_now_ms(), 0);
}

/* With a buffered access log, a tick of half its flush= (at least 50 ms)
 * writes the lines that waited long enough. */
static void
log_timer_start(ric_worker_t *w)
{
    ric_access_log_t *a;
    int64_t every = 0;
    struct timeval tv;

    for (a = w->conf->http ? w->conf->http->access_logs : NULL; a; a = a->next) {
        if (a->buffer > 0 && (every == 0 || a->flush_ms / 2 < every)) {
            every = ric_max(a->flush_ms / 2, (int64_t) 50);
        }
    }
    if (every > 0) {
        w->log_timer = event_new(w->base, -1, EV_PERSIST, on_log_timer, w);
        tv = ric_ms_to_tv(every);
        event_add(w->log_timer, &tv);
    }
}

static void
on_signal(evutil_socket_t sig, short what, void *arg)
{
    ric_worker_t *w = arg;

    (void) what;
    switch (sig) {
    case SIGTERM:
    case SIGINT:
        event_base_loopbreak(w->base);
        break;
    case SIGQUIT:
        begin_graceful_shutdown(w);
        break;
    case SIGUSR1:
        ric_log_reopen();
        ric_access_log_reopen(w->conf);
        ric_log_error(RIC_LOG_NOTICE, 0, "worker reopened its log files");
        break;
    }
}

/* A connection set whose requests run the phases given (on this
 * worker's loop, upstreams and configuration). */
static void
requests_of(ric_worker_t *w, ric_conn_set_t *set, ric_pipeline_t *p, const ric_phase_t *phases,
            unsigned n)
{
    p->phases = phases;
    p->nphases = n;
    p->upstreams = w->upstreams;
    p->conf = w->conf;
    set->base = w->base;
    set->handler = &ric_request_conn_handler;
    set->handler_ctx = p;
    set->ctx = w;
}

int
ric_worker_run(ric_conf_t *conf)
{
    static const int sigs[] = { SIGTERM, SIGINT, SIGQUIT, SIGUSR1 };
    ric_worker_t *w = ric_xcalloc(1, sizeof(*w));
    ric_listener_t *ls;
    struct event_config *cfg;
    sigset_t blocked;
    size_t i, n = 0;

    ric_worker = w;
    w->conf = conf;
    /* what is process-wide is its generation's: the bounds of a hook call,
     * the dictionaries ricochet.shared names */
    ric_script_limits(conf);
    ric_shared_dict_declare(conf->http ? conf->http->shared_dicts : NULL);
    /* libevent's timers run on CLOCK_MONOTONIC_COARSE unless told: a
     * jiffy behind ours, a backoff, a Retry-After or the per-try timer
     * at the deadline rang up to a jiffy before its time by the clock
     * the rest of the gateway reads (a retry sent 2 ms before the
     * Retry-After it honours, an attempt cut just short of the deadline
     * and retried into what was left) */
    cfg = event_config_new();
    if (cfg != NULL) {
        event_config_set_flag(cfg, EVENT_BASE_FLAG_PRECISE_TIMER);
        w->base = event_base_new_with_config(cfg);
        event_config_free(cfg);
    }
    if (w->base == NULL) {
        ric_log_error(RIC_LOG_EMERG, 0, "event_base_new() failed");
        return 1;
    }
    for (ls = conf->listeners; ls; ls = ls->next) {
        n++;
    }
    w->accept_events = ric_xcalloc(n ? n : 1, sizeof(struct event *));
    for (ls = conf->listeners; ls; ls = ls->next) {
        if (ls->admin) {
            w->admin_event = event_new(w->base, ls->fd, EV_READ | EV_PERSIST, on_accept, ls);
            event_add(w->admin_event, NULL);
        } else {
            w->accept_events[w->naccept++] =
                event_new(w->base, ls->fd, EV_READ | EV_PERSIST, on_accept, ls);
        }
    }
    sigemptyset(&blocked);
    for (i = 0; i < ric_nelems(sigs); i++) {
        w->signals[i] = evsignal_new(w->base, sigs[i], on_signal, w);
        event_add(w->signals[i], NULL);
        sigaddset(&blocked, sigs[i]);
    }
    sigprocmask(SIG_UNBLOCK, &blocked, NULL); /* held since the fork (process.c) */
    w->shutdown_timer = evtimer_new(w->base, on_shutdown_timeout, w);
    w->upstreams = ric_upstream_init_all(conf, w->base);
    /* empty pipes kept for spliced bodies: one for every eighth connection
     * (two descriptors each, held only after that many were in use) */
    ric_pipe_keep(ric_max(32, conf->worker_connections / 8));
    requests_of(w, &w->conns, &w->pipeline, ric_pipeline_phases, ric_pipeline_nphases);
    w->conns.max = conf->worker_connections;
    w->conns.counted = 1; /* the admin listener's are not the gateway's */
    w->conns.room = accept_room;
    w->conns.emptied = all_closed;
    requests_of(w, &w->admin_conns, &w->admin_pipeline, ric_pipeline_admin_phases,
                ric_pipeline_admin_nphases);
    w->admin_conns.max = conf->worker_connections; /* a set of its own: the proxy's stay whole */
    w->admin_conns.room = admin_room;
    w->admin_conns.emptied = admin_emptied;
    if (conf->http != NULL) {
        /* after fork: LMDB environments and Redis connections are per process */
        ric_idem_store_open_all(conf->http->idem_stores, w->base);
    }
    log_timer_start(w);
    ric_watchdog_worker_loop(w->base); /* an idle loop turns too: idle is not stalled */
    accept_enable(w, 1);
    kill(getppid(), RIC_SIG_WORKER_READY); /* a reload waits for this before the old ones go */

    ric_clock_dispatch(w->base); /* the clock read once a turn */
    ric_watchdog_worker_end(); /* what exit takes is not a stall */

    /* a second stop signal (the master forwards what a terminal already
     * sent the whole group) must not kill us halfway through the cleanup */
    sigemptyset(&blocked);
    sigaddset(&blocked, SIGTERM);
    sigaddset(&blocked, SIGINT);
    sigaddset(&blocked, SIGQUIT);
    sigprocmask(SIG_BLOCK, &blocked, NULL);
    w->shutting_down = 1; /* closing the rest must not re-enable accepting */
    ric_conn_set_close_all(&w->conns);
    ric_conn_set_close_all(&w->admin_conns);
    if (w->admin_event != NULL) {
        event_free(w->admin_event);
        w->admin_event = NULL;
    }
    /* a store may run the loop a moment to land its last writes: nothing
     * else may start meanwhile */
    accept_enable(w, 0);
    event_del(w->shutdown_timer);
    if (conf->http != NULL) {
        ric_idem_store_close_all(conf->http->idem_stores);
    }
    ric_upstream_free_all(w->upstreams, conf->http ? conf->http->nupstreams : 0);
    for (i = 0; i < w->naccept; i++) {
        event_free(w->accept_events[i]);
    }
    for (i = 0; i < ric_nelems(sigs); i++) {
        event_free(w->signals[i]);
    }
    event_free(w->shutdown_timer);
    if (w->log_timer != NULL) {
        event_free(w->log_timer);
    }
    ric_access_log_free_buffers(conf); /* every buffered line is written before the exit */
    event_base_free(w->base);
    free(w->accept_events);
    free(w);
    ric_worker = NULL;
    return 0;
}
