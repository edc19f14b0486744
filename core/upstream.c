/* upstream.c: server selection (smooth weighted round robin), passive health and the keep-alive pool. */
#include "upstream.h"
#include "log.h"
#include "tls.h"
#include "hedge.h"

#include <errno.h>
#include <stdio.h>

#define LOAD(p) atomic_load_explicit((p), memory_order_relaxed)
#define STORE(p, v) atomic_store_explicit((p), (v), memory_order_relaxed)

/* Connection objects are reused, so a new upstream connection allocates
 * nothing once the worker is warm. */
static ric_list_t free_conns; /* closed connections, kept for the next connect */

/* A zone made for an unshared conf (a test calling init_all directly). */
static ric_shm_t *private_zone;

size_t
ric_upstream_zone_size(const ric_conf_t *conf)
{
    size_t n = 0;
    const ric_upstream_conf_t *u;

    for (u = conf->http ? conf->http->upstreams : NULL; u; u = u->next) {
        n += 1 + (size_t) u->nservers;
    }
    /* an entry is a few hundred bytes; the rest is room for reloads and
     * counters (untouched pages cost nothing) */
    return ((size_t) 1 << 20) + n * 1024;
}

int
ric_upstream_share(ric_conf_t *conf, ric_shm_t *zone, char *err, size_t errlen)
{
    ric_upstream_conf_t *u;
    ric_upstream_server_t *s, *t;
    char name[512];
    int created, dup;

    for (u = conf->http ? conf->http->upstreams : NULL; u; u = u->next) {
        /* named by its rule too: a reload that changes the rule starts it
         * fresh, one that keeps it keeps its tokens */
        snprintf(name, sizeof(name), "budget:%s:%d:%lld:%lld:%g:%lld", u->name,
                 (int) u->budget->kind, (long long) u->budget->max_tokens,
                 (long long) u->budget->wait_ms, u->budget->ratio,
                 (long long) u->budget->min_per_sec);
        u->budget_state = ric_shm_entry(zone, name, sizeof(ric_budget_state_t), &created);
        if (u->budget_state == NULL) {
            goto full;
        }
        if (created) {
            ric_budget_reset(u->budget_state, u->budget);
        }
        snprintf(name, sizeof(name), "hedge:%s", u->name);
        u->hedge_state = ric_shm_entry(zone, name, sizeof(ric_hedge_state_t), &created);
        if (u->hedge_state == NULL) {
            goto full;
        }
        for (s = u->servers; s; s = s->next) {
            /* the same address listed twice is two servers */
            for (dup = 0, t = u->servers; t != s; t = t->next) {
                dup += strcmp(t->addr_text, s->addr_text) == 0;
            }
            snprintf(name, sizeof(name), dup ? "peer:%s:%s#%d" : "peer:%s:%s", u->name,
                     s->addr_text, dup + 1);
            s->health = ric_shm_entry(zone, name, sizeof(ric_peer_health_t), &created);
            if (s->health == NULL) {
                goto full;
            }
        }
    }
    return RIC_OK;

full:
    snprintf(err, errlen, "the shared memory zone (%zu bytes) cannot hold \"%s\" (what removed "
             "upstreams and changed budget rules held is kept until a restart)",
             ric_shm_size(zone), name);
    return RIC_ERROR;
}

ric_upstream_t *
ric_upstream_init_all(ric_conf_t *conf, struct event_base *base)
{
    ric_upstream_t *ups;
    ric_upstream_conf_t *uc;
    ric_upstream_server_t *s;
    char err[256];
    int i;

    if (conf->http == NULL || conf->http->nupstreams == 0) {
        return NULL;
    }
    if (conf->http->upstreams->budget_state == NULL) {
        ric_shm_destroy(private_zone);
        private_zone = ric_shm_create(ric_upstream_zone_size(conf));
        if (private_zone == NULL || ric_upstream_share(conf, private_zone, err, sizeof(err))
                                        != RIC_OK) {
            ric_assert(!"cannot make a private zone for the upstreams");
        }
    }
    ups = ric_xcalloc((size_t) conf->http->nupstreams, sizeof(*ups));
    for (uc = conf->http->upstreams; uc; uc = uc->next) {
        ric_upstream_t *u = &ups[uc->index];
        u->conf = uc;
        u->base = base;
        u->budget.conf = uc->budget;
        u->budget.st = uc->budget_state;
        u->hedge = uc->hedge_state;
        u->peers = ric_xcalloc((size_t) uc->nservers, sizeof(ric_peer_t));
        for (i = 0, s = uc->servers; s && i < uc->nservers; s = s->next, i++) {
            u->peers[i].conf = s;
            u->peers[i].health = s->health;
        }
        u->npeers = i;
    }
    return ups;
}

static void
idle_unlink(ric_upconn_t *c)
{
    ric_upstream_t *u = c->upstream;

    ric_list_remove(&u->idle, &c->idle_link);
    u->nidle--;
}

void
ric_upconn_close(ric_upconn_t *c)
{
    event_del(&c->rev);
    event_del(&c->wev);
    ric_io_close(&c->io);
    c->owner = NULL;
    ric_list_push_front(&free_conns, &c->idle_link); /* kept for the next connect */
}

void
ric_upstream_free_all(ric_upstream_t *ups, int n)
{
    ric_upconn_t *c;
    int i, j;

    for (i = 0; i < n && ups; i++) {
        while ((c = ric_list_first(&ups[i].idle, ric_upconn_t, idle_link)) != NULL) {
            idle_unlink(c);
            ric_upconn_close(c);
        }
        while ((c = ric_list_first(&ups[i].draining, ric_upconn_t, idle_link)) != NULL) {
            ric_upstream_drain_end(c, 0);
        }
        for (j = 0; j < ups[i].npeers; j++) {
            ric_tls_session_free(ups[i].peers[j].tls_session);
        }
        free(ups[i].peers);
    }
    free(ups);
    while ((c = ric_list_first(&free_conns, ric_upconn_t, idle_link)) != NULL) {
        ric_list_remove(&free_conns, &c->idle_link);
        free(c);
    }
}

static int64_t
down_until(const ric_peer_t *p)
{
    return LOAD(&p->health->down_until);
}

static int
peer_up(const ric_peer_t *p, int64_t now)
{
    return down_until(p) <= now;
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
        if (soonest == NULL || down_until(&u->peers[i]) < down_until(soonest)) {
            soonest = &u->peers[i];
        }
    }
    return soonest;
}

/* Several workers may report on one server at once. Each step is one
 * atomic operation; racing reports can at worst make a count start over a
 * moment late or take the server down once more than needed: the same
 * decisions nginx makes per worker, agreed by all of them. */
void
ric_upstream_report(ric_upstream_t *u, ric_peer_t *p, int failed, int64_t now)
{
    const ric_upstream_server_t *s = p->conf;
    ric_peer_health_t *h = p->health;
    int64_t fails, prev;

    if (!failed) {
        /* an answer proves it up: the count starts over, as in nginx */
        if (LOAD(&h->fails) != 0) {
            STORE(&h->fails, 0);
        }
        return;
    }
    if (s->max_fails == 0 || u->npeers == 1) {
        return;
    }
    fails = LOAD(&h->fails);
    if (fails > 0 && fails < s->max_fails
        && now - LOAD(&h->fail_window_start) >= s->fail_timeout) {
        /* earlier failures are too old to add up */
        if (atomic_compare_exchange_strong(&h->fails, &fails, 0)) {
            fails = 0;
        }
    }
    if (fails == 0) {
        STORE(&h->fail_window_start, now);
    }
    /* the count is not reset when the server goes down: after fail_timeout
     * one failed trial takes it down again, as in nginx */
    fails = atomic_fetch_add(&h->fails, 1) + 1;
    if (fails >= s->max_fails) {
        prev = atomic_exchange(&h->down_until, now + s->fail_timeout);
        if (prev <= now) { /* this report took it down: log it once */
            ric_log_error(RIC_LOG_WARN, 0, "upstream server %s of \"%s\" marked down for %lldms "
                          "after %lld failures", s->addr_text, u->conf->name,
                          (long long) s->fail_timeout, (long long) fails);
        }
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
    if ((c = ric_list_first(&free_conns, ric_upconn_t, idle_link)) != NULL) {
        ric_list_remove(&free_conns, &c->idle_link);
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

    ric_io_arm(&c->io, &c->rev, ms > 0 ? &tv : NULL);
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

    ric_io_arm(&c->io, &c->wev, ms > 0 ? &tv : NULL);
}

ric_upconn_t *
ric_upstream_pool_get(ric_upstream_t *u, ric_peer_t *p, int careful)
{
    ric_upconn_t *c;
    ric_link_t *l, *next;
    int64_t now = ric_now_ms();

    for (l = u->idle.head; l; l = next) {
        next = l->next;
        c = ric_list_entry(l, ric_upconn_t, idle_link);
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
        old = ric_list_entry(u->idle.tail, ric_upconn_t, idle_link);
        idle_unlink(old);
        ric_upconn_close(old);
    }
    c->owner = NULL;
    ric_list_push_front(&u->idle, &c->idle_link);
    u->nidle++;
    c->idle_since_ms = ric_now_ms();
    ric_upconn_read_timeout(c, u->conf->keepalive_timeout);
}

void
ric_upstream_drain_begin(ric_upconn_t *c)
{
    ric_list_push_front(&c->upstream->draining, &c->idle_link);
}

void
ric_upstream_drain_end(ric_upconn_t *c, int whole)
{
    ric_list_remove(&c->upstream->draining, &c->idle_link);
    if (whole) {
        c->requests++;
        ric_upstream_pool_put(c);
    } else {
        ric_upconn_close(c);
    }
}
