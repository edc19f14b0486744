/* upstream.c: server selection (smooth weighted round robin), passive health and the keep-alive pool. */
#include "upstream.h"
#include "log.h"

#include <errno.h>

/* Connection objects are reused, so a new upstream connection allocates
 * nothing once the worker is warm. */
static ric_upconn_t *free_conns;

ric_upstream_t *
ric_upstream_init_all(ric_conf_t *conf, struct event_base *base)
{
    ric_upstream_t *ups;
    ric_upstream_conf_t *uc;
    ric_upstream_server_t *s;
    int i;

    if (conf->http == NULL || conf->http->nupstreams == 0) {
        return NULL;
    }
    ups = ric_xcalloc((size_t) conf->http->nupstreams, sizeof(*ups));
    for (uc = conf->http->upstreams; uc; uc = uc->next) {
        ric_upstream_t *u = &ups[uc->index];
        u->conf = uc;
        u->base = base;
        ric_budget_init(&u->budget, 0.2, 10);
        u->peers = ric_xcalloc((size_t) uc->nservers, sizeof(ric_peer_t));
        for (i = 0, s = uc->servers; s && i < uc->nservers; s = s->next, i++) {
            u->peers[i].conf = s;
        }
        u->npeers = i;
    }
    return ups;
}

static void
idle_unlink(ric_upconn_t *c)
{
    ric_upstream_t *u = c->upstream;

    if (c->prev) {
        c->prev->next = c->next;
    } else {
        u->idle = c->next;
    }
    if (c->next) {
        c->next->prev = c->prev;
    } else {
        u->idle_tail = c->prev;
    }
    c->prev = c->next = NULL;
    u->nidle--;
}

void
ric_upconn_close(ric_upconn_t *c)
{
    event_del(&c->rev);
    event_del(&c->wev);
    ric_io_close(&c->io);
    c->owner = NULL;
    c->next = free_conns;
    free_conns = c;
}

void
ric_upstream_free_all(ric_upstream_t *ups, int n)
{
    ric_upconn_t *c;
    int i;

    for (i = 0; i < n && ups; i++) {
        while ((c = ups[i].idle) != NULL) {
            idle_unlink(c);
            ric_upconn_close(c);
        }
        free(ups[i].peers);
    }
    free(ups);
    while ((c = free_conns) != NULL) {
        free_conns = c->next;
        free(c);
    }
}

static int
peer_up(const ric_peer_t *p, int64_t now)
{
    return p->down_until <= now;
}

ric_peer_t *
ric_upstream_pick(ric_upstream_t *u, const ric_peer_t *avoid, int64_t now)
{
    ric_peer_t *best = NULL, *soonest = NULL;
    int64_t total = 0;
    int i, pass;

    if (u->npeers == 1) {
        return &u->peers[0];
    }
    /* first among the up servers other than `avoid`, then among all up ones */
    for (pass = 0; pass < 2 && best == NULL; pass++) {
        total = 0;
        for (i = 0; i < u->npeers; i++) {
            ric_peer_t *p = &u->peers[i];
            if (!peer_up(p, now) || (pass == 0 && p == avoid)) {
                continue;
            }
            p->current_weight += p->conf->weight;
            total += p->conf->weight;
            if (best == NULL || p->current_weight > best->current_weight) {
                best = p;
            }
        }
    }
    if (best != NULL) {
        best->current_weight -= total;
        return best;
    }
    for (i = 0; i < u->npeers; i++) {
        if (soonest == NULL || u->peers[i].down_until < soonest->down_until) {
            soonest = &u->peers[i];
        }
    }
    return soonest;
}

void
ric_upstream_report(ric_upstream_t *u, ric_peer_t *p, int failed, int64_t now)
{
    const ric_upstream_server_t *s = p->conf;

    if (!failed) {
        /* an answer proves it up: the count starts over, as in nginx */
        p->fails = 0;
        return;
    }
    if (s->max_fails == 0 || u->npeers == 1) {
        return;
    }
    if (p->fails > 0 && p->fails < s->max_fails && now - p->fail_window_start >= s->fail_timeout) {
        p->fails = 0; /* earlier failures are too old to add up */
    }
    if (p->fails == 0) {
        p->fail_window_start = now;
    }
    /* the count is not reset when the server goes down: after fail_timeout
     * one failed trial takes it down again, as in nginx */
    if (++p->fails >= s->max_fails) {
        p->down_until = now + s->fail_timeout;
        ric_log_error(RIC_LOG_WARN, 0, "upstream server %s of \"%s\" marked down for %lldms "
                      "after %d failures", s->addr_text, u->conf->name,
                      (long long) s->fail_timeout, p->fails);
    }
}

/* An idle connection that becomes readable was closed by the upstream (or
 * got bytes nobody asked for): either way it can carry no request. */
static void
on_idle(ric_upconn_t *c, short what)
{
    if (!(what & EV_TIMEOUT) && ric_io_alive(&c->io)) {
        return;
    }
    idle_unlink(c);
    ric_upconn_close(c);
}

static void
on_read_event(evutil_socket_t fd, short what, void *arg)
{
    ric_upconn_t *c = arg;

    (void) fd;
    if (c->owner == NULL) {
        on_idle(c, what);
    } else {
        c->on_read(c, what);
    }
}

static void
on_write_event(evutil_socket_t fd, short what, void *arg)
{
    ric_upconn_t *c = arg;

    (void) fd;
    if (c->owner != NULL && c->on_write != NULL) {
        c->on_write(c, what);
    }
}

ric_upconn_t *
ric_upconn_connect(ric_upstream_t *u, ric_peer_t *p)
{
    ric_upconn_t *c;
    ric_io_t io;

    if (ric_io_connect(&io, (struct sockaddr *) &p->conf->addr, p->conf->addrlen) != RIC_OK) {
        return NULL;
    }
    if (free_conns != NULL) {
        c = free_conns;
        free_conns = c->next;
    } else {
        c = ric_xmalloc(sizeof(*c));
    }
    memset(c, 0, sizeof(*c));
    c->io = io;
    c->peer = p;
    c->upstream = u;
    event_assign(&c->rev, u->base, io.fd, EV_READ | EV_PERSIST, on_read_event, c);
    event_assign(&c->wev, u->base, io.fd, EV_WRITE, on_write_event, c);
    return c;
}

int
ric_upconn_connect_result(ric_upconn_t *c)
{
    return ric_io_connect_error(&c->io);
}

void
ric_upconn_own(ric_upconn_t *c, void *owner, ric_upconn_handler_pt on_read,
               ric_upconn_handler_pt on_write)
{
    c->owner = owner;
    c->on_read = on_read;
    c->on_write = on_write;
}

void
ric_upconn_read_timeout(ric_upconn_t *c, int64_t ms)
{
    struct timeval tv = ric_ms_to_tv(ms);

    /* re-adding an added event only moves its timer: no epoll_ctl; with
     * no time it would keep the old timer, which must go */
    if (ms > 0) {
        event_add(&c->rev, &tv);
    } else {
        event_add(&c->rev, NULL);
        event_remove_timer(&c->rev);
    }
}

void
ric_upconn_reading(ric_upconn_t *c, int on, int64_t timeout_ms)
{
    if (on) {
        ric_upconn_read_timeout(c, timeout_ms);
    } else {
        event_del(&c->rev);
    }
}

void
ric_upconn_want_write(ric_upconn_t *c, int64_t ms)
{
    struct timeval tv = ric_ms_to_tv(ms);

    if (ms > 0) {
        event_add(&c->wev, &tv);
    } else {
        event_add(&c->wev, NULL);
        event_remove_timer(&c->wev);
    }
}

ric_upconn_t *
ric_upstream_pool_get(ric_upstream_t *u, ric_peer_t *p, int careful)
{
    ric_upconn_t *c, *next;
    int64_t now = ric_now_ms();

    for (c = u->idle; c; c = next) {
        next = c->next;
        if (c->peer != p) {
            continue;
        }
        idle_unlink(c);
        if (!careful && now - c->idle_since_ms < RIC_POOL_PEEK_AFTER_MS) {
            /* servers close idle connections after seconds, not at once
             * (and say so when they close after a response); a connection
             * put back this recently needs no system call to trust */
            return c;
        }
        /* the close may have arrived after the loop last looked */
        if (ric_io_alive(&c->io)) {
            return c;
        }
        ric_upconn_close(c);
    }
    return NULL;
}

void
ric_upstream_pool_put(ric_upconn_t *c)
{
    ric_upstream_t *u = c->upstream;
    ric_upconn_t *old;

    event_del(&c->wev);
    if (u->conf->keepalive <= 0) {
        ric_upconn_close(c);
        return;
    }
    if (u->nidle >= u->conf->keepalive) {
        /* full: the least recently used goes */
        old = u->idle_tail;
        idle_unlink(old);
        ric_upconn_close(old);
    }
    c->owner = NULL;
    c->prev = NULL;
    c->next = u->idle;
    if (u->idle) {
        u->idle->prev = c;
    } else {
        u->idle_tail = c;
    }
    u->idle = c;
    u->nidle++;
    c->idle_since_ms = ric_now_ms();
    ric_upconn_read_timeout(c, u->conf->keepalive_timeout);
}
