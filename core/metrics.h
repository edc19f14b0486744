/* metrics.h: what every worker counts in the shared zone, by route, upstream and server; summed over the workers when read (/metrics, the status page). */
#ifndef RIC_METRICS_H
#define RIC_METRICS_H

#include "ric_core.h"

#include <stdatomic.h>
#include "conf.h"

/*
 * Every counter is the instance's: it lives in the shared zone the master
 * maps before the first fork, so a worker's replacement and a reload (when
 * the route, the upstream or the server keeps its name) carry it on. A
 * worker adds to its own shard (its place among its generation's workers,
 * modulo RIC_METRIC_SHARDS) with relaxed atomics: two workers never write
 * one cache line, and nothing is locked. A reader sums the shards.
 *
 * Histograms have fixed buckets (RIC_HIST_LE_US, upper bounds in
 * microseconds, then +Inf), kept per bucket (not cumulative) with the
 * sum of the observations.
 */
#define RIC_METRIC_SHARDS 8
#define RIC_HIST_BUCKETS 14 /* 13 bounds and +Inf */
#define RIC_METRIC_CODES 600 /* statuses 100..599 by number; [0]: any other */
#define RIC_STATUS_SAMPLES 300 /* the status page's history: one a second, five minutes */

extern const int64_t ric_hist_le_us[RIC_HIST_BUCKETS - 1];

typedef struct {
    uint64_t n[RIC_HIST_BUCKETS];
    uint64_t sum_us;
} ric_hist_t;

/* What an attempt met (ricochet_attempts_total's class; a retry's reason). */
typedef enum {
    RIC_MC_OK = 0,        /* a status below 400 */
    RIC_MC_4XX,           /* 4xx but 429 */
    RIC_MC_429,
    RIC_MC_5XX,
    RIC_MC_CONNECT_ERROR, /* refused, unreachable, connect timeout */
    RIC_MC_TLS_ERROR,     /* the TLS handshake with the upstream failed */
    RIC_MC_RESET,
    RIC_MC_TIMEOUT,
    RIC_MC_BAD_RESPONSE,
    RIC_MC_CUT,           /* ended by the gateway: the client left, the worker stopped */
    RIC_MC_CLIENT_BODY,   /* ended because the client's body broke */
    RIC_MC_CANCELLED,     /* the other attempt of a hedged pair answered first */
    RIC_MC_MAX
} ric_mclass_t;

/* Why a retry that the outcome asked for was not made
 * (ricochet_retry_refused_total's why): the retry reasons (retry.h) that
 * refuse, and two of the gateway's own. */
#define RIC_MR_SCRIPT 12      /* the route script called a retryable outcome final */
#define RIC_MR_KILL_SWITCH 13 /* RICOCHET_NO_RETRY=1 */
#define RIC_MR_MAX 14

#define RIC_MI_MAX 9 /* idempotency outcomes: ric_idem_count_t (idem_store.h) */

/* How a hedge (retry_hedge) ended (ricochet_hedges_total's outcome). */
enum { RIC_MH_WON = 0,  /* its answer was passed on */
       RIC_MH_LOST,     /* cancelled: the first attempt answered first (or the request ended) */
       RIC_MH_FAILED,   /* it failed itself (a status in retry_on, an error, a timeout) */
       RIC_MH_REFUSED,  /* not sent: the retry budget could not pay for it */
       RIC_MH_MAX };

/* The TLS handshakes of a server's clients. */
enum { RIC_TLS_OK = 0, RIC_TLS_FAILED, RIC_TLS_TIMEOUT, RIC_TLS_RESULTS };

/* One worker's counts of one route (a location; or a server's requests
 * that matched none). Cache-line aligned: shards never share a line. */
typedef struct {
    uint64_t requests[RIC_METRIC_CODES]; /* by the status the client got */
    ric_hist_t duration;                 /* of the whole request */
    ric_hist_t retry_wait;               /* the wait before each retry */
    uint64_t attempts[RIC_MC_MAX];
    uint64_t retries[RIC_MC_MAX];        /* by what the attempt before met */
    uint64_t refused[RIC_MR_MAX];
    uint64_t idem[RIC_MI_MAX];
    uint64_t hedges[RIC_MH_MAX];
    uint64_t tls[RIC_TLS_RESULTS];       /* a server's entry only */
} __attribute__((aligned(64))) ric_route_shard_t;

/* One worker's counts of one upstream. */
typedef struct {
    uint64_t attempts[RIC_MC_MAX];
    uint64_t retries;
    uint64_t hedges;     /* attempts that were hedges (neither a request's first nor a retry) */
    ric_hist_t response; /* attempts that got a response head: until its end */
} __attribute__((aligned(64))) ric_upstream_shard_t;

/* One second of a route's or an upstream's history, as the master sampled
 * it (every figure is the running total then; tokens and up are gauges). */
typedef struct {
    uint64_t seq;        /* 1 + the sample's number: a point of another sample is stale */
    uint64_t requests, errors, retries, attempts, refused, waits, script_errors;
    int64_t tokens_milli;
    uint64_t up_mask;    /* bit i: the upstream's server i is up (first 64) */
    uint64_t idem[RIC_MI_MAX];
    uint64_t hist[RIC_HIST_BUCKETS];
} ric_status_point_t;

struct ric_route_metrics_s {
    ric_route_shard_t shard[RIC_METRIC_SHARDS];
    ric_status_point_t ring[RIC_STATUS_SAMPLES]; /* written by the master */
};

struct ric_upstream_metrics_s {
    ric_upstream_shard_t shard[RIC_METRIC_SHARDS];
    ric_status_point_t ring[RIC_STATUS_SAMPLES];
};

/* Client connections by state (ricochet_connections). */
enum { RIC_CS_HANDSHAKE = 0, RIC_CS_READING, RIC_CS_ACTIVE, RIC_CS_IDLE, RIC_CS_CLOSING,
       RIC_CS_MAX };

#define RIC_METRIC_WORKERS 2048 /* two generations of worker_processes' most, overlapping */

/* A worker's place in the zone: its pid (0: free) and its gauges. */
typedef struct {
    _Atomic int64_t pid;
    _Atomic int64_t conns[RIC_CS_MAX];
} __attribute__((aligned(64))) ric_worker_gauges_t;

/* The instance: what the master says of itself. */
typedef struct {
    _Atomic int64_t master_pid;
    _Atomic int64_t started_ms;   /* wall clock */
    _Atomic int64_t generation;   /* configurations loaded: 1, and one per reload */
    _Atomic int64_t stopping;     /* 1: it is shutting down (readyz says 503) */
    _Atomic int64_t handed_over;  /* 1: a new binary's instance serves (and answers the admin address) */
    _Atomic int64_t seq;          /* status samples written; the last is seq - 1 */
    int64_t sample_ms[RIC_STATUS_SAMPLES]; /* wall clock of each sample */
    ric_worker_gauges_t workers[RIC_METRIC_WORKERS];
} ric_instance_t;

/* This process's shard (a worker's, set before it runs), its
 * configuration's generation, and its gauges. */
extern int ric_metrics_shard;
extern int64_t ric_metrics_generation;
extern ric_worker_gauges_t *ric_metrics_gauges;
/* The instance entry of the zone this process maps (NULL: none, tests). */
extern ric_instance_t *ric_metrics_instance;

/* Whether this worker, stopping, is the last to answer on the admin
 * address: its instance is shutting down (no other generation or binary
 * serves in its place), so /readyz must still say so. */
int ric_metrics_admin_stays(void);

/* The master, with a generation: every server, location and upstream of
 * conf gets its entry ("metrics:route:NAME", "metrics:upstream:NAME"), and
 * its label. RIC_ERROR with err set when the zone is full. */
struct ric_shm_s;
int ric_metrics_share(ric_conf_t *conf, struct ric_shm_s *zone, char *err, size_t errlen);

/* The room conf's entries take. */
size_t ric_metrics_zone_size(const ric_conf_t *conf);

/* A worker (its place among its generation's workers, the generation)
 * takes / the master frees a place among the instance's workers. */
void ric_metrics_worker_begin(int index, int64_t generation);
void ric_metrics_worker_gone(int64_t pid);

/* --- counting (any worker, on the request path) --------------------------- */

static inline void
ric_metric_add(uint64_t *p, uint64_t n)
{
    __atomic_fetch_add(p, n, __ATOMIC_RELAXED);
}

void ric_hist_observe(ric_hist_t *h, int64_t us);

static inline ric_route_shard_t *
ric_metrics_route(ric_route_metrics_t *m)
{
    return m != NULL ? &m->shard[ric_metrics_shard] : NULL;
}

/* A request ended with status after duration_us. */
void ric_metrics_request(ric_route_metrics_t *m, int status, int64_t duration_us);

/* An attempt ended, having met class (its response, when it had one, took
 * response_us); retry_of: what the attempt before it met, or -1 for a
 * first attempt; wait_us: the wait before it. */
void ric_metrics_attempt(ric_route_metrics_t *rm, ric_upstream_metrics_t *um, ric_mclass_t cls,
                         int64_t response_us, int retry_of, int64_t wait_us);

/* A hedge ended (or was refused): outcome is RIC_MH_*. */
void ric_metrics_hedge(ric_route_metrics_t *rm, ric_upstream_metrics_t *um, int outcome);

/* What an attempt met, from its retry class (retry.h) and status; tls: a
 * connect error in the TLS handshake. */
ric_mclass_t ric_metrics_class(unsigned class, int status, int tls);

/* A connection's state changed (from -1: it opened; to -1: it closed). */
static inline void
ric_metrics_conn_state(int from, int to)
{
    if (ric_metrics_gauges == NULL) {
        return;
    }
    if (from >= 0) {
        atomic_fetch_sub_explicit(&ric_metrics_gauges->conns[from], 1, memory_order_relaxed);
    }
    if (to >= 0) {
        atomic_fetch_add_explicit(&ric_metrics_gauges->conns[to], 1, memory_order_relaxed);
    }
}

/* --- reading -------------------------------------------------------------- */

/* The shards of m summed into out. */
void ric_metrics_route_sum(const ric_route_metrics_t *m, ric_route_shard_t *out);
void ric_metrics_upstream_sum(const ric_upstream_metrics_t *m, ric_upstream_shard_t *out);

/* Names, as the metrics' labels say them. */
const char *ric_metrics_class_name(ric_mclass_t c);
const char *ric_metrics_refusal_name(int why);
const char *ric_metrics_idem_name(int what);
const char *ric_metrics_hedge_name(int outcome);
const char *ric_metrics_tls_name(int result);
const char *ric_metrics_conn_state_name(int state);

/* The n-th quantile (0..1) of histogram counts, in microseconds,
 * interpolated within its bucket as Prometheus's histogram_quantile does;
 * -1 with no observation. */
int64_t ric_hist_quantile(const uint64_t *n, double q);

#endif /* RIC_METRICS_H */
