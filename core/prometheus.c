/* prometheus.c: the instance's metrics in the Prometheus text format (0.0.4), summed over every worker. */
#include "prometheus.h"
#include "budget.h"
#include "idem_store.h"
#include "metrics.h"
#include "script.h"
#include "upstream.h"
#include "watchdog.h"

#include <stdio.h>

/* A label's value: backslash, quote and newline escaped; into the next
 * of a few scratch buffers, so one line may hold several. */
static const char *
esc(const char *s)
{
    static ric_buf_t scratch[4];
    static unsigned next;
    ric_buf_t *b = &scratch[next++ % ric_nelems(scratch)];

    b->len = 0;
    for (; *s; s++) {
        if (*s == '\\' || *s == '"') {
            ric_buf_put(b, "\\", 1);
            ric_buf_put(b, s, 1);
        } else if (*s == '\n') {
            ric_buf_put(b, "\\n", 2);
        } else {
            ric_buf_put(b, s, 1);
        }
    }
    ric_buf_put(b, "", 1);
    return (const char *) b->data;
}

static void
family(ric_buf_t *b, const char *name, const char *type, const char *help)
{
    ric_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A histogram's series, with one label (key="value", value escaped):
 * cumulative buckets, sum and count. */
static void
histogram(ric_buf_t *b, const char *name, const char *key, const char *value, const ric_hist_t *h)
{
    uint64_t cum = 0;
    int i;

    for (i = 0; i < RIC_HIST_BUCKETS; i++) {
        cum += h->n[i];
        if (i < RIC_HIST_BUCKETS - 1) {
            ric_buf_printf(b, "%s_bucket{%s=\"%s\",le=\"%g\"} %llu\n", name, key, value,
                           (double) ric_hist_le_us[i] / 1e6, (unsigned long long) cum);
        } else {
            ric_buf_printf(b, "%s_bucket{%s=\"%s\",le=\"+Inf\"} %llu\n", name, key, value,
                           (unsigned long long) cum);
        }
    }
    ric_buf_printf(b, "%s_sum{%s=\"%s\"} %.6f\n", name, key, value, (double) h->sum_us / 1e6);
    ric_buf_printf(b, "%s_count{%s=\"%s\"} %llu\n", name, key, value, (unsigned long long) cum);
}

/* Every route of conf (a server's unmatched requests, then its
 * locations), with its entry summed. */
typedef void (*route_fn)(ric_buf_t *b, const char *route, const ric_location_conf_t *l,
                         const ric_route_shard_t *sum);

static void
each_route(const ric_conf_t *conf, ric_buf_t *b, route_fn fn)
{
    const ric_server_conf_t *s;
    const ric_location_conf_t *l;
    ric_route_shard_t sum;
    ric_buf_t label = { 0 }, route = { 0 };

    for (s = conf->http->servers; s; s = s->next) {
        if (s->metrics != NULL) {
            ric_metrics_route_sum(s->metrics, &sum);
            label.len = 0;
            ric_buf_printf(&label, "%s (no location)", s->label);
            route.len = 0;
            ric_buf_puts(&route, esc((const char *) label.data));
            ric_buf_put(&route, "", 1);
            fn(b, (const char *) route.data, NULL, &sum);
        }
        for (l = s->locations; l; l = l->next) {
            if (l->metrics != NULL) {
                ric_metrics_route_sum(l->metrics, &sum);
                route.len = 0;
                ric_buf_puts(&route, esc(l->label));
                ric_buf_put(&route, "", 1);
                fn(b, (const char *) route.data, l, &sum);
            }
        }
    }
    ric_buf_free(&label);
    ric_buf_free(&route);
}

static void
route_requests(ric_buf_t *b, const char *route, const ric_location_conf_t *l,
               const ric_route_shard_t *sum)
{
    int code;

    (void) l;
    for (code = 0; code < RIC_METRIC_CODES; code++) {
        if (sum->requests[code] == 0) {
            continue;
        }
        if (code == 0) {
            ric_buf_printf(b, "ricochet_requests_total{route=\"%s\",code=\"other\"} %llu\n", route,
                 (unsigned long long) sum->requests[code]);
        } else {
            ric_buf_printf(b, "ricochet_requests_total{route=\"%s\",code=\"%d\"} %llu\n", route, code,
                 (unsigned long long) sum->requests[code]);
        }
    }
}

static void
route_duration(ric_buf_t *b, const char *route, const ric_location_conf_t *l,
               const ric_route_shard_t *sum)
{
    (void) l;
    histogram(b, "ricochet_request_duration_seconds", "route", route, &sum->duration);
}

static void
route_attempts(ric_buf_t *b, const char *route, const ric_location_conf_t *l,
               const ric_route_shard_t *sum)
{
    int c;

    if (l == NULL || l->upstream == NULL) {
        return;
    }
    for (c = 0; c < RIC_MC_MAX; c++) {
        ric_buf_printf(b, "ricochet_attempts_total{route=\"%s\",upstream=\"%s\",class=\"%s\"} %llu\n", route,
             esc(l->upstream->name), ric_metrics_class_name(c),
             (unsigned long long) sum->attempts[c]);
    }
}

static void
route_retries(ric_buf_t *b, const char *route, const ric_location_conf_t *l,
              const ric_route_shard_t *sum)
{
    int c;

    if (l == NULL || l->upstream == NULL) {
        return;
    }
    for (c = 0; c < RIC_MC_MAX; c++) {
        if (c != RIC_MC_OK && c != RIC_MC_CUT && c != RIC_MC_CLIENT_BODY && c != RIC_MC_CANCELLED) {
            ric_buf_printf(b, "ricochet_retries_total{route=\"%s\",reason=\"%s\"} %llu\n", route,
                 ric_metrics_class_name(c), (unsigned long long) sum->retries[c]);
        }
    }
    if (sum->retries[RIC_MC_OK] > 0) { /* a route script's classify asked for it */
        ric_buf_printf(b, "ricochet_retries_total{route=\"%s\",reason=\"script\"} %llu\n", route,
             (unsigned long long) sum->retries[RIC_MC_OK]);
    }
}

static void
route_refused(ric_buf_t *b, const char *route, const ric_location_conf_t *l,
              const ric_route_shard_t *sum)
{
    int w;

    if (l == NULL || l->upstream == NULL) {
        return;
    }
    for (w = 0; w < RIC_MR_MAX; w++) {
        if (ric_metrics_refusal_name(w) != NULL) {
            ric_buf_printf(b, "ricochet_retry_refused_total{route=\"%s\",why=\"%s\"} %llu\n", route,
                 ric_metrics_refusal_name(w), (unsigned long long) sum->refused[w]);
        }
    }
}

static void
route_hedges(ric_buf_t *b, const char *route, const ric_location_conf_t *l,
             const ric_route_shard_t *sum)
{
    int o;

    if (l == NULL || l->upstream == NULL) {
        return;
    }
    for (o = 0; o < RIC_MH_MAX; o++) {
        ric_buf_printf(b, "ricochet_hedges_total{route=\"%s\",outcome=\"%s\"} %llu\n", route,
             ric_metrics_hedge_name(o), (unsigned long long) sum->hedges[o]);
    }
}

static void
route_wait(ric_buf_t *b, const char *route, const ric_location_conf_t *l,
           const ric_route_shard_t *sum)
{
    if (l == NULL || l->upstream == NULL) {
        return;
    }
    histogram(b, "ricochet_retry_wait_seconds", "route", route, &sum->retry_wait);
}

static void
upstreams(const ric_conf_t *conf, ric_buf_t *b)
{
    const ric_upstream_conf_t *u;
    const ric_upstream_server_t *s;
    ric_upstream_shard_t sum;
    int64_t now = ric_now_ms();

    family(b, "ricochet_budget_tokens", "gauge",
           "Tokens in the upstream's adaptive retry budget (one pays for a retry).");
    for (u = conf->http->upstreams; u; u = u->next) {
        ric_budget_t bud = { u->budget, u->budget_state };
        if (u->budget_state != NULL && u->budget->kind == RIC_BUDGET_ADAPTIVE) {
            ric_buf_printf(b, "ricochet_budget_tokens{upstream=\"%s\"} %.3f\n", esc(u->name),
                 (double) ric_budget_tokens(&bud) / RIC_BUDGET_MILLI);
        }
    }
    family(b, "ricochet_budget_waits_total", "counter",
           "Times a retry waited for the upstream's retry budget.");
    for (u = conf->http->upstreams; u; u = u->next) {
        if (u->budget_state != NULL) {
            ric_buf_printf(b, "ricochet_budget_waits_total{upstream=\"%s\"} %lld\n",
                 esc(u->name), (long long) u->budget_state->waits);
        }
    }
    family(b, "ricochet_budget_refused_total", "counter",
           "Retries the upstream's retry budget refused.");
    for (u = conf->http->upstreams; u; u = u->next) {
        if (u->budget_state != NULL) {
            ric_buf_printf(b, "ricochet_budget_refused_total{upstream=\"%s\"} %lld\n",
                 esc(u->name), (long long) u->budget_state->refused);
        }
    }
    family(b, "ricochet_upstream_response_seconds", "histogram",
           "Time from an attempt's start to the end of its response head, by upstream.");
    for (u = conf->http->upstreams; u; u = u->next) {
        if (u->metrics != NULL) {
            ric_metrics_upstream_sum(u->metrics, &sum);
            histogram(b, "ricochet_upstream_response_seconds", "upstream", esc(u->name),
                      &sum.response);
        }
    }
    family(b, "ricochet_upstream_server_up", "gauge",
           "1 while passive health has not marked the upstream's server down.");
    for (u = conf->http->upstreams; u; u = u->next) {
        for (s = u->servers; s; s = s->next) {
            if (s->health != NULL) {
                ric_buf_printf(b, "ricochet_upstream_server_up{upstream=\"%s\",server=\"%s\"} %d\n",
                     esc(u->name), esc(s->addr_text),
                     s->health->down_until <= now);
            }
        }
    }
}

static void
stores(const ric_conf_t *conf, ric_buf_t *b)
{
    const ric_idem_store_conf_t *sc;
    int i;

    family(b, "ricochet_idempotency_total", "counter",
           "What the idempotency store's requests met, by store and result.");
    for (sc = conf->http->idem_stores; sc; sc = sc->next) {
        if (sc->counters == NULL || sc->ops == NULL) {
            continue;
        }
        for (i = 0; i < RIC_MI_MAX; i++) {
            ric_buf_printf(b, "ricochet_idempotency_total{store=\"%s\",result=\"%s\"} %llu\n",
                 esc(sc->spec), ric_metrics_idem_name(i),
                 (unsigned long long) sc->counters->n[i]);
        }
    }
    family(b, "ricochet_idempotency_settles_lost_total", "counter",
           "Answers and lock refreshes the store did not take while their lock lived: keys whose "
           "request may run again.");
    for (sc = conf->http->idem_stores; sc; sc = sc->next) {
        if (sc->counters != NULL && sc->ops != NULL) {
            ric_buf_printf(b, "ricochet_idempotency_settles_lost_total{store=\"%s\"} %llu\n",
                 esc(sc->spec), (unsigned long long) sc->counters->settles_lost);
        }
    }
}

/* Every route script of conf once (several locations may share one). */
static void
scripts(const ric_conf_t *conf, ric_buf_t *b, int stopped)
{
    static const char *const hooks[RIC_HOOKS] = { "on_request", "classify", "on_response",
                                                  "on_log" };
    const ric_script_t *done[256];
    const ric_server_conf_t *s;
    const ric_location_conf_t *l;
    const ric_script_t *sc;
    int h, i, n = 0;

    for (s = conf->http->servers; s; s = s->next) {
        for (l = s->locations; l; l = l->next) {
            sc = l->refs.script;
            for (i = 0; i < n && done[i] != sc; i++) {
            }
            if (sc == NULL || sc->counts == NULL || i < n || n == (int) ric_nelems(done)) {
                continue;
            }
            done[n++] = sc;
            for (h = 0; h < RIC_HOOKS; h++) {
                ric_buf_printf(b, "%s{script=\"%s\",hook=\"%s\"} %llu\n",
                     stopped ? "ricochet_script_stopped_total" : "ricochet_script_errors_total",
                     esc(sc->path), hooks[h],
                     (unsigned long long) (stopped ? sc->counts->stopped[h]
                                                   : sc->counts->failed[h]));
            }
        }
    }
}

static void
servers_tls(const ric_conf_t *conf, ric_buf_t *b)
{
    const ric_server_conf_t *s;
    ric_route_shard_t sum;
    int i;

    family(b, "ricochet_tls_handshakes_total", "counter",
           "Client TLS handshakes, by the server whose certificate went, and result.");
    for (s = conf->http->servers; s; s = s->next) {
        if (s->ssl_ctx == NULL || s->metrics == NULL) {
            continue;
        }
        ric_metrics_route_sum(s->metrics, &sum);
        for (i = 0; i < RIC_TLS_RESULTS; i++) {
            ric_buf_printf(b, "ricochet_tls_handshakes_total{server=\"%s\",result=\"%s\"} %llu\n",
                 esc(s->label), ric_metrics_tls_name(i),
                 (unsigned long long) sum.tls[i]);
        }
    }
}

static void
instance(ric_buf_t *b)
{
    const ric_instance_t *in = ric_metrics_instance;
    int64_t conns[RIC_CS_MAX] = { 0 };
    int i, j, workers = 0;

    family(b, "ricochet_build_info", "gauge", "The running build; always 1.");
    ric_buf_printf(b, "ricochet_build_info{version=\"%s\"} 1\n", RIC_VERSION);
    if (in == NULL) {
        return;
    }
    family(b, "ricochet_config_generation", "gauge",
           "Configurations the instance has loaded: 1 at start, one more per reload.");
    ric_buf_printf(b, "ricochet_config_generation %lld\n", (long long) in->generation);
    family(b, "ricochet_start_time_seconds", "gauge", "When the instance started (Unix time).");
    ric_buf_printf(b, "ricochet_start_time_seconds %.3f\n", (double) in->started_ms / 1e3);
    for (i = 0; i < RIC_METRIC_WORKERS; i++) {
        if (in->workers[i].pid != 0) {
            workers++;
            for (j = 0; j < RIC_CS_MAX; j++) {
                conns[j] += in->workers[i].conns[j];
            }
        }
    }
    family(b, "ricochet_workers", "gauge", "Worker processes running.");
    ric_buf_printf(b, "ricochet_workers %d\n", workers);
    family(b, "ricochet_worker_watchdog_kills_total", "counter",
           "Workers the master killed because their event loop had not turned for "
           "worker_watchdog (their requests in flight were lost).");
    ric_buf_printf(b, "ricochet_worker_watchdog_kills_total %llu\n",
                   (unsigned long long) ric_watchdog_kills());
    family(b, "ricochet_connections", "gauge", "Client connections, by state.");
    for (j = 0; j < RIC_CS_MAX; j++) {
        ric_buf_printf(b, "ricochet_connections{state=\"%s\"} %lld\n", ric_metrics_conn_state_name(j),
             (long long) ric_max(conns[j], 0));
    }
}

void
ric_prometheus_write(const ric_conf_t *conf, ric_buf_t *b)
{
    instance(b);
    if (conf->http == NULL) {
        return;
    }
    family(b, "ricochet_requests_total", "counter",
           "Client requests, by route (server and location, as configured) and the status sent.");
    each_route(conf, b, route_requests);
    family(b, "ricochet_request_duration_seconds", "histogram",
           "Time from a request's head to the end of its answer, by route.");
    each_route(conf, b, route_duration);
    family(b, "ricochet_attempts_total", "counter",
           "Upstream attempts, by route, upstream and what the attempt met.");
    each_route(conf, b, route_attempts);
    family(b, "ricochet_retries_total", "counter",
           "Retries made, by route and what the attempt before met.");
    each_route(conf, b, route_retries);
    family(b, "ricochet_retry_refused_total", "counter",
           "Retries an outcome asked for and that were not made, by route and why.");
    each_route(conf, b, route_refused);
    family(b, "ricochet_retry_wait_seconds", "histogram",
           "The wait before each retry (backoff, Retry-After, the budget), by route.");
    each_route(conf, b, route_wait);
    family(b, "ricochet_hedges_total", "counter",
           "Hedges (retry_hedge), by route and how each ended: won, lost, failed, or refused by "
           "the retry budget.");
    each_route(conf, b, route_hedges);
    upstreams(conf, b);
    stores(conf, b);
    family(b, "ricochet_script_errors_total", "counter",
           "Route script hook calls that failed, by script and hook.");
    scripts(conf, b, 0);
    family(b, "ricochet_script_stopped_total", "counter",
           "Route script hook calls stopped by script_timeout or script_memory_max.");
    scripts(conf, b, 1);
    servers_tls(conf, b);
}
