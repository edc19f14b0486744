/* metrics.c: the counters' entries in the shared zone, counting into this worker's shard, and summing the shards. */
#include "metrics.h"
#include "pool.h"
#include "retry.h"
#include "shm.h"

#include <stdio.h>
#include <unistd.h>

const int64_t ric_hist_le_us[RIC_HIST_BUCKETS - 1] = {
    1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 500000, 1000000, 2500000, 5000000,
    10000000
};

int ric_metrics_shard;
int64_t ric_metrics_generation;
ric_worker_gauges_t *ric_metrics_gauges;
ric_instance_t *ric_metrics_instance;

/* --- entries ---------------------------------------------------------------- */

/* A server's label: its first name, else its first address; a second
 * server with the same one gets "#N" (its place in the file) after it. */
static char *
server_label(ric_conf_t *conf, ric_server_conf_t *s, int nth)
{
    const char *base = s->nnames > 0 && s->names[0][0] != '\0' ? s->names[0]
                       : s->listens ? s->listens->text : "_";
    ric_server_conf_t *o;
    ric_buf_t b = { 0 };
    char *label;

    ric_buf_puts(&b, base);
    for (o = conf->http->servers; o != s; o = o->next) {
        if (strcmp(o->label, base) == 0) {
            ric_buf_printf(&b, "#%d", nth);
            break;
        }
    }
    label = ric_pstrndup(conf->pool, (const char *) b.data, b.len);
    ric_buf_free(&b);
    return label;
}

static void *
entry(ric_shm_t *zone, const char *kind, const char *label, size_t size, char *err,
      size_t errlen)
{
    ric_buf_t name = { 0 };
    int created;
    void *p;

    ric_buf_printf(&name, "metrics:%s:%s", kind, label);
    p = ric_shm_entry(zone, (const char *) name.data, size, &created);
    ric_buf_free(&name);
    if (p == NULL) {
        snprintf(err, errlen, "the shared memory zone has no room for the metrics of %s \"%.200s\"",
                 kind, label);
    }
    return p;
}

int
ric_metrics_share(ric_conf_t *conf, ric_shm_t *zone, char *err, size_t errlen)
{
    ric_server_conf_t *s;
    ric_location_conf_t *l;
    ric_upstream_conf_t *u;
    ric_instance_t *in;
    ric_buf_t b = { 0 };
    int created, nth = 0, rc = RIC_OK;

    in = ric_shm_entry(zone, "metrics:instance", sizeof(*in), &created);
    if (in == NULL) {
        snprintf(err, errlen, "the shared memory zone has no room for the instance's metrics");
        return RIC_ERROR;
    }
    if (created) {
        in->master_pid = getpid();
        in->started_ms = ric_wall_ms();
        in->generation = 0;
    }
    ric_metrics_instance = in;
    if (conf->http == NULL) {
        return RIC_OK;
    }
    for (s = conf->http->servers; s && rc == RIC_OK; s = s->next) {
        s->label = server_label(conf, s, ++nth);
        s->metrics = entry(zone, "server", s->label, sizeof(ric_route_metrics_t), err, errlen);
        rc = s->metrics != NULL ? RIC_OK : RIC_ERROR;
        for (l = s->locations; l && rc == RIC_OK; l = l->next) {
            b.len = 0;
            ric_buf_printf(&b, "%s %s%s", s->label, l->exact ? "= " : "", l->path);
            l->label = ric_pstrndup(conf->pool, (const char *) b.data, b.len);
            l->metrics = entry(zone, "route", l->label, sizeof(ric_route_metrics_t), err, errlen);
            rc = l->metrics != NULL ? RIC_OK : RIC_ERROR;
        }
    }
    for (u = conf->http->upstreams; u && rc == RIC_OK; u = u->next) {
        u->metrics = entry(zone, "upstream", u->name, sizeof(ric_upstream_metrics_t), err,
                           errlen);
        rc = u->metrics != NULL ? RIC_OK : RIC_ERROR;
    }
    ric_buf_free(&b);
    return rc;
}

size_t
ric_metrics_zone_size(const ric_conf_t *conf)
{
    const ric_server_conf_t *s;
    const ric_location_conf_t *l;
    size_t n = sizeof(ric_instance_t) + 4096;

    if (conf->http == NULL) {
        return n;
    }
    for (s = conf->http->servers; s; s = s->next) {
        n += sizeof(ric_route_metrics_t) + 1024;
        for (l = s->locations; l; l = l->next) {
            n += sizeof(ric_route_metrics_t) + 1024;
        }
    }
    return n + (size_t) conf->http->nupstreams * (sizeof(ric_upstream_metrics_t) + 1024);
}

void
ric_metrics_worker_begin(int index, int64_t generation)
{
    ric_instance_t *in = ric_metrics_instance;
    int64_t none;
    int i;

    ric_metrics_shard = index % RIC_METRIC_SHARDS;
    ric_metrics_generation = generation;
    if (in == NULL) {
        return;
    }
    for (i = 0; i < RIC_METRIC_WORKERS; i++) {
        none = 0;
        if (atomic_compare_exchange_strong(&in->workers[i].pid, &none, (int64_t) getpid())) {
            ric_metrics_gauges = &in->workers[i];
            return;
        }
    }
}

int
ric_metrics_admin_stays(void)
{
    const ric_instance_t *in = ric_metrics_instance;

    return in != NULL && in->stopping && !in->handed_over
           && in->generation == ric_metrics_generation;
}

void
ric_metrics_worker_gone(int64_t pid)
{
    ric_instance_t *in = ric_metrics_instance;
    int i, j;

    for (i = 0; in != NULL && i < RIC_METRIC_WORKERS; i++) {
        if (in->workers[i].pid == pid) {
            for (j = 0; j < RIC_CS_MAX; j++) {
                in->workers[i].conns[j] = 0;
            }
            in->workers[i].pid = 0;
        }
    }
}

/* --- counting ------------------------------------------------------------------ */

void
ric_hist_observe(ric_hist_t *h, int64_t us)
{
    int i = 0;

    while (i < RIC_HIST_BUCKETS - 1 && us > ric_hist_le_us[i]) {
        i++;
    }
    ric_metric_add(&h->n[i], 1);
    ric_metric_add(&h->sum_us, (uint64_t) ric_max(us, 0));
}

void
ric_metrics_request(ric_route_metrics_t *m, int status, int64_t duration_us)
{
    ric_route_shard_t *sh = ric_metrics_route(m);

    if (sh == NULL) {
        return;
    }
    ric_metric_add(&sh->requests[status >= 100 && status < RIC_METRIC_CODES ? status : 0], 1);
    ric_hist_observe(&sh->duration, duration_us);
}

void
ric_metrics_attempt(ric_route_metrics_t *rm, ric_upstream_metrics_t *um, ric_mclass_t cls,
                    int64_t response_us, int retry_of, int64_t wait_us)
{
    ric_route_shard_t *sh = ric_metrics_route(rm);
    ric_upstream_shard_t *ush = um != NULL ? &um->shard[ric_metrics_shard] : NULL;

    if (sh != NULL) {
        ric_metric_add(&sh->attempts[cls], 1);
        if (retry_of >= 0) {
            ric_metric_add(&sh->retries[retry_of], 1);
            ric_hist_observe(&sh->retry_wait, wait_us);
        }
    }
    if (ush != NULL) {
        ric_metric_add(&ush->attempts[cls], 1);
        if (retry_of >= 0) {
            ric_metric_add(&ush->retries, 1);
        }
        if (response_us >= 0) {
            ric_hist_observe(&ush->response, response_us);
        }
    }
}

void
ric_metrics_hedge(ric_route_metrics_t *rm, ric_upstream_metrics_t *um, int outcome)
{
    ric_route_shard_t *sh = ric_metrics_route(rm);

    if (sh != NULL) {
        ric_metric_add(&sh->hedges[outcome], 1);
    }
    if (um != NULL && outcome != RIC_MH_REFUSED) {
        ric_metric_add(&um->shard[ric_metrics_shard].hedges, 1);
    }
}

ric_mclass_t
ric_metrics_class(unsigned class, int status, int tls)
{
    switch (class) {
    case RIC_CLASS_STATUS:
        return status == 429 ? RIC_MC_429 : status >= 500 ? RIC_MC_5XX
               : status >= 400 ? RIC_MC_4XX : RIC_MC_OK;
    case RIC_CLASS_CONNECT_ERROR:
        return tls ? RIC_MC_TLS_ERROR : RIC_MC_CONNECT_ERROR;
    case RIC_CLASS_RESET:
        return RIC_MC_RESET;
    case RIC_CLASS_TIMEOUT:
        return RIC_MC_TIMEOUT;
    default:
        return RIC_MC_BAD_RESPONSE;
    }
}

/* --- reading ------------------------------------------------------------------- */

static void
sum_words(uint64_t *out, const uint64_t *in, size_t words)
{
    size_t i;

    for (i = 0; i < words; i++) {
        out[i] += __atomic_load_n(&in[i], __ATOMIC_RELAXED);
    }
}

/* Every shard of an entry (RIC_METRIC_SHARDS of size bytes from first)
 * summed into out; NULL first: zeros. */
static void
sum_shards(void *out, const void *first, size_t size)
{
    int i;

    memset(out, 0, size);
    for (i = 0; first != NULL && i < RIC_METRIC_SHARDS; i++) {
        sum_words(out, (const uint64_t *) ((const u_char *) first + (size_t) i * size),
                  size / sizeof(uint64_t));
    }
}

void
ric_metrics_route_sum(const ric_route_metrics_t *m, ric_route_shard_t *out)
{
    sum_shards(out, m != NULL ? m->shard : NULL, sizeof(*out));
}

void
ric_metrics_upstream_sum(const ric_upstream_metrics_t *m, ric_upstream_shard_t *out)
{
    sum_shards(out, m != NULL ? m->shard : NULL, sizeof(*out));
}

const char *
ric_metrics_class_name(ric_mclass_t c)
{
    static const char *const names[RIC_MC_MAX] = {
        "ok", "4xx", "429", "5xx", "connect_error", "tls_error", "reset", "timeout",
        "bad_response", "cut", "client_body", "cancelled"
    };

    return (unsigned) c < RIC_MC_MAX ? names[c] : "other";
}

const char *
ric_metrics_refusal_name(int why)
{
    static const char *const names[RIC_MR_MAX] = {
        NULL, "retries_off", "response_started", NULL, NULL, "unsafe", "body_not_replayable",
        "attempts_exhausted", "deadline", "budget", "shutting_down", NULL, "script",
        "kill_switch"
    };

    return why >= 0 && why < RIC_MR_MAX ? names[why] : NULL;
}

const char *
ric_metrics_idem_name(int what)
{
    static const char *const names[RIC_MI_MAX] = {
        "claimed", "replayed", "in_flight", "mismatch", "not_replayable", "stored", "not_stored",
        "store_error", "passed_open"
    };

    return what >= 0 && what < RIC_MI_MAX ? names[what] : "other";
}

const char *
ric_metrics_hedge_name(int outcome)
{
    static const char *const names[RIC_MH_MAX] = { "won", "lost", "failed", "refused" };

    return outcome >= 0 && outcome < RIC_MH_MAX ? names[outcome] : "other";
}

const char *
ric_metrics_tls_name(int result)
{
    static const char *const names[RIC_TLS_RESULTS] = { "ok", "failed", "timeout" };

    return result >= 0 && result < RIC_TLS_RESULTS ? names[result] : "other";
}

const char *
ric_metrics_conn_state_name(int state)
{
    static const char *const names[RIC_CS_MAX] = { "handshake", "reading", "active", "idle",
                                                   "closing" };

    return state >= 0 && state < RIC_CS_MAX ? names[state] : "other";
}

int64_t
ric_hist_quantile(const uint64_t *n, double q)
{
    uint64_t total = 0, seen = 0;
    double rank, lo, hi;
    int i;

    for (i = 0; i < RIC_HIST_BUCKETS; i++) {
        total += n[i];
    }
    if (total == 0) {
        return -1;
    }
    rank = q * (double) total;
    for (i = 0; i < RIC_HIST_BUCKETS; i++) {
        if ((double) (seen + n[i]) >= rank && n[i] > 0) {
            if (i == RIC_HIST_BUCKETS - 1) {
                return ric_hist_le_us[RIC_HIST_BUCKETS - 2]; /* +Inf: the highest bound */
            }
            lo = i == 0 ? 0 : (double) ric_hist_le_us[i - 1];
            hi = (double) ric_hist_le_us[i];
            return (int64_t) (lo + (hi - lo) * (rank - (double) seen) / (double) n[i]);
        }
        seen += n[i];
    }
    return ric_hist_le_us[RIC_HIST_BUCKETS - 2];
}
