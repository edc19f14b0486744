/* status.c: the status page's figures: the master's sample of every route and upstream once a second, and /status.json made from the samples. */
#include "status.h"
#include "metrics.h"
#include "script.h"
#include "upstream.h"

#include <stddef.h>
#include <stdio.h>

#define WINDOW 10 /* seconds: the rates, success and latency shown are over the last ten */

static uint64_t
total(const uint64_t *n, size_t count)
{
    uint64_t t = 0;
    size_t i;

    for (i = 0; i < count; i++) {
        t += n[i];
    }
    return t;
}

static uint64_t
script_errors(const ric_script_t *s)
{
    return s != NULL && s->counts != NULL ? total(s->counts->failed, RIC_HOOKS) : 0;
}

static void
route_point(ric_status_point_t *p, const ric_route_metrics_t *m, const ric_script_t *script)
{
    ric_route_shard_t sum;

    ric_metrics_route_sum(m, &sum);
    p->requests = total(sum.requests, RIC_METRIC_CODES);
    p->errors = total(sum.requests + 500, 100);
    p->retries = total(sum.retries, RIC_MC_MAX);
    p->attempts = total(sum.attempts, RIC_MC_MAX);
    p->refused = total(sum.refused, RIC_MR_MAX);
    p->script_errors = script_errors(script);
    memcpy(p->idem, sum.idem, sizeof(p->idem));
    memcpy(p->hist, sum.duration.n, sizeof(p->hist));
}

static void
upstream_point(ric_status_point_t *p, const ric_upstream_conf_t *u, int64_t now)
{
    ric_upstream_shard_t sum;
    const ric_upstream_server_t *s;
    ric_budget_t b = { u->budget, u->budget_state };
    int i;

    ric_metrics_upstream_sum(u->metrics, &sum);
    p->attempts = total(sum.attempts, RIC_MC_MAX);
    p->retries = sum.retries;
    p->requests = p->attempts - p->retries - sum.hedges;
    p->errors = p->attempts - sum.attempts[RIC_MC_OK] - sum.attempts[RIC_MC_4XX]
                - sum.attempts[RIC_MC_CUT] - sum.attempts[RIC_MC_CLIENT_BODY]
                - sum.attempts[RIC_MC_CANCELLED];
    if (u->budget_state != NULL) {
        p->tokens_milli = ric_budget_tokens(&b);
        p->waits = (uint64_t) u->budget_state->waits;
        p->refused = (uint64_t) u->budget_state->refused;
    }
    p->up_mask = 0;
    for (i = 0, s = u->servers; s && i < 64; s = s->next, i++) {
        if (s->health == NULL || s->health->down_until <= now) {
            p->up_mask |= (uint64_t) 1 << i;
        }
    }
    memcpy(p->hist, sum.response.n, sizeof(p->hist));
}

void
ric_status_sample(const ric_conf_t *conf, int64_t wall_ms)
{
    ric_instance_t *in = ric_metrics_instance;
    const ric_server_conf_t *s;
    const ric_location_conf_t *l;
    const ric_upstream_conf_t *u;
    uint64_t seq;
    int64_t now = ric_now_ms();
    int slot;

    if (in == NULL || conf->http == NULL) {
        return;
    }
    seq = (uint64_t) in->seq;
    slot = (int) (seq % RIC_STATUS_SAMPLES);
    in->sample_ms[slot] = wall_ms;
    for (s = conf->http->servers; s; s = s->next) {
        for (l = s->locations; l; l = l->next) {
            if (l->metrics != NULL) {
                ric_status_point_t *p = &l->metrics->ring[slot];
                route_point(p, l->metrics, l->refs.script);
                p->seq = seq + 1;
            }
        }
    }
    for (u = conf->http->upstreams; u; u = u->next) {
        if (u->metrics != NULL) {
            ric_status_point_t *p = &u->metrics->ring[slot];
            upstream_point(p, u, now);
            p->seq = seq + 1;
        }
    }
    atomic_store(&in->seq, (int64_t) seq + 1);
}

/* --- /status.json --------------------------------------------------------- */

/* The length of the UTF-8 sequence at s (well formed, no overlong form
 * or surrogate), or 0. */
static size_t
utf8_len(const u_char *s)
{
    size_t n, i;
    uint32_t cp;

    if (s[0] >= 0xc2 && s[0] <= 0xdf) {
        n = 2, cp = s[0] & 0x1f;
    } else if (s[0] >= 0xe0 && s[0] <= 0xef) {
        n = 3, cp = s[0] & 0x0f;
    } else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
        n = 4, cp = s[0] & 0x07;
    } else {
        return 0;
    }
    for (i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) {
            return 0;
        }
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if ((n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (n == 4 && (cp < 0x10000
                                                                            || cp > 0x10ffff))) {
        return 0;
    }
    return n;
}

/* A JSON string: UTF-8 as it is (a name in the config reads the same as
 * in /metrics), quotes, backslashes and control bytes escaped, a byte
 * that is not UTF-8 as U+FFFD. */
static void
json_str(ric_buf_t *b, const char *str)
{
    const u_char *s = (const u_char *) str;
    char hex[8];
    size_t n;

    ric_buf_put(b, "\"", 1);
    while (*s) {
        if (*s == '"' || *s == '\\') {
            ric_buf_put(b, "\\", 1);
            ric_buf_put(b, s++, 1);
        } else if (*s < 0x20 || *s == 0x7f) {
            snprintf(hex, sizeof(hex), "\\u%04x", *s++);
            ric_buf_put(b, hex, 6);
        } else if (*s < 0x80) {
            ric_buf_put(b, s++, 1);
        } else if ((n = utf8_len(s)) > 0) {
            ric_buf_put(b, s, n);
            s += n;
        } else {
            ric_buf_puts(b, "\\ufffd");
            s++;
        }
    }
    ric_buf_put(b, "\"", 1);
}

/* The series' point of sample seq, or NULL when it was not written then. */
static const ric_status_point_t *
point(const ric_status_point_t *ring, uint64_t seq)
{
    const ric_status_point_t *p = &ring[seq % RIC_STATUS_SAMPLES];

    return p->seq == seq + 1 ? p : NULL;
}

typedef struct {
    const ric_instance_t *in;
    uint64_t seq;   /* the sample shown */
    uint64_t first; /* the oldest sample the ring still holds */
} view_t;

/* What each second added to one figure of the points (at offset off),
 * oldest first, as far back as the ring goes. */
static void
history(ric_buf_t *b, const view_t *v, const ric_status_point_t *ring, size_t off)
{
    const ric_status_point_t *p, *q;
    uint64_t s;
    int n = 0;

    ric_buf_puts(b, "[");
    for (s = v->first + 1; s <= v->seq; s++) {
        p = point(ring, s);
        q = point(ring, s - 1);
        if (p != NULL && q != NULL) {
            ric_buf_printf(b, "%s%llu", n++ ? "," : "",
                 (unsigned long long) (*(const uint64_t *) ((const u_char *) p + off)
                                       - *(const uint64_t *) ((const u_char *) q + off)));
        }
    }
    ric_buf_puts(b, "]");
}

/* The figures over the window ending at the sample shown: rates per
 * second, the share of requests answered below 500, the latency's p50
 * and p99; then the history, one figure a second. */
static void
series(ric_buf_t *b, const view_t *v, const ric_status_point_t *ring, int by_attempts)
{
    const ric_status_point_t *now = point(ring, v->seq), *then = NULL;
    uint64_t from = v->seq >= WINDOW && v->seq - WINDOW >= v->first ? v->seq - WINDOW : v->first;
    uint64_t hist[RIC_HIST_BUCKETS], s, dreq, dall;
    double secs;
    int64_t p50, p99;
    int i;

    for (s = from; s < v->seq && then == NULL; s++) {
        then = point(ring, s);
    }
    if (then == NULL) {
        then = now;
    }
    secs = (double) (v->in->sample_ms[v->seq % RIC_STATUS_SAMPLES]
                     - v->in->sample_ms[(then->seq - 1) % RIC_STATUS_SAMPLES]) / 1e3;
    dreq = now->requests - then->requests;
    /* an upstream's success is its attempts' (errors counts failed
     * attempts); a route's, its requests' (errors counts answers >= 500) */
    dall = by_attempts ? now->attempts - then->attempts : dreq;
    ric_buf_printf(b, "\"requests\":%llu,\"retries\":%llu,\"attempts\":%llu,\"refused\":%llu,",
         (unsigned long long) now->requests, (unsigned long long) now->retries,
         (unsigned long long) now->attempts, (unsigned long long) now->refused);
    ric_buf_printf(b, "\"requests_per_sec\":%.2f,\"retries_per_sec\":%.2f,",
         secs > 0 ? (double) dreq / secs : 0.0,
         secs > 0 ? (double) (now->retries - then->retries) / secs : 0.0);
    if (dall > 0) {
        ric_buf_printf(b, "\"success_rate\":%.2f,",
             100.0 * (double) (dall - (now->errors - then->errors)) / (double) dall);
    } else {
        ric_buf_printf(b, "\"success_rate\":null,");
    }
    for (i = 0; i < RIC_HIST_BUCKETS; i++) {
        hist[i] = now->hist[i] - then->hist[i];
    }
    p50 = ric_hist_quantile(hist, 0.5);
    p99 = ric_hist_quantile(hist, 0.99);
    if (p50 >= 0) {
        ric_buf_printf(b, "\"p50_ms\":%.1f,\"p99_ms\":%.1f,", (double) p50 / 1e3, (double) p99 / 1e3);
    } else {
        ric_buf_printf(b, "\"p50_ms\":null,\"p99_ms\":null,");
    }
    ric_buf_puts(b, "\"history\":{\"requests\":");
    history(b, v, ring, offsetof(ric_status_point_t, requests));
    ric_buf_puts(b, ",\"retries\":");
    history(b, v, ring, offsetof(ric_status_point_t, retries));
    ric_buf_puts(b, ",\"errors\":");
    history(b, v, ring, offsetof(ric_status_point_t, errors));
    ric_buf_puts(b, "}");
}

static void
upstream_json(ric_buf_t *b, const view_t *v, const ric_upstream_conf_t *u)
{
    const ric_status_point_t *now = point(u->metrics->ring, v->seq);
    const ric_upstream_server_t *s;
    int i;

    ric_buf_puts(b, "{\"name\":");
    json_str(b, u->name);
    ric_buf_puts(b, ",");
    series(b, v, u->metrics->ring, 1);
    if (u->budget->kind == RIC_BUDGET_ADAPTIVE) {
        ric_buf_printf(b, ",\"budget_tokens\":%.1f", (double) now->tokens_milli / RIC_BUDGET_MILLI);
    } else {
        ric_buf_puts(b, ",\"budget_tokens\":null");
    }
    ric_buf_printf(b, ",\"budget_waits\":%llu,\"budget_refused\":%llu,\"servers\":[",
         (unsigned long long) now->waits, (unsigned long long) now->refused);
    for (i = 0, s = u->servers; s && i < 64; s = s->next, i++) {
        ric_buf_puts(b, i ? ",{\"server\":" : "{\"server\":");
        json_str(b, s->addr_text);
        ric_buf_printf(b, ",\"up\":%s}", now->up_mask & ((uint64_t) 1 << i) ? "true" : "false");
    }
    ric_buf_puts(b, "]}");
}

static void
route_json(ric_buf_t *b, const view_t *v, const ric_location_conf_t *l)
{
    const ric_status_point_t *now = point(l->metrics->ring, v->seq);
    int i;

    ric_buf_puts(b, "{\"route\":");
    json_str(b, l->label);
    ric_buf_puts(b, ",\"upstream\":");
    if (l->upstream != NULL) {
        json_str(b, l->upstream->name);
    } else {
        ric_buf_puts(b, "null");
    }
    ric_buf_puts(b, ",");
    series(b, v, l->metrics->ring, 0);
    ric_buf_printf(b, ",\"script_errors\":%llu,\"idempotency\":{", (unsigned long long) now->script_errors);
    for (i = 0; i < RIC_MI_MAX; i++) {
        ric_buf_printf(b, "%s\"%s\":%llu", i ? "," : "", ric_metrics_idem_name(i),
             (unsigned long long) now->idem[i]);
    }
    ric_buf_puts(b, "}}");
}

int
ric_status_json(const ric_conf_t *conf, int64_t want, ric_buf_t *b)
{
    const ric_instance_t *in = ric_metrics_instance;
    const ric_server_conf_t *s;
    const ric_location_conf_t *l;
    const ric_upstream_conf_t *u;
    uint64_t written;
    view_t v;
    int n;

    if (in == NULL || conf->http == NULL || (written = (uint64_t) in->seq) == 0) {
        return RIC_DECLINED; /* no sample yet */
    }
    v.in = in;
    v.seq = want >= 0 ? (uint64_t) want : written - 1;
    v.first = written > RIC_STATUS_SAMPLES ? written - RIC_STATUS_SAMPLES + 1 : 0;
    if (v.seq >= written || v.seq < v.first) {
        return RIC_ERROR; /* not (or no longer) in the ring */
    }
    ric_buf_printf(b, "{\"version\":\"%s\",\"generation\":%lld,\"seq\":%llu,\"time\":%lld,"
         "\"started\":%lld,\"window_seconds\":%d,\"upstreams\":[", RIC_VERSION,
         (long long) in->generation, (unsigned long long) v.seq,
         (long long) in->sample_ms[v.seq % RIC_STATUS_SAMPLES], (long long) in->started_ms,
         WINDOW);
    n = 0;
    for (u = conf->http->upstreams; u; u = u->next) {
        if (u->metrics != NULL && point(u->metrics->ring, v.seq) != NULL) {
            if (n++) {
                ric_buf_puts(b, ",");
            }
            upstream_json(b, &v, u);
        }
    }
    ric_buf_puts(b, "],\"routes\":[");
    n = 0;
    for (s = conf->http->servers; s; s = s->next) {
        for (l = s->locations; l; l = l->next) {
            if (l->metrics != NULL && point(l->metrics->ring, v.seq) != NULL) {
                if (n++) {
                    ric_buf_puts(b, ",");
                }
                route_json(b, &v, l);
            }
        }
    }
    ric_buf_puts(b, "]}\n");
    return RIC_OK;
}
