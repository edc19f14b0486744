/* respond.c: writing the answer: the gateway's own, or the upstream's with hop-by-hop fields dropped and its body relayed through one buffer. */
#include "respond.h"
#include "attempt.h"
#include "headers.h"
#include "log.h"
#include "request.h"
#include "script.h"

#include <stdio.h>

/* Whether the route script's on_response set or removed the field. */
static int
edited(const ric_request_t *r, ric_str_t name)
{
    const ric_header_edit_t *e;

    for (e = r->res_edits; e; e = e->next) {
        if (ric_str_eq_nocase(e->name, name)) {
            return 1;
        }
    }
    return 0;
}

static void
field(ric_conn_t *c, ric_str_t name, const u_char *value, size_t len)
{
    ric_conn_head_append(c, name.data, name.len);
    ric_conn_head_append(c, ": ", 2);
    ric_conn_head_append(c, value, len);
    ric_conn_head_append(c, "\r\n", 2);
}

/* The fields on_response set; whether one is a Date. */
static int
edits(ric_request_t *r)
{
    const ric_header_edit_t *e;
    int has_date = 0;

    for (e = r->res_edits; e; e = e->next) {
        if (e->value.data != NULL) {
            has_date = has_date || ric_str_eq_lower(e->name, "date");
            field(r->c, e->name, e->value.data, e->value.len);
        }
    }
    return has_date;
}

static void
date(ric_conn_t *c)
{
    static const ric_str_t name = ric_string("Date");
    const char *d = ric_date_now();

    field(c, name, (const u_char *) d, strlen(d));
}

/* Connection, when the answer's version or the connection's end needs it. */
static void
connection(ric_request_t *r)
{
    if (!ric_conn_keepalive(r->c)) {
        ric_conn_head_append(r->c, "Connection: close\r\n", 19);
    } else if (r->msg->version == 10) {
        ric_conn_head_append(r->c, "Connection: keep-alive\r\n", 24);
    }
}

/* The gateway's own answer's body: a short text, or a script's or the
 * idempotency store's; none for a 204 or 304. */
static ric_str_t
own_body(const ric_request_t *r, char *buf, size_t size)
{
    ric_str_t b = ric_null_string;

    if (r->status == 204 || r->status == 304) {
        return b;
    }
    if (r->own_custom) {
        return r->own_body;
    }
    b.data = (const u_char *) buf;
    b.len = (size_t) snprintf(buf, size, "%d %s\n", r->status, ric_http_status_text(r->status));
    return b;
}

static void
content_length_field(ric_conn_t *c, uint64_t len)
{
    char line[64];
    size_t n;

    memcpy(line, "Content-Length: ", 16);
    n = 16 + ric_u64_to_dec(len, (u_char *) line + 16);
    memcpy(line + n, "\r\n", 2);
    ric_conn_head_append(c, line, n + 2);
}

/* The gateway's own answer's fields: its Server and Date, the answer's
 * own (ric_request_own_fields), the length of its body; with
 * on_response's edits. */
static void
own_head(ric_request_t *r, size_t body_len)
{
    static const ric_str_t server = ric_string("Server");
    ric_conn_t *c = r->c;
    ric_str_t rest = ric_request_own_fields(r), name, value;

    if (!edited(r, server)) {
        ric_conn_head_append(c, "Server: ricochet\r\n", 18);
    }
    while (ric_lines_next(&rest, &name, &value)) {
        if (!edited(r, name)) {
            field(c, name, value.data, value.len);
        }
    }
    if (!edits(r)) {
        date(c);
    }
    if (r->status != 204 && r->status != 304) {
        content_length_field(c, body_len);
    }
    connection(r);
}

typedef struct {
    ric_request_t *r;
    int has_date;
} upstream_fields_t;

/* Of the upstream's end-to-end fields, those the client does not get:
 * a Transfer-Encoding undone (or that HTTP/1.0 cannot carry), a
 * Content-Length that came more than once (upstream_head sends it
 * once), and those on_response set or removed. */
static int
upstream_skips(void *ctx, ric_str_t name)
{
    upstream_fields_t *u = ctx;
    const ric_http1_t *h = &u->r->answer->client;

    if (((h->dechunk || u->r->msg->version == 10) && ric_str_eq_lower(name, "transfer-encoding"))
        || (h->resp.content_length_repeated && ric_str_eq_lower(name, "content-length"))
        || edited(u->r, name)) {
        return 1;
    }
    u->has_date = u->has_date || ric_str_eq_lower(name, "date");
    return 0;
}

static void
head_put(void *ctx, const void *p, size_t n)
{
    ric_conn_head_append(((upstream_fields_t *) ctx)->r->c, p, n);
}

/* The upstream's head as the client gets it (with on_response's edits). */
static void
upstream_head(ric_request_t *r)
{
    static const ric_str_t content_length = ric_string("Content-Length");
    const ric_http1_t *h = &r->answer->client;
    upstream_fields_t u = { r, 0 };

    ric_headers_copy(h->buf, &h->resp, upstream_skips, head_put, &u);
    if (h->resp.content_length_repeated && !edited(r, content_length)) {
        content_length_field(r->c, h->resp.content_length_value);
    }
    if (!(edits(r) | u.has_date)) {
        date(r->c); /* RFC 9110 §6.6.1: a proxy adds the Date an origin did not send */
    }
    connection(r);
}

/* The answer's head: the status line, on_response's run, the fields (kept
 * for on_log when its script has one), the blank line; an own answer's
 * body joins the head. */
static void
head(ric_request_t *r)
{
    ric_conn_t *c = r->c;
    const ric_http1_t *h = r->answer ? &r->answer->client : NULL;
    char line[64], buf[128];
    size_t from;
    int keep;
    ric_str_t b = ric_null_string;

    r->status = h ? h->resp.status : r->status;
    keep = ric_script_on_response(r);
    if (h != NULL && (h->resp.body == RIC_BODY_CLOSE || h->dechunk)) {
        ric_conn_close_after(c); /* the body's end is the connection's */
    }
    /* "HTTP/1.1 NNN " (a status is three digits: 100 to 599) */
    memcpy(line, "HTTP/1.1 ", 9);
    line[9] = (char) ('0' + r->status / 100 % 10);
    line[10] = (char) ('0' + r->status / 10 % 10);
    line[11] = (char) ('0' + r->status % 10);
    line[12] = ' ';
    ric_conn_head_append(c, line, 13);
    if (h != NULL) {
        ric_conn_head_append(c, h->buf + h->resp.reason_off, h->resp.reason_len);
    } else {
        ric_conn_head_append(c, ric_http_status_text(r->status),
                             strlen(ric_http_status_text(r->status)));
    }
    ric_conn_head_append(c, "\r\n", 2);
    from = ric_conn_head_len(c);
    if (h != NULL) {
        upstream_head(r);
    } else {
        b = own_body(r, buf, sizeof(buf));
        own_head(r, b.len);
    }
    if (keep) {
        r->answer_fields = ric_conn_head_since(c, from, r->pool);
    }
    ric_conn_head_append(c, "\r\n", 2);
    if (h == NULL && !(r->msg->method == RIC_HTTP_HEAD && r->msg->head_len > 0)) {
        ric_conn_head_append(c, b.data, b.len);
    }
}

/* Whether the rest of the answer's body is spliced: nothing takes a copy
 * of it (no idempotency tap, no client that may leave with the request
 * going on), both sockets are plain, and the upstream's side agrees. */
static int
splices(ric_request_t *r)
{
    ric_http1_t *h = &r->answer->client;

    if (h->pipe != NULL) {
        return 1;
    }
    return !h->done && r->tap == NULL && !r->outlives_client && ric_conn_can_splice(r->c)
           && ric_http1_splice(h);
}

/* Writes to the client what the answer has now. RIC_OK: all of it went
 * out; RIC_AGAIN: more is to come (from the upstream, or when the client
 * drains); RIC_ERROR: the client is gone. */
static int
relay(ric_request_t *r)
{
    ric_http1_t *h;
    size_t taken;
    int rc;

    if (r->answer == NULL) {
        return ric_conn_write(r->c, NULL, 0, &taken);
    }
    h = &r->answer->client;
    rc = ric_conn_write(r->c, h->buf + h->relay_start, h->relay_end - h->relay_start, &taken);
    if (r->tap != NULL && taken > 0) {
        r->tap(r, h->buf + h->relay_start, taken);
    }
    ric_http1_consumed(h, taken);
    if (rc == RIC_OK && splices(r)) {
        /* the rest of the body goes from socket to socket */
        rc = ric_conn_splice(r->c, h->pipe);
        ric_http1_spliced(h);
    }
    if (rc == RIC_AGAIN) {
        /* a slow client: stop reading the upstream until it drains, so
         * memory stays at one buffer; also when the response is all
         * here, so that an upstream closing now is not one breaking off */
        ric_http1_pause(h);
    } else if (rc == RIC_OK && !h->done) {
        return RIC_AGAIN; /* relayed all there was: more will come */
    } else if (rc == RIC_OK) {
        ric_http1_release(h); /* whole: the connection may serve another request */
    }
    return rc;
}

int
ric_respond_phase(ric_request_t *r)
{
    int rc;

    if (!r->responding) {
        r->responding = 1;
        head(r);
        if (r->answer != NULL && r->tap != NULL) {
            r->tap(r, NULL, 0);
        }
        rc = relay(r);
    } else {
        /* back after a relay ended it, or resumed meanwhile */
        rc = r->relayed > 0 ? RIC_OK : r->relayed < 0 ? RIC_ERROR : relay(r);
    }
    if (rc == RIC_ERROR) {
        ric_log_error(RIC_LOG_INFO, 0, "the client went away while being sent the answer, "
                      "client: %s", r->c->peer);
        r->relayed = 0;
        ric_conn_close(r->c); /* the request ends, unless it outlives its client */
        if (r->client_left) {
            ric_request_resume(r); /* the rest goes nowhere, but goes */
        }
        return RIC_AGAIN;
    }
    return rc;
}

void
ric_respond_relay(ric_request_t *r)
{
    int rc;

    if (!r->responding) {
        return; /* the phase has not begun: it writes all there is when it does */
    }
    rc = relay(r);
    if (rc != RIC_AGAIN) {
        /* the answer's end, or the client's: the phase takes it from here */
        r->relayed = rc == RIC_OK ? 1 : -1;
        ric_request_resume(r);
    }
}

void
ric_respond_broken(ric_request_t *r, int err, const char *what)
{
    ric_log_error(RIC_LOG_ERR, err, "%s while sending the response, client: %s, upstream: %s",
                  what, r->c->peer, r->answer->client.peer->conf->addr_text);
    ric_request_finalize(r, RIC_END_CUT_SHORT);
}
