/* proxy.c: a proxied exchange: connect or reuse, send the request, stream the response back with backpressure. */
#include "proxy.h"
#include "log.h"
#include "retry.h"
#include "retry_after.h"
#include "worker.h"

#include <errno.h>
#include <event2/event_struct.h>
#include <openssl/rand.h>
#include <time.h>
#include <stdio.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define PROXY_BUF_SIZE (32 * 1024) /* response head limit and relay buffer */
#define MAX_CONN_TOKENS 16

typedef enum {
    P_CONNECTING,
    P_SENDING,
    P_HEAD,
    P_DRAIN, /* reading the rest of a small response dropped for a retry */
    P_BODY
} proxy_state_t;

struct ric_proxy_s {
    ric_conn_t *c;
    ric_upstream_t *up;
    ric_peer_t *peer;
    ric_upconn_t *uc;
    proxy_state_t state;
    int reused;

    /* the request as sent upstream: head built once, body from c->body */
    u_char *req;
    size_t req_len;
    size_t req_size;
    uint64_t sent; /* head and body bytes written */

    /* the response: head parsed from buf, then body bytes relayed from it */
    u_char *buf;
    size_t buf_len;
    size_t relay_start; /* buf[relay_start, relay_end) still goes to the client */
    size_t relay_end;
    ric_http_msg_t resp;
    ric_http_chunked_t chunked;
    uint64_t body_left;
    int dechunk;    /* HTTP/1.0 client: chunked body decoded, close-delimited */
    int resp_done;  /* the upstream's response ended */
    int reusable;   /* the upstream connection may carry another request */
    int reading_paused;
    int early_answer; /* the upstream answered before taking the whole request */

    ric_access_entry_t entry;
    int64_t attempt_start_us;

    /* retries (DESIGN §1–3) */
    ric_retry_policy_t policy;
    int attempt;           /* the current attempt, from 1 */
    int64_t deadline_ms;   /* the request's deadline (monotonic ms) */
    int64_t deadline_span_ms; /* min(retry_timeout, the client's own) */
    int replay_safe;
    int body_replayable;
    ric_peer_t *prev_peer; /* a retry prefers another server */
    int64_t wait_us;       /* the wait before the current attempt */
    struct event try_timer;  /* per_try_timeout, bounded by the deadline */
    struct event wait_timer; /* the backoff before the next attempt */
    char minted_key[40];     /* idempotency_key auto: one key for every attempt */

    /* the last response dropped for a retry, when it arrived whole: if the
     * retries that follow get no response at all, the client gets this one
     * (DESIGN §1.5: the final answer is the upstream's) */
    u_char *kept;
    size_t kept_len;
    ric_http_msg_t kept_resp;
    ric_peer_t *kept_peer;
    int drain_extended; /* the wait ended; the drain got DRAIN_GRACE_MS more */
    int waiting;        /* between attempts: no attempt is in progress */
    int64_t wait_until_ms;

    /* a body too large to hold for replay streams through: its bytes wait
     * here (framed as chunks when the client sent chunks) until written */
    int streaming;
    int stream_chunked;
    int stream_done;   /* the client's body ended; its terminator is staged */
    int send_blocked;  /* a write waits for the upstream socket */
    u_char *stage;
    size_t stage_len;
    size_t stage_sent;
    size_t stage_size;
};

#define STAGE_HIGH_WATER (64 * 1024) /* above it the client is not read */

static void on_upstream_read(ric_upconn_t *uc, short what);
static void on_upstream_write(ric_upconn_t *uc, short what);
static void relay(ric_proxy_t *p);
static void attempt_start(ric_proxy_t *p);
static void deliver_kept(ric_proxy_t *p);
static void deliver(ric_proxy_t *p);
static void write_access_log(ric_proxy_t *p, int status);
static void proxy_free(ric_proxy_t *p);

/* per_try_timeout, bounded by what is left of the request's deadline. */
static void
arm_try_timer(ric_proxy_t *p)
{
    int64_t ms = ric_min(p->c->settings->per_try_timeout,
                         ric_max(p->deadline_ms - ric_now_ms(), (int64_t) 1));
    struct timeval tv;

    tv.tv_sec = (time_t) (ms / 1000);
    tv.tv_usec = (suseconds_t) (ms % 1000) * 1000;
    event_add(&p->try_timer, &tv);
}

/* --- output buffer helpers ------------------------------------------------ */

static void
req_reserve(ric_proxy_t *p, size_t n)
{
    if (p->req_len + n > p->req_size) {
        p->req_size = ric_max(p->req_size * 2, p->req_len + n + 256);
        p->req = ric_xrealloc(p->req, p->req_size);
    }
}

static void
req_put(ric_proxy_t *p, const void *s, size_t n)
{
    req_reserve(p, n);
    memcpy(p->req + p->req_len, s, n);
    p->req_len += n;
}

static void
req_puts(ric_proxy_t *p, const char *s)
{
    req_put(p, s, strlen(s));
}

static ric_str_t
field_value(const ric_conn_t *c, const ric_http_msg_t *m, unsigned i)
{
    return ric_http_span(c->in, m->fields[i].value_off, m->fields[i].value_len);
}

static ric_str_t
field_name(const u_char *buf, const ric_http_msg_t *m, unsigned i)
{
    return ric_http_span(buf, m->fields[i].name_off, m->fields[i].name_len);
}

/* --- hop-by-hop fields ----------------------------------------------------- */

typedef struct {
    ric_str_t tokens[MAX_CONN_TOKENS];
    int n;
} conn_tokens_t;

/* Collects the field names a message's Connection fields list: they are
 * hop-by-hop too (RFC 9110 §7.6.1). */
static void
collect_connection_tokens(const u_char *buf, const ric_http_msg_t *m, conn_tokens_t *t)
{
    unsigned i;
    const u_char *s, *e, *start;

    t->n = 0;
    for (i = 0; i < m->nfields; i++) {
        if (!ric_str_eq_lower(field_name(buf, m, i), "connection")) {
            continue;
        }
        s = buf + m->fields[i].value_off;
        e = s + m->fields[i].value_len;
        while (s < e && t->n < MAX_CONN_TOKENS) {
            while (s < e && (*s == ',' || *s == ' ' || *s == '\t')) {
                s++;
            }
            start = s;
            while (s < e && *s != ',' && *s != ' ' && *s != '\t') {
                s++;
            }
            if (s > start) {
                t->tokens[t->n].data = start;
                t->tokens[t->n].len = (size_t) (s - start);
                t->n++;
            }
        }
    }
}

static int
span_eq_nocase(ric_str_t a, ric_str_t b)
{
    size_t i;

    if (a.len != b.len) {
        return 0;
    }
    for (i = 0; i < a.len; i++) {
        u_char x = a.data[i], y = b.data[i];
        if ((x | 0x20) != (y | 0x20)) {
            return 0;
        }
    }
    return 1;
}

static int
is_hop_by_hop(ric_str_t name, const conn_tokens_t *t)
{
    int i;

    if (ric_str_eq_lower(name, "connection") || ric_str_eq_lower(name, "keep-alive")
        || ric_str_eq_lower(name, "te") || ric_str_eq_lower(name, "trailer")
        || ric_str_eq_lower(name, "upgrade") || ric_str_eq_lower(name, "proxy-connection")
        || ric_str_eq_lower(name, "proxy-authenticate")
        || ric_str_eq_lower(name, "proxy-authorization")) {
        return 1;
    }
    for (i = 0; i < t->n; i++) {
        if (span_eq_nocase(name, t->tokens[i])) {
            return 1;
        }
    }
    return 0;
}

/* --- the upstream request -------------------------------------------------- */

static ric_str_t
request_host(const ric_conn_t *c)
{
    ric_str_t h = ric_null_string;

    if (c->msg.host_index >= 0) {
        h = field_value(c, &c->msg, (unsigned) c->msg.host_index);
    }
    return h;
}

static void
put_xff(ric_proxy_t *p)
{
    const ric_conn_t *c = p->c;
    unsigned i;
    int any = 0;

    for (i = 0; i < c->msg.nfields; i++) {
        if (ric_str_eq_lower(field_name(c->in, &c->msg, i), "x-forwarded-for")) {
            ric_str_t v = field_value(c, &c->msg, i);
            if (any) {
                req_puts(p, ", ");
            }
            req_put(p, v.data, v.len);
            any = 1;
        }
    }
    if (any) {
        req_puts(p, ", ");
    }
    req_puts(p, c->peer_ip);
}

static void
put_template(ric_proxy_t *p, const ric_template_part_t *part)
{
    const ric_conn_t *c = p->c;
    ric_str_t v;
    unsigned i;

    for (; part; part = part->next) {
        switch (part->var) {
        case RIC_VAR_LITERAL:
            req_put(p, part->text, part->len);
            break;
        case RIC_VAR_HOST:
            v = request_host(c);
            if (v.len == 0 && c->server->nnames > 0) {
                /* no Host (HTTP/1.0): the server's first name, as in nginx */
                v.data = (const u_char *) c->server->names[0];
                v.len = strlen(c->server->names[0]);
            }
            if (v.len > 0 && v.data[0] == '[') {
                const u_char *rb = memchr(v.data, ']', v.len);
                v.len = rb ? (size_t) (rb - v.data) + 1 : v.len;
            } else {
                const u_char *colon = memchr(v.data, ':', v.len);
                v.len = colon ? (size_t) (colon - v.data) : v.len;
            }
            if (v.len > 0 && v.data[v.len - 1] == '.') {
                v.len--; /* "example.com." is example.com */
            }
            for (i = 0; i < v.len; i++) {
                u_char ch = v.data[i];
                ch = (ch >= 'A' && ch <= 'Z') ? ch | 0x20 : ch;
                req_put(p, &ch, 1);
            }
            break;
        case RIC_VAR_HTTP_HOST:
            v = request_host(c);
            req_put(p, v.data, v.len);
            break;
        case RIC_VAR_REMOTE_ADDR:
            req_puts(p, c->peer_ip);
            break;
        case RIC_VAR_REMOTE_PORT:
            req_puts(p, c->peer_port);
            break;
        case RIC_VAR_SCHEME:
            req_puts(p, "http");
            break;
        case RIC_VAR_PROXY_HOST:
            req_puts(p, p->up->conf->host_header);
            break;
        case RIC_VAR_REQUEST_URI:
            req_put(p, c->in + c->msg.target_off, c->msg.target_len);
            break;
        case RIC_VAR_REQUEST_METHOD:
            req_put(p, c->in + c->msg.method_off, c->msg.method_len);
            break;
        case RIC_VAR_PROXY_ADD_XFF:
            put_xff(p);
            break;
        case RIC_VAR_HTTP:
            for (i = 0; i < c->msg.nfields; i++) {
                ric_str_t n = field_name(c->in, &c->msg, i);
                ric_str_t want = { (const u_char *) part->text, part->len };
                if (span_eq_nocase(n, want)) {
                    v = field_value(c, &c->msg, i);
                    req_put(p, v.data, v.len);
                    break;
                }
            }
            break;
        }
    }
}

static int
name_is(ric_str_t name, const char *want)
{
    ric_str_t w;

    if (want == NULL || want[0] == '\0') {
        return 0;
    }
    w.data = (const u_char *) want;
    w.len = strlen(want);
    return span_eq_nocase(name, w);
}

static const ric_header_set_t *
find_set_header(const ric_header_set_t *h, ric_str_t name)
{
    for (; h; h = h->next) {
        ric_str_t n = { (const u_char *) h->name, strlen(h->name) };
        if (span_eq_nocase(n, name)) {
            return h;
        }
    }
    return NULL;
}

/* The request line target: origin-form as received; absolute-form reduced
 * to its path and query (the upstream gets Host separately). */
static ric_str_t
upstream_target(const ric_conn_t *c)
{
    ric_str_t t = ric_http_span(c->in, c->msg.target_off, c->msg.target_len);
    const u_char *s, *e = t.data + t.len;

    if (t.len == 0 || t.data[0] == '/' || t.data[0] == '*') {
        return t;
    }
    s = memchr(t.data, ':', t.len);
    if (s == NULL || s + 3 > e) {
        return t;
    }
    s += 3; /* past "://" */
    while (s < e && *s != '/' && *s != '?') {
        s++;
    }
    if (s == e) {
        static const u_char slash[] = "/";
        t.data = slash;
        t.len = 1;
        return t;
    }
    t.len = (size_t) (e - s);
    t.data = s;
    return t;
}

static void
build_request(ric_proxy_t *p)
{
    const ric_conn_t *c = p->c;
    const ric_http_msg_t *m = &c->msg;
    const ric_http_refs_t *refs = &c->location->refs;
    const ric_header_set_t *sets = refs->headers, *h;
    conn_tokens_t tokens;
    ric_str_t name, v, target = upstream_target(c);
    char num[32];
    unsigned i;
    int has_length = 0;

    p->req_len = 0;
    req_reserve(p, m->head_len + 256);
    req_put(p, c->in + m->method_off, m->method_len);
    req_puts(p, " ");
    if (target.len > 0 && target.data[0] == '?') {
        req_puts(p, "/"); /* "http://host?q" has an empty path: "/?q" */
    }
    req_put(p, target.data, target.len);
    req_puts(p, " HTTP/1.1\r\n");

    /* Host first, as RFC 9112 §3.2 asks */
    name.data = (const u_char *) "Host";
    name.len = 4;
    h = find_set_header(sets, name);
    if (h == NULL) {
        req_puts(p, "Host: ");
        req_puts(p, p->up->conf->host_header);
        req_puts(p, "\r\n");
    }

    collect_connection_tokens(c->in, m, &tokens);
    for (i = 0; i < m->nfields; i++) {
        name = field_name(c->in, m, i);
        if (is_hop_by_hop(name, &tokens) || ric_str_eq_lower(name, "host")
            || ric_str_eq_lower(name, "x-forwarded-for")
            || ric_str_eq_lower(name, "x-forwarded-proto")
            || ric_str_eq_lower(name, "transfer-encoding") || ric_str_eq_lower(name, "expect")
            || find_set_header(sets, name) != NULL || name_is(name, refs->client_deadline_header)
            || name_is(name, refs->retry_attempt_header)) {
            continue;
        }
        if (ric_str_eq_lower(name, "content-length")) {
            has_length = 1;
            continue; /* rewritten below from what was read */
        }
        v = field_value(c, m, i);
        req_put(p, name.data, name.len);
        req_puts(p, ": ");
        req_put(p, v.data, v.len);
        req_puts(p, "\r\n");
    }

    name.data = (const u_char *) "X-Forwarded-For";
    name.len = 15;
    if (find_set_header(sets, name) == NULL) {
        req_puts(p, "X-Forwarded-For: ");
        put_xff(p);
        req_puts(p, "\r\n");
    }
    name.data = (const u_char *) "X-Forwarded-Proto";
    name.len = 17;
    if (find_set_header(sets, name) == NULL) {
        req_puts(p, "X-Forwarded-Proto: http\r\n");
    }
    for (h = sets; h; h = h->next) {
        size_t mark = p->req_len, value_start;
        req_puts(p, h->name);
        req_puts(p, ": ");
        value_start = p->req_len;
        put_template(p, h->value);
        if (p->req_len == value_start) {
            p->req_len = mark; /* an empty value drops the field, as in nginx */
            continue;
        }
        req_puts(p, "\r\n");
    }
    if (p->streaming && p->stream_chunked) {
        req_puts(p, "Transfer-Encoding: chunked\r\n");
    } else if (p->streaming) {
        snprintf(num, sizeof(num), "%llu", (unsigned long long) m->content_length);
        req_puts(p, "Content-Length: ");
        req_puts(p, num);
        req_puts(p, "\r\n");
    } else if (m->body != RIC_BODY_NONE || has_length) {
        /* a chunked body goes upstream with its length, now known */
        snprintf(num, sizeof(num), "%llu", (unsigned long long) ric_body_size(&c->body));
        req_puts(p, "Content-Length: ");
        req_puts(p, num);
        req_puts(p, "\r\n");
    }
    if (p->up->conf->keepalive <= 0) {
        req_puts(p, "Connection: close\r\n");
    }
    if (refs->retry_attempt_header[0] != '\0') {
        snprintf(num, sizeof(num), ": %d\r\n", p->attempt);
        req_puts(p, refs->retry_attempt_header);
        req_puts(p, num);
    }
    /* the upstream learns how long the client will still wait */
    snprintf(num, sizeof(num), ": %lld\r\n",
             (long long) ric_max(p->deadline_ms - ric_now_ms(), (int64_t) 0));
    req_puts(p, refs->client_deadline_header);
    req_puts(p, num);
    if (p->minted_key[0] != '\0') {
        req_puts(p, refs->idempotency_key_header);
        req_puts(p, ": ");
        req_puts(p, p->minted_key);
        req_puts(p, "\r\n");
    }
    req_puts(p, "\r\n");
    if (p->streaming && p->stream_chunked && ric_body_size(&c->body) > 0) {
        /* what was held before streaming began goes first, as one chunk;
         * its closing CRLF opens the stage */
        snprintf(num, sizeof(num), "%llx\r\n", (unsigned long long) ric_body_size(&c->body));
        req_puts(p, num);
    }
}

/* --- the end of an exchange ------------------------------------------------ */

static void
record_attempt(ric_proxy_t *p, const char *class, int status)
{
    ric_attempt_t *a;

    p->entry.attempts_total++;
    if (p->entry.nattempts >= RIC_MAX_ATTEMPTS) {
        /* a long schedule keeps its first attempts and its latest one */
        p->entry.nattempts = RIC_MAX_ATTEMPTS - 1;
    }
    a = &p->entry.attempts[p->entry.nattempts++];
    a->server = p->peer ? p->peer->conf->addr_text : NULL;
    a->class = class;
    a->status = status;
    a->duration_us = ric_now_us() - p->attempt_start_us;
    a->wait_us = p->wait_us;
}

static void
write_access_log(ric_proxy_t *p, int status)
{
    ric_conn_t *c = p->c;
    ric_access_entry_t *e = &p->entry;

    e->client = c->peer;
    e->method = ric_http_span(c->in, c->msg.method_off, c->msg.method_len);
    e->path = ric_http_span(c->in, c->msg.target_off, c->msg.target_len);
    e->host = request_host(c);
    e->status = status;
    e->duration_us = ric_now_us() - c->request_start_us;
    ric_access_log_write(c->location->refs.access_log, e);
}

static void
proxy_free(ric_proxy_t *p)
{
    event_del(&p->try_timer);
    event_del(&p->wait_timer);
    if (p->uc != NULL) {
        ric_upconn_close(p->uc);
    }
    p->c->proxy = NULL;
    free(p->req);
    free(p->buf);
    free(p->stage);
    free(p->kept);
    free(p);
}

static ric_retry_input_t
retry_input(ric_proxy_t *p, unsigned class, int status)
{
    ric_retry_input_t in;

    memset(&in, 0, sizeof(in));
    in.class = class;
    in.status = status;
    in.attempt = p->attempt;
    in.replay_safe = p->replay_safe;
    in.body_replayable = p->body_replayable;
    in.now_ms = ric_now_ms();
    in.deadline_ms = p->deadline_ms;
    return in;
}

/* Schedules the next attempt after the decided wait: always a timer. */
static void
schedule_retry(ric_proxy_t *p, const ric_retry_decision_t *d, const char *what)
{
    struct timeval tv;
    int draining = p->state == P_DRAIN;

    ric_log_error(RIC_LOG_WARN, 0, "retrying after %s: attempt %d%s%lld in %lldms, client: %s, "
                  "upstream: %s", what, p->attempt + 1, p->policy.attempts ? "/" : "",
                  (long long) p->policy.attempts, (long long) d->wait_ms, p->c->peer,
                  p->peer->conf->addr_text);
    event_del(&p->try_timer);
    if (p->uc != NULL && !draining) {
        ric_upconn_close(p->uc);
        p->uc = NULL;
    }
    p->prev_peer = p->peer;
    p->waiting = 1;
    p->wait_us = d->wait_ms * 1000;
    p->wait_until_ms = ric_now_ms() + d->wait_ms;
    tv.tv_sec = (time_t) (d->wait_ms / 1000);
    tv.tv_usec = (suseconds_t) (d->wait_ms % 1000) * 1000;
    event_add(&p->wait_timer, &tv);
}

/* An attempt ended without a response: retry it, or, when the decision says
 * no, the gateway answers itself (DESIGN §1.5: only when there is no
 * upstream answer): 504 after a timeout, 502 otherwise. */
static void
fail(ric_proxy_t *p, unsigned class, int err, const char *what)
{
    ric_conn_t *c = p->c;
    ric_retry_input_t in;
    ric_retry_decision_t d;
    int status;

    ric_log_error(RIC_LOG_ERR, err, "%s while %s, client: %s, upstream: %s, attempt: %d", what,
                  p->state == P_CONNECTING ? "connecting to upstream"
                  : p->state == P_SENDING ? "sending the request to upstream"
                  : "reading the response head from upstream",
                  c->peer, p->peer->conf->addr_text, p->attempt);
    ric_upstream_report(p->up, p->peer, 1, ric_now_ms());
    record_attempt(p, ric_retry_class_name(class), 0);

    in = retry_input(p, class, 0);
    d = ric_retry_decide(&p->policy, &in, &p->up->budget, ric_backoff_rand, NULL);
    if (d.retry) {
        schedule_retry(p, &d, ric_retry_class_name(class));
        return;
    }
    if (p->kept != NULL) {
        ric_log_error(RIC_LOG_INFO, 0, "passing on the last response (%d) after %d attempts "
                      "(%s), client: %s", p->kept_resp.status, p->attempt, d.reason, c->peer);
        deliver_kept(p);
        return;
    }
    status = class == RIC_CLASS_TIMEOUT || (class == RIC_CLASS_CONNECT_ERROR && err == 0)
                 ? 504 : 502;
    if (p->attempt > 1) {
        ric_log_error(RIC_LOG_ERR, 0, "giving up after %d attempts (%s), client: %s",
                      p->attempt, d.reason, c->peer);
    }
    ric_conn_respond(c, status);
    p->entry.bytes = c->out_len;
    p->entry.upstream = p->peer->conf->addr_text; /* the last one tried, as nginx logs it */
    write_access_log(p, status);
    proxy_free(p);
    ric_conn_continue(c);
}

/* The upstream broke after the response head went out: the client's
 * response is cut short, so its connection closes. */
static void
abort_client(ric_proxy_t *p, int err, const char *what, int client_gone)
{
    ric_conn_t *c = p->c;
    ric_retry_input_t in = retry_input(p, RIC_CLASS_RESET, 0);

    /* part of the answer is out: the decision can only be no (DESIGN §1.3) */
    in.response_started = 1;
    ric_assert(!ric_retry_decide(&p->policy, &in, NULL, ric_backoff_rand, NULL).retry);

    /* a client that went away is the client's business, not an error */
    ric_log_error(client_gone ? RIC_LOG_INFO : RIC_LOG_ERR, err,
                  "%s while sending the response, client: %s, upstream: %s", what, c->peer,
                  p->peer->conf->addr_text);
    write_access_log(p, p->resp.status);
    proxy_free(p);
    ric_conn_close(c);
}

static void
finish(ric_proxy_t *p)
{
    ric_conn_t *c = p->c;

    write_access_log(p, p->resp.status);
    if (p->uc != NULL && p->reusable && p->resp.keep_alive) {
        p->uc->requests++;
        ric_upstream_pool_put(p->uc);
        p->uc = NULL;
    }
    proxy_free(p);
    ric_conn_proxy_done(c);
}

int
ric_proxy_responding(const ric_proxy_t *p)
{
    return p->state == P_BODY;
}

int
ric_proxy_answered(const ric_proxy_t *p)
{
    return p->state > P_SENDING;
}

void
ric_proxy_discard(ric_proxy_t *p)
{
    proxy_free(p);
}

void
ric_proxy_abort(ric_proxy_t *p)
{
    if (p->state == P_BODY) {
        write_access_log(p, p->resp.status); /* cut short, as the log's bytes show */
    } else {
        if (!p->waiting && p->peer != NULL) {
            record_attempt(p, "client_closed", 0); /* the attempt under way */
        }
        if (p->peer != NULL) {
            p->entry.upstream = p->peer->conf->addr_text;
        }
        write_access_log(p, 499);
    }
    proxy_free(p);
}

/* --- response body framing ------------------------------------------------ */

/* Runs the framing over buf[from, buf_len): extends the relay region and
 * notes the end of the response. RIC_ERROR on broken framing. */
static int
scan_body(ric_proxy_t *p, size_t from)
{
    size_t avail = p->buf_len - from, take, w;
    const u_char *pos, *end, *data;
    size_t dlen;
    int rc;

    switch (p->resp.body) {
    case RIC_BODY_NONE:
        p->relay_end = from;
        p->resp_done = 1;
        if (avail > 0) {
            p->reusable = 0; /* bytes after a response that has no body */
        }
        return RIC_OK;
    case RIC_BODY_CLOSE:
        p->relay_end = p->buf_len;
        return RIC_OK;
    case RIC_BODY_LENGTH:
        take = (size_t) ric_min((uint64_t) avail, p->body_left);
        p->body_left -= take;
        p->relay_end = from + take;
        if (p->body_left == 0) {
            p->resp_done = 1;
            if (avail > take) {
                p->reusable = 0; /* more than Content-Length: never reuse */
            }
        }
        return RIC_OK;
    case RIC_BODY_CHUNKED:
        break;
    }

    pos = p->buf + from;
    end = p->buf + p->buf_len;
    w = from; /* where decoded data goes when dechunking (in place) */
    for (;;) {
        rc = ric_http_chunked_next(&p->chunked, &pos, end, &data, &dlen);
        if (rc == RIC_OK) {
            if (p->dechunk) {
                memmove(p->buf + w, data, dlen);
                w += dlen;
            }
            continue;
        }
        break;
    }
    if (rc == RIC_ERROR) {
        return RIC_ERROR;
    }
    p->relay_end = p->dechunk ? w : (size_t) (pos - p->buf);
    if (rc == RIC_DONE) {
        p->resp_done = 1;
        if (pos < end) {
            p->reusable = 0;
        }
    }
    return RIC_OK;
}

/* --- the response head ----------------------------------------------------- */

static void
build_client_head(ric_proxy_t *p)
{
    ric_conn_t *c = p->c;
    const ric_http_msg_t *r = &p->resp;
    conn_tokens_t tokens;
    char line[64];
    unsigned i;
    int n;

    n = snprintf(line, sizeof(line), "HTTP/1.1 %03d ", r->status);
    c->out_len = c->out_sent = 0;
    ric_conn_out_append(c, line, (size_t) n);
    ric_conn_out_append(c, p->buf + r->reason_off, r->reason_len);
    ric_conn_out_append(c, "\r\n", 2);

    collect_connection_tokens(p->buf, r, &tokens);
    for (i = 0; i < r->nfields; i++) {
        ric_str_t name = field_name(p->buf, r, i);
        if (is_hop_by_hop(name, &tokens)
            || ((p->dechunk || c->msg.version == 10)
                && ric_str_eq_lower(name, "transfer-encoding"))) {
            continue;
        }
        /* name, ": ", value are contiguous in what the upstream sent only
         * up to OWS, so copy the parts */
        ric_conn_out_append(c, name.data, name.len);
        ric_conn_out_append(c, ": ", 2);
        ric_conn_out_append(c, p->buf + r->fields[i].value_off, r->fields[i].value_len);
        ric_conn_out_append(c, "\r\n", 2);
    }
    if (c->close_after) {
        ric_conn_out_append(c, "Connection: close\r\n", 19);
    } else if (c->msg.version == 10) {
        ric_conn_out_append(c, "Connection: keep-alive\r\n", 24);
    }
    ric_conn_out_append(c, "\r\n", 2);
}

/* A response whose status is worth a retry: decide, and when retrying,
 * drop it — its connection is kept only if the whole response is already
 * here, never reused half-read. Returns 1 when a retry was scheduled. */
/* A dropped response that arrived whole: keep it as the answer of last
 * resort, and its connection when the upstream allows. */
static void
keep_response(ric_proxy_t *p)
{
    u_char *spare = p->kept;

    p->kept = p->buf;
    p->kept_len = p->relay_end;
    p->kept_resp = p->resp;
    p->kept_peer = p->peer;
    p->buf = spare != NULL ? spare : ric_xmalloc(PROXY_BUF_SIZE);
    if (p->reusable && p->resp.keep_alive) {
        ric_upstream_pool_put(p->uc);
        p->uc = NULL;
    }
}

static int
retry_on_status(ric_proxy_t *p)
{
    ric_retry_input_t in;
    ric_retry_decision_t d;
    ric_str_t ra;
    char what[32];
    int status = p->resp.status, rc;

    if (!ric_retry_on_match(p->policy.retry_on, RIC_CLASS_STATUS, status)) {
        ric_upstream_report(p->up, p->peer, 0, ric_now_ms());
        return 0;
    }
    ric_upstream_report(p->up, p->peer, 1, ric_now_ms());
    in = retry_input(p, RIC_CLASS_STATUS, status);
    ra = ric_http_field(&p->resp, p->buf, "retry-after");
    if (ra.data != NULL
        && ric_retry_after_parse(ra.data, ra.len, time(NULL), &in.retry_after_ms) == RIC_OK) {
        in.has_retry_after = 1;
    }
    d = ric_retry_decide(&p->policy, &in, &p->up->budget, ric_backoff_rand, NULL);
    if (!d.retry) {
        if (p->attempt > 1 || strcmp(d.reason, "final status") != 0) {
            ric_log_error(RIC_LOG_INFO, 0, "passing on %d from upstream after %d attempt%s "
                          "(%s), client: %s", status, p->attempt, p->attempt > 1 ? "s" : "",
                          d.reason, p->c->peer);
        }
        return 0;
    }
    record_attempt(p, "status", status);
    p->body_left = p->resp.content_length;
    ric_http_chunked_init(&p->chunked);
    p->dechunk = 0;
    p->reusable = !p->early_answer;
    snprintf(what, sizeof(what), "status %d", status);
    p->relay_end = p->resp.head_len;
    rc = scan_body(p, p->resp.head_len);
    if (rc == RIC_OK && p->resp_done) {
        keep_response(p);
    } else if (rc == RIC_OK && p->resp.body != RIC_BODY_CLOSE
               && (p->resp.body == RIC_BODY_CHUNKED
                   || p->resp.head_len + p->resp.content_length <= PROXY_BUF_SIZE)) {
        /* small: go on reading it during the wait, to keep it; whatever
         * has not arrived when the wait ends is dropped with its connection */
        p->state = P_DRAIN;
    }
    schedule_retry(p, &d, what);
    return 1;
}

static void read_drain_more(ric_proxy_t *p);

/* More of a response dropped for a retry, read during the wait (and at
 * most DRAIN_GRACE_MS after it): kept when whole; dropped, with its
 * connection, when broken or too big. */
static void
read_drain(ric_proxy_t *p)
{
    read_drain_more(p);
    if (p->uc == NULL && p->drain_extended) {
        /* the wait was over and only this read held the retry back */
        event_del(&p->wait_timer);
        attempt_start(p);
    }
}

static void
read_drain_more(ric_proxy_t *p)
{
    size_t from = p->buf_len;
    ssize_t n;

    n = recv(p->uc->fd, p->buf + p->buf_len, PROXY_BUF_SIZE - p->buf_len, 0);
    if (n == -1 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        return;
    }
    if (n > 0) {
        p->buf_len += (size_t) n;
        if (scan_body(p, from) == RIC_OK) {
            if (p->resp_done) {
                keep_response(p);
                if (p->uc != NULL) {
                    ric_upconn_close(p->uc);
                    p->uc = NULL;
                }
                return;
            }
            if (p->buf_len < PROXY_BUF_SIZE) {
                return;
            }
        }
    }
    ric_upconn_close(p->uc);
    p->uc = NULL;
}

static void
got_head(ric_proxy_t *p)
{
    if (retry_on_status(p)) {
        return;
    }
    record_attempt(p, "status", p->resp.status);
    deliver(p);
}

/* Gives up on the attempts: the response kept from an earlier one goes to
 * the client as it came. */
static void
deliver_kept(ric_proxy_t *p)
{
    u_char *b = p->buf;

    if (p->uc != NULL) {
        ric_upconn_close(p->uc);
        p->uc = NULL;
    }
    p->buf = p->kept;
    p->kept = b;
    p->buf_len = p->kept_len;
    p->resp = p->kept_resp;
    p->peer = p->kept_peer;
    p->resp_done = 0;
    deliver(p);
}

/* Sends the response head in p->resp and streams its body to the client. */
static void
deliver(ric_proxy_t *p)
{
    ric_conn_t *c = p->c;
    const ric_http_settings_t *s = c->settings;

    event_del(&p->try_timer); /* per_try_timeout runs until the response head */
    event_del(&p->wait_timer);
    p->entry.upstream = p->peer->conf->addr_text;
    p->state = P_BODY;
    p->reusable = !p->early_answer;
    p->body_left = p->resp.content_length;
    ric_http_chunked_init(&p->chunked);
    p->dechunk = p->resp.body == RIC_BODY_CHUNKED && c->msg.version == 10;
    p->relay_start = p->resp.head_len;
    p->relay_end = p->resp.head_len;
    if (scan_body(p, p->resp.head_len) != RIC_OK) {
        /* nothing has reached the client yet: it gets a clean 502 */
        p->state = P_HEAD;
        p->reusable = 0;
        p->entry.nattempts--;
        p->entry.attempts_total--;
        fail(p, RIC_CLASS_BAD_RESPONSE, 0, "upstream sent an invalid chunked body");
        return;
    }
    c->status = p->resp.status;
    if (!c->msg.keep_alive || c->worker->shutting_down || s->keepalive_timeout == 0
        || c->requests + 1 >= s->keepalive_requests || p->resp.body == RIC_BODY_CLOSE
        || p->dechunk) {
        c->close_after = 1;
    }
    if (p->streaming && !p->stream_done) {
        /* answered before the body ended: the rest of it is never read */
        c->close_after = 1;
        c->linger = 1;
    }
    if (p->uc != NULL) {
        /* the body's pace: proxy_read_timeout between reads, whatever came before */
        ric_upconn_read_timeout(p->uc, s->proxy_read_timeout);
    }
    build_client_head(p);
    relay(p);
}

static void
read_head(ric_proxy_t *p)
{
    ric_upconn_t *uc = p->uc;
    ssize_t n;
    int rc;

    n = recv(uc->fd, p->buf + p->buf_len, PROXY_BUF_SIZE - p->buf_len, 0);
    if (n == 0) {
        fail(p, RIC_CLASS_RESET, 0, "upstream closed the connection before a complete response head");
        return;
    }
    if (n == -1) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            return;
        }
        fail(p, RIC_CLASS_RESET, errno, "recv() failed");
        return;
    }
    p->buf_len += (size_t) n;
    if (p->state == P_SENDING) {
        /* an answer is coming while the request still goes up: from now
         * on the upstream's pace is watched, so a stalled head cannot hang */
        ric_upconn_read_timeout(uc, p->c->settings->proxy_read_timeout);
    }

    for (;;) {
        rc = ric_http_parse_response(&p->resp, p->buf, p->buf_len, p->c->msg.method);
        if (rc == RIC_AGAIN) {
            if (p->buf_len == PROXY_BUF_SIZE) {
                fail(p, RIC_CLASS_BAD_RESPONSE, 0, "upstream sent too big a response head");
            }
            return;
        }
        if (rc == RIC_ERROR) {
            ric_log_error(RIC_LOG_ERR, 0, "upstream sent an invalid response: %s, client: %s, "
                          "upstream: %s", p->resp.error_reason ? p->resp.error_reason : "?",
                          p->c->peer, p->peer->conf->addr_text);
            fail(p, RIC_CLASS_BAD_RESPONSE, 0, "upstream sent an invalid response");
            return;
        }
        if (p->resp.status >= 100 && p->resp.status < 200) {
            if (p->resp.status == 101) {
                fail(p, RIC_CLASS_BAD_RESPONSE, 0, "upstream switched protocols unasked");
                return;
            }
            /* interim responses (103 Early Hints...) are not passed on */
            memmove(p->buf, p->buf + p->resp.head_len, p->buf_len - p->resp.head_len);
            p->buf_len -= p->resp.head_len;
            ric_http_msg_init(&p->resp);
            continue;
        }
        if (p->state == P_SENDING) {
            /* a final answer before the whole request went up (413, 401...):
             * stop sending; the connection is not reused */
            event_del(&uc->wev);
            p->early_answer = 1;
            p->state = P_HEAD;
            ric_conn_body_answered(p->c);
        }
        got_head(p);
        return;
    }
}

/* --- relaying the body ------------------------------------------------------ */

static void
relay(ric_proxy_t *p)
{
    ric_conn_t *c = p->c;
    struct iovec iov[2];
    int iovcnt;
    ssize_t n;
    size_t head_left, body_left;
    struct timeval tv;

    for (;;) {
        head_left = c->out_len - c->out_sent;
        body_left = p->relay_end - p->relay_start;
        if (head_left == 0 && body_left == 0) {
            break;
        }
        iovcnt = 0;
        if (head_left) {
            iov[iovcnt].iov_base = c->out + c->out_sent;
            iov[iovcnt++].iov_len = head_left;
        }
        if (body_left) {
            iov[iovcnt].iov_base = p->buf + p->relay_start;
            iov[iovcnt++].iov_len = body_left;
        }
        n = writev(c->fd, iov, iovcnt);
        if (n == -1) {
            if (errno == EINTR) {
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                /* a slow client: stop reading the upstream until it drains,
                 * so memory stays at one buffer */
                if (!p->reading_paused && p->uc != NULL) {
                    /* also when the response is all here: an upstream that
                     * closes now must not look like one that broke off */
                    ric_upconn_reading(p->uc, 0, 0);
                    p->reading_paused = 1;
                }
                tv.tv_sec = (time_t) (c->settings->send_timeout / 1000);
                tv.tv_usec = (suseconds_t) (c->settings->send_timeout % 1000) * 1000;
                event_add(c->wev, &tv);
                return;
            }
            abort_client(p, errno, "writev() to the client failed", 1);
            return;
        }
        p->entry.bytes += (uint64_t) n;
        if ((size_t) n >= head_left) {
            c->out_sent = c->out_len;
            p->relay_start += (size_t) n - head_left;
        } else {
            c->out_sent += (size_t) n;
        }
    }

    c->out_len = c->out_sent = 0;
    if (p->resp_done) {
        finish(p);
        return;
    }
    /* everything relayed: the buffer is free for the next read */
    p->buf_len = p->relay_start = p->relay_end = 0;
    if (p->reading_paused) {
        p->reading_paused = 0;
        ric_upconn_reading(p->uc, 1, c->settings->proxy_read_timeout);
    }
}

void
ric_proxy_client_writable(ric_proxy_t *p)
{
    if (p->state == P_BODY) {
        relay(p);
    }
}

static void
read_body(ric_proxy_t *p)
{
    ric_upconn_t *uc = p->uc;
    size_t from = p->buf_len;
    ssize_t n;

    if (p->resp_done || p->buf_len == PROXY_BUF_SIZE) {
        /* nothing more is wanted, or no room: wait for the client */
        if (!p->reading_paused) {
            ric_upconn_reading(uc, 0, 0);
            p->reading_paused = 1;
        }
        return;
    }

    n = recv(uc->fd, p->buf + p->buf_len, PROXY_BUF_SIZE - p->buf_len, 0);
    if (n == 0) {
        if (p->resp.body == RIC_BODY_CLOSE) {
            p->resp_done = 1;
            p->reusable = 0;
            relay(p);
            return;
        }
        abort_client(p, 0, "upstream closed the connection before the end of the body", 0);
        return;
    }
    if (n == -1) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
            return;
        }
        abort_client(p, errno, "recv() failed", 0);
        return;
    }
    p->buf_len += (size_t) n;
    if (scan_body(p, from) != RIC_OK) {
        abort_client(p, 0, "upstream sent an invalid chunked body", 0);
        return;
    }
    relay(p);
}

/* --- upstream events ------------------------------------------------------- */

static void
on_upstream_read(ric_upconn_t *uc, short what)
{
    ric_proxy_t *p = uc->owner;

    if (p->state == P_DRAIN) {
        if (what & EV_TIMEOUT) {
            ric_upconn_close(p->uc);
            p->uc = NULL;
            if (p->drain_extended) {
                event_del(&p->wait_timer);
                attempt_start(p);
            }
        } else {
            read_drain(p);
        }
        return;
    }
    if (what & EV_TIMEOUT) {
        if (p->state == P_BODY) {
            abort_client(p, 0, "upstream timed out (proxy_read_timeout)", 0);
        } else {
            fail(p, RIC_CLASS_TIMEOUT, 0, "upstream timed out (proxy_read_timeout)");
        }
        return;
    }
    switch (p->state) {
    case P_CONNECTING:
        return; /* the write event reports the connect */
    case P_SENDING:
        /* bytes while the request still goes up: an interim 1xx (sending
         * goes on) or an early final answer (read_head stops the sending) */
        read_head(p);
        return;
    case P_HEAD:
        read_head(p);
        return;
    case P_DRAIN:
        read_drain(p);
        return;
    case P_BODY:
        read_body(p);
        return;
    }
}

/* A write to the upstream returned -1: RIC_OK to write again (EINTR),
 * RIC_AGAIN when waiting for the socket, RIC_ERROR after failing the attempt. */
static int
write_failed(ric_proxy_t *p, const char *what)
{
    if (errno == EINTR) {
        return RIC_OK;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
        p->send_blocked = 1;
        ric_upconn_want_write(p->uc, p->c->settings->proxy_send_timeout);
        return RIC_AGAIN;
    }
    fail(p, RIC_CLASS_RESET, errno, what);
    return RIC_ERROR;
}

static void
send_request(ric_proxy_t *p)
{
    ric_conn_t *c = p->c;
    ric_upconn_t *uc = p->uc;
    const ric_body_t *b = &c->body;
    struct iovec iov[2];
    int iovcnt;
    ssize_t n;
    uint64_t total = p->req_len + ric_body_size(b), at;
    off_t off;

    while (p->sent < total) {
        at = p->sent;
        if (at < p->req_len + b->mem_len) {
            iovcnt = 0;
            if (at < p->req_len) {
                iov[iovcnt].iov_base = p->req + at;
                iov[iovcnt++].iov_len = p->req_len - (size_t) at;
                at = p->req_len;
            }
            if (b->mem_len > 0) {
                size_t m = (size_t) (at - p->req_len);
                iov[iovcnt].iov_base = b->mem + m;
                iov[iovcnt++].iov_len = b->mem_len - m;
            }
            n = writev(uc->fd, iov, iovcnt);
        } else {
            off = (off_t) (at - p->req_len - b->mem_len);
            n = sendfile(uc->fd, b->fd, &off, (size_t) ric_min(total - at, (uint64_t) 1 << 20));
            if (n == 0) {
                /* the temp file ended before its recorded length: never spin */
                errno = EIO;
                n = -1;
            }
        }
        if (n == -1) {
            if (write_failed(p, "sending the request failed") == RIC_OK) {
                continue;
            }
            return;
        }
        p->sent += (uint64_t) n;
    }
    p->send_blocked = 0;
    if (p->streaming) {
        while (p->stage_sent < p->stage_len) {
            n = send(uc->fd, p->stage + p->stage_sent, p->stage_len - p->stage_sent,
                     MSG_NOSIGNAL);
            if (n == -1) {
                if (write_failed(p, "sending the request body failed") == RIC_OK) {
                    continue;
                }
                return;
            }
            p->stage_sent += (size_t) n;
        }
        p->stage_len = p->stage_sent = 0;
        if (!p->stream_done) {
            /* drained: let the client send more */
            ric_conn_body_resume(c);
            return;
        }
        /* the client's upload pace is not the upstream's: the deadline and
         * per_try_timeout count from the end of a streamed body */
        p->deadline_ms = ric_now_ms() + p->deadline_span_ms;
        arm_try_timer(p);
    }
    p->state = P_HEAD;
    ric_upconn_read_timeout(uc, c->settings->proxy_read_timeout);
}

static void
stage_put(ric_proxy_t *p, const void *data, size_t n)
{
    if (p->stage_sent > 0) {
        /* drop what went out, so the stage holds only what is pending */
        memmove(p->stage, p->stage + p->stage_sent, p->stage_len - p->stage_sent);
        p->stage_len -= p->stage_sent;
        p->stage_sent = 0;
    }
    if (p->stage_len + n > p->stage_size) {
        p->stage_size = ric_max(p->stage_size * 2, p->stage_len + n + 1024);
        p->stage = ric_xrealloc(p->stage, p->stage_size);
    }
    memcpy(p->stage + p->stage_len, data, n);
    p->stage_len += n;
}

/* Sends what is staged when the upstream can take it: from the loop (as a
 * write event), never from inside the client's read that staged it. */
static void
stage_kick(ric_proxy_t *p)
{
    if (p->state == P_SENDING && !p->send_blocked
        && p->sent >= p->req_len + ric_body_size(&p->c->body)) {
        event_active(&p->uc->wev, EV_WRITE, 1);
    }
}

int
ric_proxy_body_data(ric_proxy_t *p, const u_char *data, size_t n)
{
    char line[32];
    int len;

    if (p->state > P_SENDING) {
        return 0; /* the upstream already answered: the rest is dropped */
    }
    if (p->stream_chunked) {
        len = snprintf(line, sizeof(line), "%zx\r\n", n);
        stage_put(p, line, (size_t) len);
    }
    stage_put(p, data, n);
    if (p->stream_chunked) {
        stage_put(p, "\r\n", 2);
    }
    stage_kick(p);
    return p->stage_len - p->stage_sent > STAGE_HIGH_WATER;
}

void
ric_proxy_body_done(ric_proxy_t *p)
{
    p->stream_done = 1;
    if (p->state > P_SENDING) {
        return;
    }
    if (p->stream_chunked) {
        stage_put(p, "0\r\n\r\n", 5);
    }
    stage_kick(p);
}

static void
on_upstream_write(ric_upconn_t *uc, short what)
{
    ric_proxy_t *p = uc->owner;
    int err;

    if (p->state == P_CONNECTING) {
        if (what & EV_TIMEOUT) {
            fail(p, RIC_CLASS_CONNECT_ERROR, 0, "upstream timed out (proxy_connect_timeout)");
            return;
        }
        err = ric_upconn_connect_result(uc);
        if (err != 0) {
            fail(p, RIC_CLASS_CONNECT_ERROR, err, "connect() failed");
            return;
        }
        p->state = P_SENDING;
        send_request(p);
        return;
    }
    if (p->state == P_SENDING) {
        if (what & EV_TIMEOUT) {
            fail(p, RIC_CLASS_TIMEOUT, 0, "upstream timed out (proxy_send_timeout)");
            return;
        }
        p->send_blocked = 0;
        send_request(p);
    }
}

/* --- attempts ----------------------------------------------------------------- */

static void
on_try_timeout(evutil_socket_t fd, short what, void *arg)
{
    ric_proxy_t *p = arg;

    (void) fd;
    (void) what;
    if (p->state == P_CONNECTING) {
        fail(p, RIC_CLASS_CONNECT_ERROR, 0, "upstream timed out (per_try_timeout)");
    } else {
        fail(p, RIC_CLASS_TIMEOUT, 0, "upstream timed out (per_try_timeout)");
    }
}

#define DRAIN_GRACE_MS 1000

/* No further attempt: the response kept from an earlier one, if any, is
 * the answer; otherwise the gateway's own 502 (no upstream answered). */
static void
give_up(ric_proxy_t *p, int status, const char *why)
{
    ric_conn_t *c = p->c;

    event_del(&p->wait_timer);
    ric_log_error(RIC_LOG_INFO, 0, "giving up after %d attempt%s (%s), client: %s", p->attempt,
                  p->attempt > 1 ? "s" : "", why, c->peer);
    if (p->kept != NULL) {
        deliver_kept(p);
        return;
    }
    ric_conn_respond(c, status);
    p->entry.bytes = c->out_len;
    if (p->peer != NULL) {
        p->entry.upstream = p->peer->conf->addr_text;
    }
    write_access_log(p, status);
    proxy_free(p);
    ric_conn_continue(c);
}

void
ric_proxy_shutdown(ric_proxy_t *p, int64_t deadline_ms)
{
    p->deadline_ms = ric_min(p->deadline_ms, deadline_ms);
    if (p->waiting && p->wait_until_ms >= p->deadline_ms) {
        give_up(p, 502, "the worker is shutting down");
    }
}

static void
on_wait_done(evutil_socket_t fd, short what, void *arg)
{
    ric_proxy_t *p = arg;
    int64_t grace;
    struct timeval tv;

    (void) fd;
    (void) what;
    if ((p->waiting || p->attempt == 0) && ric_now_ms() >= p->deadline_ms) {
        /* a client that allowed no time at all gets its 504 without bothering the upstream */
        give_up(p, 504, "the deadline has passed");
        return;
    }
    if (p->state == P_DRAIN && p->uc != NULL && !p->drain_extended) {
        /* the dropped response is still arriving: give it a little longer,
         * never more than half of what is left before the deadline */
        grace = ric_min((int64_t) DRAIN_GRACE_MS, (p->deadline_ms - ric_now_ms()) / 2);
        if (grace > 0) {
            p->drain_extended = 1;
            tv.tv_sec = (time_t) (grace / 1000);
            tv.tv_usec = (suseconds_t) (grace % 1000) * 1000;
            event_add(&p->wait_timer, &tv);
            return;
        }
    }
    attempt_start(p);
}

static void
attempt_start(ric_proxy_t *p)
{
    ric_conn_t *c = p->c;
    int64_t now = ric_now_ms();
    int64_t per_try = ric_min(c->settings->per_try_timeout, ric_max(p->deadline_ms - now, 1));

    if (p->uc != NULL) {
        /* a dropped response still arriving: it missed its chance */
        ric_upconn_close(p->uc);
        p->uc = NULL;
    }
    p->attempt++;
    p->drain_extended = 0;
    p->reused = 0;
    p->early_answer = 0;
    p->sent = 0;
    p->buf_len = 0;
    p->resp_done = 0;
    p->reusable = 0;
    ric_http_msg_init(&p->resp);
    build_request(p);

    p->attempt_start_us = ric_now_us();
    p->peer = ric_upstream_pick(p->up, p->prev_peer, now);
    if (!p->streaming) {
        arm_try_timer(p); /* a streamed body's clock starts when it has been sent */
    }
    p->waiting = 0;

    /* a request that cannot be retried takes no chances with a pooled
     * connection: it is checked even when it was idle only a moment */
    p->uc = ric_upstream_pool_get(p->up, p->peer, !(p->replay_safe && p->body_replayable));
    if (p->uc != NULL) {
        p->reused = 1;
        ric_upconn_own(p->uc, p, on_upstream_read, on_upstream_write);
        ric_upconn_read_timeout(p->uc, 0); /* the idle timeout no longer applies */
        p->state = P_SENDING;
        send_request(p);
        return;
    }
    p->state = P_CONNECTING;
    p->uc = ric_upconn_connect(p->up, p->peer);
    if (p->uc == NULL) {
        fail(p, RIC_CLASS_CONNECT_ERROR, errno ? errno : ECONNREFUSED, "connect() failed");
        return;
    }
    ric_upconn_own(p->uc, p, on_upstream_read, on_upstream_write);
    ric_upconn_read_timeout(p->uc, 0);
    ric_upconn_want_write(p->uc, ric_min(c->settings->proxy_connect_timeout, per_try));
}

/* A random (version 4) UUID, lowercase. */
static void
mint_uuid(char *out)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char b[16];
    int i, o = 0;

    if (RAND_bytes(b, sizeof(b)) != 1) {
        uint64_t r1 = ric_backoff_rand(NULL), r2 = ric_backoff_rand(NULL);
        memcpy(b, &r1, 8);
        memcpy(b + 8, &r2, 8);
    }
    b[6] = (unsigned char) ((b[6] & 0x0f) | 0x40);
    b[8] = (unsigned char) ((b[8] & 0x3f) | 0x80);
    for (i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) {
            out[o++] = '-';
        }
        out[o++] = hex[b[i] >> 4];
        out[o++] = hex[b[i] & 0xf];
    }
    out[o] = '\0';
}

static ric_str_t
request_field(const ric_conn_t *c, const char *name)
{
    ric_str_t none = ric_null_string;

    if (name == NULL || name[0] == '\0') {
        return none;
    }
    {
        char lower[128];
        size_t i, n = strlen(name);
        if (n >= sizeof(lower)) {
            return none;
        }
        for (i = 0; i <= n; i++) {
            lower[i] = (char) ((name[i] >= 'A' && name[i] <= 'Z') ? name[i] | 0x20 : name[i]);
        }
        return ric_http_field(&c->msg, c->in, lower);
    }
}

/* How many fields named name the request has. */
static int
count_fields(const ric_conn_t *c, const char *name)
{
    ric_str_t want = { (const u_char *) name, strlen(name) };
    unsigned i;
    int n = 0;

    for (i = 0; i < c->msg.nfields; i++) {
        n += span_eq_nocase(field_name(c->in, &c->msg, i), want);
    }
    return n;
}

/* Sets up the retry policy, the deadline and what makes this request safe
 * to repeat (DESIGN §1.1, §1.2, §4). */
static void
retry_setup(ric_proxy_t *p)
{
    ric_conn_t *c = p->c;
    const ric_http_settings_t *s = c->settings;
    const ric_http_refs_t *refs = &c->location->refs;
    int64_t now = ric_now_ms(), client_ms;
    ric_str_t v;

    p->policy.enabled = s->retries == 1;
    p->policy.attempts = s->retry_attempts;
    p->policy.backoff.initial_ms = s->retry_backoff_initial;
    p->policy.backoff.max_ms = s->retry_backoff_max;
    p->policy.backoff.factor = (double) s->retry_backoff_factor_milli / 1000.0;
    p->policy.backoff.jitter = (ric_jitter_t) s->retry_backoff_jitter;
    p->policy.retry_after_max_ms = s->retry_after_max;
    p->policy.retry_on = refs->retry_on;

    p->deadline_span_ms = s->retry_timeout;
    v = request_field(c, refs->client_deadline_header);
    if (v.data != NULL) {
        if (ric_retry_parse_deadline(v.data, v.len, &client_ms) == RIC_OK) {
            p->deadline_span_ms = ric_min(p->deadline_span_ms, client_ms);
        } else {
            ric_log_error(RIC_LOG_INFO, 0, "ignoring an invalid %s \"%.*s\", client: %s",
                          refs->client_deadline_header, (int) ric_min(v.len, (size_t) 64),
                          v.data, c->peer);
        }
    }
    p->deadline_ms = now + p->deadline_span_ms;

    p->replay_safe = ric_retry_method_idempotent((int) c->msg.method);
    if (s->idempotency_key != RIC_IDEMPOTENCY_OFF) {
        v = request_field(c, refs->idempotency_key_header);
        if (v.data != NULL && v.len > 0 && count_fields(c, refs->idempotency_key_header) == 1) {
            p->replay_safe = 1; /* the route's contract: its upstream honours keys */
        } else if (s->idempotency_key == RIC_IDEMPOTENCY_AUTO && !p->replay_safe) {
            mint_uuid(p->minted_key);
            p->replay_safe = 1;
        }
    }
    p->streaming = c->body_streaming;
    p->stream_chunked = c->body_streaming && c->msg.body == RIC_BODY_CHUNKED;
    p->body_replayable = !p->streaming
                         && ric_body_size(&c->body) <= (uint64_t) s->retry_body_max;
    if (p->stream_chunked && ric_body_size(&c->body) > 0) {
        stage_put(p, "\r\n", 2); /* ends the chunk of what was held (build_request) */
    }

    p->up->budget.ratio = (double) s->retry_budget_permille / 1000.0;
    p->up->budget.min_per_sec = s->retry_budget_min;
    ric_budget_request(&p->up->budget, now);
}

void
ric_proxy_start(ric_conn_t *c)
{
    ric_proxy_t *p = ric_xcalloc(1, sizeof(*p));
    ric_worker_t *w = c->worker;

    p->c = c;
    c->proxy = p;
    c->state = RIC_CONN_PROXY;
    p->up = &w->upstreams[c->location->upstream->index];
    p->buf = ric_xmalloc(PROXY_BUF_SIZE);
    evtimer_assign(&p->try_timer, w->base, on_try_timeout, p);
    evtimer_assign(&p->wait_timer, w->base, on_wait_done, p);
    retry_setup(p);
    /* the first attempt starts from the loop, not from inside the client's
     * read: an exchange that ends at once must not answer, and move the
     * connection on, underneath the caller */
    event_active(&p->wait_timer, EV_TIMEOUT, 1);
}
