/* upstream.h: a worker's view of an upstream: weighted round robin, passive health, idle connection pool. */
#ifndef RIC_UPSTREAM_H
#define RIC_UPSTREAM_H

#include "ric_core.h"
#include "budget.h"
#include "conf.h"
#include "http_parse.h"
#include "io.h"
#include "shm.h"

#include <event2/event.h>
#include <event2/event_struct.h>

typedef struct ric_upstream_s ric_upstream_t;
typedef struct ric_upconn_s ric_upconn_t;

/* The passive health of one server address, in the shared zone: every
 * worker counts into it and skips a server any worker marked down. */
typedef struct ric_peer_health_s {
    _Atomic int64_t fails;             /* failures since fail_window_start */
    _Atomic int64_t fail_window_start; /* ms */
    _Atomic int64_t down_until;        /* ms; 0: up */
} ric_peer_health_t;

/* One server address: its balancing state (this worker's) and its health
 * (everyone's). */
typedef struct {
    ric_upstream_server_t *conf;
    int64_t current_weight; /* smooth weighted round robin */
    ric_peer_health_t *health;
    void *tls_session; /* SSL_SESSION to resume with this server (https upstreams); this worker's */
} ric_peer_t;

/* A pooled connection idle for longer than this is checked with a
 * liveness peek before it carries a request. */
#define RIC_POOL_PEEK_AFTER_MS 1000

typedef void (*ric_upconn_handler_pt)(ric_upconn_t *uc, short what);

/* What is left of a response nobody wants, read off a connection before it
 * goes back to the pool (http1_client.c frames it; upstream_drain_max and
 * upstream_drain_timeout bound it). */
typedef struct {
    ric_http_chunked_t chunked; /* a chunked body's framing so far */
    int chunked_body;           /* 1: chunked; 0: a Content-Length body */
    uint64_t left;              /* Content-Length: its bytes still to come;
                                 * chunked: the bytes it may still take */
    int64_t until_ms;           /* past it the connection is closed */
} ric_upconn_drain_t;

/* A connection to an upstream server. Its read event stays registered for
 * the connection's whole life, in use and idle alike, so handing it between
 * the pool and a request costs no system call. */
struct ric_upconn_s {
    ric_io_t io;
    ric_peer_t *peer;
    ric_upstream_t *upstream;
    struct event rev; /* EV_READ | EV_PERSIST, always added */
    struct event wev; /* added only while a write waits */
    void *owner;      /* the request using it; NULL while idle in the pool */
    ric_upconn_handler_pt on_read;  /* owner's handlers */
    ric_upconn_handler_pt on_write;
    int64_t requests; /* carried so far */
    int64_t idle_since_ms;
    ric_link_t idle_link;      /* in the pool while idle, or among those draining */
    ric_upconn_drain_t drain;  /* while draining (owner is the connection itself) */
};

struct ric_upstream_s {
    ric_upstream_conf_t *conf;
    ric_peer_t *peers;
    int npeers;
    ric_list_t idle;    /* ric_upconn_t, most recently used first */
    int nidle;
    ric_list_t draining; /* ric_upconn_t being drained, on their way to idle (or closed) */
    struct event_base *base;
    ric_budget_t budget; /* its rule and its state in the shared zone */
    struct ric_hedge_state_s *hedge; /* retry_hedge auto's p95 (hedge.h), in the shared zone */
};

/* The master, before it forks: gives every upstream's budget and every
 * server's health an entry in zone ("budget:NAME", "peer:NAME:ADDR"),
 * fresh when new, kept when the name was there already; and the p95 of its
 * response times ("hedge:NAME", hedge.h). RIC_ERROR with
 * err set when the zone is full. */
int ric_upstream_share(ric_conf_t *conf, ric_shm_t *zone, char *err, size_t errlen);

/* The zone size that holds conf's shared state, with room to spare. */
size_t ric_upstream_zone_size(const ric_conf_t *conf);

/* Builds the runtime state of every upstream of conf for this worker; the
 * array is indexed by ric_upstream_conf_t.index. An unshared conf (tests)
 * gets a zone of its own. Never fails (aborts on OOM). */
ric_upstream_t *ric_upstream_init_all(ric_conf_t *conf, struct event_base *base);

/* Closes idle connections and frees the array. */
void ric_upstream_free_all(ric_upstream_t *ups, int n);

/* Picks the next server by smooth weighted round robin among those not
 * marked down, avoiding `avoid` when another is up. When every server is
 * down, the one that comes back soonest. Never NULL. */
ric_peer_t *ric_upstream_pick(ric_upstream_t *u, const ric_peer_t *avoid, int64_t now_ms);

/* Passive health: a failed (connect error, timeout, bad response) or good
 * exchange with p. max_fails failures within fail_timeout mark it down for
 * fail_timeout (nginx semantics); an upstream of one server is never down. */
void ric_upstream_report(ric_upstream_t *u, ric_peer_t *p, int failed, int64_t now_ms);

/* Takes an idle connection to p from the pool, checking that the upstream
 * has not closed it meanwhile; NULL when none is usable. careful: check
 * with a system call even a connection pooled a moment ago (for requests
 * that cannot be retried if it fails). */
ric_upconn_t *ric_upstream_pool_get(ric_upstream_t *u, ric_peer_t *p, int careful);

/* Starts a non-blocking connect to p. Returns the connection (its write
 * event tells when the connect completes: check ric_upconn_connect_result),
 * or NULL with errno set when the connect failed at once. */
ric_upconn_t *ric_upconn_connect(ric_upstream_t *u, ric_peer_t *p);

/* After the write event of a connect: 0, or the socket error (errno value). */
int ric_upconn_connect_result(ric_upconn_t *uc);

/* Gives uc to owner: its events now call on_read / on_write (what is
 * libevent's flags), with the read timeout given (ms, 0: none). */
void ric_upconn_own(ric_upconn_t *uc, void *owner, ric_upconn_handler_pt on_read,
                    ric_upconn_handler_pt on_write);

/* Sets the read timeout of uc in ms (0: none) without touching epoll. */
void ric_upconn_read_timeout(ric_upconn_t *uc, int64_t ms);

/* Stops (0) or resumes (1) reading from uc: backpressure from a slow client. */
void ric_upconn_reading(ric_upconn_t *uc, int on, int64_t timeout_ms);

/* Waits for uc to be writable, for at most ms. */
void ric_upconn_want_write(ric_upconn_t *uc, int64_t ms);

/* Returns uc to the pool (the response was read whole and the upstream
 * allows keep-alive), or closes it when the pool is full or keepalive 0. */
void ric_upstream_pool_put(ric_upconn_t *uc);

/* uc is being drained (its owner is now uc itself, its handler
 * http1_client.c's): held here until ric_upstream_drain_end, so that the
 * upstream's end closes it too. */
void ric_upstream_drain_begin(ric_upconn_t *uc);

/* The drain of uc ended: whole, it goes back to the pool (as
 * ric_upstream_pool_put); else it is closed. */
void ric_upstream_drain_end(ric_upconn_t *uc, int whole);

/* Closes uc and frees it. */
void ric_upconn_close(ric_upconn_t *uc);

#endif /* RIC_UPSTREAM_H */
