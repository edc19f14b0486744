/* admin.c: the admin listener's one phase: who may ask, which method, and /metrics, /healthz, /readyz, /status, /status.json. */
#include "admin.h"
#include "metrics.h"
#include "prometheus.h"
#include "status.h"
#include "log.h"

#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

extern const char ric_status_page[]; /* core/status_page.html, embedded */

/* Whether the client's address is one admin_allow lists (with no list:
 * anyone who reaches the listener, which is then on loopback). */
static int
allowed(const ric_http_conf_t *http, const char *ip)
{
    u_char addr[16];
    int family, i, full, rest;

    if (http->admin_allow == NULL) {
        return 1;
    }
    if (inet_pton(AF_INET, ip, addr) == 1) {
        family = AF_INET;
    } else if (inet_pton(AF_INET6, ip, addr) == 1) {
        family = AF_INET6;
    } else {
        return 0;
    }
    for (i = 0; i < http->nadmin_allow; i++) {
        const ric_cidr_t *c = &http->admin_allow[i];
        if (c->family != family) {
            continue;
        }
        full = c->bits / 8;
        rest = c->bits % 8;
        if (memcmp(c->addr, addr, (size_t) full) == 0
            && (rest == 0 || ((c->addr[full] ^ addr[full]) & (0xff << (8 - rest))) == 0)) {
            return 1;
        }
    }
    return 0;
}

static void
buf_cleanup(void *data)
{
    ric_buf_free(data);
}

/* The answer: status, its type, and b's bytes (the request keeps b until
 * it ends: the body is written from it). */
static int
answer(ric_request_t *r, int status, const char *fields, ric_buf_t *b)
{
    ric_buf_t *keep = ric_pcalloc(r->pool, sizeof(*keep));

    *keep = *b;
    ric_request_cleanup_add(r, buf_cleanup, keep);
    r->own_custom = 1;
    r->own_fields.data = (const u_char *) fields;
    r->own_fields.len = strlen(fields);
    r->own_body.data = keep->data;
    r->own_body.len = keep->len;
    return ric_request_answer(r, status, 0);
}

#define JSON "Content-Type: application/json\r\nCache-Control: no-store\r\n"

static int
json_line(ric_request_t *r, int status, const char *fields, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int
json_line(ric_request_t *r, int status, const char *fields, const char *fmt, ...)
{
    ric_buf_t b = { 0 };
    va_list ap;

    va_start(ap, fmt);
    ric_buf_vprintf(&b, fmt, ap);
    va_end(ap);
    return answer(r, status, fields, &b);
}

static int
workers_alive(const ric_instance_t *in)
{
    int i, n = 0;

    for (i = 0; i < RIC_METRIC_WORKERS; i++) {
        n += in->workers[i].pid != 0;
    }
    return n;
}

/* 200 while the master and its workers live. */
static int
healthz(ric_request_t *r)
{
    const ric_instance_t *in = ric_metrics_instance;
    pid_t master = in ? (pid_t) in->master_pid : 0;
    int up = in != NULL && getppid() == master && kill(master, 0) == 0;

    return json_line(r, up ? 200 : 503, JSON,
                     "{\"status\":\"%s\",\"version\":\"%s\",\"generation\":%lld,"
                     "\"uptime_seconds\":%.3f,\"workers\":%d,\"master_pid\":%d}\n",
                     up ? "ok" : "master_gone", RIC_VERSION,
                     in ? (long long) in->generation : 0LL,
                     in ? (double) (ric_wall_ms() - in->started_ms) / 1e3 : 0.0,
                     in ? workers_alive(in) : 0, (int) master);
}

/* 200 while serving; 503 once the instance is shutting down, so a load
 * balancer drains it before it goes. */
static int
readyz(ric_request_t *r)
{
    const ric_instance_t *in = ric_metrics_instance;

    if (in != NULL && in->stopping) {
        return json_line(r, 503, JSON "Retry-After: 5\r\n",
                         "{\"ready\":false,\"reason\":\"shutting_down\"}\n");
    }
    return json_line(r, 200, JSON, "{\"ready\":true}\n");
}

static int
metrics(ric_request_t *r)
{
    ric_buf_t b = { 0 };

    ric_prometheus_write(r->pipeline->conf, &b);
    return answer(r, 200, "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                          "Cache-Control: no-store\r\n", &b);
}

/* ?seq=N: that sample, while the ring keeps it; else the latest. */
static int
status_json(ric_request_t *r, ric_str_t query)
{
    ric_buf_t b = { 0 };
    int64_t seq = -1;
    const u_char *p = query.data, *end = query.data + query.len, *amp, *v;
    int rc;

    for (; p < end; p = amp + 1) {
        amp = memchr(p, '&', (size_t) (end - p));
        amp = amp != NULL ? amp : end;
        if (amp - p < 4 || memcmp(p, "seq=", 4) != 0) {
            continue; /* another parameter: not ours */
        }
        for (v = p += 4, seq = 0; p < amp && *p >= '0' && *p <= '9' && seq < INT64_MAX / 10 - 9;
             p++) {
            seq = seq * 10 + (*p - '0');
        }
        if (p == v || p != amp) { /* none, or not only digits (or too many) */
            return json_line(r, 400, JSON, "{\"error\":\"seq must be a sample number\"}\n");
        }
    }
    rc = ric_status_json(r->pipeline->conf, seq, &b);
    if (rc == RIC_DECLINED) {
        return json_line(r, 503, JSON "Retry-After: 1\r\n",
                         "{\"error\":\"no sample yet: the first comes within a second\"}\n");
    }
    if (rc == RIC_ERROR) {
        ric_buf_free(&b);
        return json_line(r, 404, JSON, "{\"error\":\"sample %lld is not kept\"}\n",
                         (long long) seq);
    }
    return answer(r, 200, JSON, &b);
}

static int
status_page(ric_request_t *r)
{
    ric_buf_t b = { 0 };

    ric_buf_puts(&b, ric_status_page);
    return answer(r, 200, "Content-Type: text/html; charset=utf-8\r\nCache-Control: no-store\r\n"
                          "Content-Security-Policy: default-src 'self'; script-src 'unsafe-inline'; "
                          "style-src 'unsafe-inline'\r\n", &b);
}

static int
path_is(ric_str_t path, const char *lit)
{
    return path.len == strlen(lit) && memcmp(path.data, lit, path.len) == 0;
}

int
ric_admin_phase(ric_request_t *r)
{
    const ric_http_msg_t *m = r->msg;
    ric_str_t path = ric_request_span(r, m->target_off, m->path_len);
    ric_str_t query = ric_request_span(r, m->target_off, m->target_len), host;

    query.data += ric_min(query.len, path.len + 1);
    query.len -= ric_min(query.len, path.len + 1);
    if (ric_http_absolute_form(path, &host, &path) && path.len == 0) {
        path = (ric_str_t) ric_string("/"); /* "GET http://host:9901/metrics" is /metrics */
    }
    if (ric_metrics_instance != NULL && ric_metrics_instance->stopping) {
        ric_conn_close_after(r->c); /* the instance goes: one answer a connection */
    }
    if (!allowed(r->pipeline->conf->http, r->c->peer_ip)) {
        ric_log_error(RIC_LOG_INFO, 0, "admin_allow does not list the client (403), client: %s",
                      r->c->peer);
        return ric_request_answer(r, 403, 0);
    }
    if (!path_is(path, "/metrics") && !path_is(path, "/healthz") && !path_is(path, "/readyz")
        && !path_is(path, "/status") && !path_is(path, "/status.json") && !path_is(path, "/")) {
        return ric_request_answer(r, 404, 0);
    }
    if (m->method != RIC_HTTP_GET && m->method != RIC_HTTP_HEAD) {
        static const char allow[] = "Allow: GET, HEAD\r\n";
        r->own_custom = 1;
        r->own_fields.data = (const u_char *) allow;
        r->own_fields.len = sizeof(allow) - 1;
        r->own_body = (ric_str_t) ric_string("405 Method Not Allowed\n");
        return ric_request_answer(r, 405, 0);
    }
    if (path_is(path, "/metrics")) {
        return metrics(r);
    }
    if (path_is(path, "/healthz")) {
        return healthz(r);
    }
    if (path_is(path, "/readyz")) {
        return readyz(r);
    }
    if (path_is(path, "/status.json")) {
        return status_json(r, query);
    }
    if (path_is(path, "/")) {
        static const char to[] = "Location: /status\r\n";
        r->own_custom = 1;
        r->own_fields.data = (const u_char *) to;
        r->own_fields.len = sizeof(to) - 1;
        r->own_body = (ric_str_t) ric_string("see /status\n");
        return ric_request_answer(r, 302, 0);
    }
    return status_page(r);
}
