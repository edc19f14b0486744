/* upstream_request.c: building the request head sent upstream, once per attempt. */
#include "upstream_request.h"
#include "headers.h"
#include "log.h"
#include "request.h"

#include <stdio.h>

static void
put_xff(ric_request_t *r, ric_buf_t *b)
{
    const ric_http_msg_t *m = r->msg;
    unsigned i;

    for (i = 0; i < m->nfields; i++) {
        if (ric_str_eq_lower(ric_field_name(r->c->in, m, i), "x-forwarded-for")) {
            ric_str_t v = ric_field_value(r->c->in, m, i);
            ric_buf_put(b, v.data, v.len);
            ric_buf_puts(b, ", ");
        }
    }
    ric_buf_puts(b, r->c->peer_ip);
}

/* $host: the authority the request names, without port or trailing dot,
 * lowercase; with none (HTTP/1.0), the server's first name. */
static void
put_host(ric_request_t *r, ric_buf_t *b)
{
    ric_str_t v = ric_request_host(r);
    const u_char *end;
    size_t i;

    if (v.len == 0 && r->server->nnames > 0) {
        v.data = (const u_char *) r->server->names[0];
        v.len = strlen(r->server->names[0]);
    }
    if (v.len > 0 && v.data[0] == '[') {
        end = memchr(v.data, ']', v.len);
        v.len = end ? (size_t) (end - v.data) + 1 : v.len;
    } else if ((end = memchr(v.data, ':', v.len)) != NULL) {
        v.len = (size_t) (end - v.data);
    }
    if (v.len > 0 && v.data[v.len - 1] == '.') {
        v.len--; /* "example.com." is example.com */
    }
    for (i = 0; i < v.len; i++) {
        u_char ch = v.data[i];
        ch = (ch >= 'A' && ch <= 'Z') ? ch | 0x20 : ch;
        ric_buf_put(b, &ch, 1);
    }
}

static void
put_template(ric_request_t *r, const ric_template_part_t *part, ric_buf_t *b)
{
    const ric_http_msg_t *m = r->msg;
    ric_str_t v;

    for (; part; part = part->next) {
        switch (part->var) {
        case RIC_VAR_LITERAL:
            ric_buf_put(b, part->text, part->len);
            break;
        case RIC_VAR_HOST:
            put_host(r, b);
            break;
        case RIC_VAR_HTTP_HOST:
            v = ric_headers_find(r->c->in, m, "host");
            ric_buf_put(b, v.data, v.len);
            break;
        case RIC_VAR_REMOTE_ADDR:
            ric_buf_puts(b, r->c->peer_ip);
            break;
        case RIC_VAR_REMOTE_PORT:
            ric_buf_puts(b, r->c->peer_port);
            break;
        case RIC_VAR_SCHEME:
            ric_buf_puts(b, r->c->listener->ssl ? "https" : "http");
            break;
        case RIC_VAR_PROXY_HOST:
            ric_buf_puts(b, r->up->conf->host_header);
            break;
        case RIC_VAR_REQUEST_URI:
            ric_buf_put(b, r->c->in + m->target_off, m->target_len);
            break;
        case RIC_VAR_REQUEST_METHOD:
            ric_buf_put(b, r->c->in + m->method_off, m->method_len);
            break;
        case RIC_VAR_PROXY_ADD_XFF:
            put_xff(r, b);
            break;
        case RIC_VAR_HTTP:
            v = ric_headers_find(r->c->in, m, part->text);
            ric_buf_put(b, v.data, v.len);
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
    return ric_str_eq_nocase(name, w);
}

static const ric_header_set_t *
find_set_header(const ric_header_set_t *h, ric_str_t name)
{
    for (; h; h = h->next) {
        if (name_is(name, h->name)) {
            return h;
        }
    }
    return NULL;
}

static const ric_header_edit_t *
find_edit(const ric_header_edit_t *e, ric_str_t name)
{
    for (; e; e = e->next) {
        if (ric_str_eq_nocase(e->name, name)) {
            return e;
        }
    }
    return NULL;
}

/* The fields the gateway writes on every attempt with values of its own
 * (the client's deadline, the attempt's number): a client's, the
 * config's or a script's goes unsent, so the upstream reads one of each. */
static int
gateways(const ric_http_refs_t *refs, ric_str_t name)
{
    return name_is(name, refs->client_deadline_header)
           || name_is(name, refs->retry_attempt_header);
}

/* Whether the config or a script sets the field itself. */
static int
replaced(ric_request_t *r, const char *name)
{
    ric_str_t n = { (const u_char *) name, strlen(name) };

    return find_set_header(r->location->refs.headers, n) != NULL || find_edit(r->edits, n) != NULL;
}

/* The request line target: origin-form as received; absolute-form reduced
 * to its path and query (the upstream gets Host separately). */
static ric_str_t
upstream_target(ric_request_t *r)
{
    ric_str_t t = ric_request_span(r, r->msg->target_off, r->msg->target_len), authority, rest;

    if (!ric_http_absolute_form(t, &authority, &rest)) {
        return t;
    }
    return rest.len > 0 ? rest : (ric_str_t) ric_string("/");
}

/* The client's fields on their way into the head sent upstream. */
typedef struct {
    ric_request_t *r;
    ric_buf_t *b; /* the head being built */
} copy_t;

static void
put(void *ctx, const void *p, size_t n)
{
    ric_buf_put(((copy_t *) ctx)->b, p, n);
}

/* Of the client's end-to-end fields, those the gateway sets itself or
 * drops. */
static int
skipped(void *ctx, ric_str_t name)
{
    ric_request_t *r = ((copy_t *) ctx)->r;
    const ric_http_refs_t *refs = &r->location->refs;

    if (ric_str_eq_lower(name, "host")
        || ric_str_eq_lower(name, "x-forwarded-for") || ric_str_eq_lower(name, "x-forwarded-proto")
        || ric_str_eq_lower(name, "transfer-encoding") || ric_str_eq_lower(name, "expect")
        || ric_str_eq_lower(name, "content-length")
        || find_set_header(refs->headers, name) != NULL || find_edit(r->edits, name) != NULL
        || gateways(refs, name)) {
        return 1;
    }
    if (!r->settings->underscores_in_headers && memchr(name.data, '_', name.len) != NULL) {
        /* a backend that maps '_' to '-' would see a field the client
         * could not send by name (a second Content-Length...), as nginx
         * warns: dropped unless underscores_in_headers on */
        ric_log_error(RIC_LOG_INFO, 0, "client sent a header name with an underscore: \"%.*s\", "
                      "not forwarded, client: %s", (int) ric_min(name.len, (size_t) 64),
                      name.data, r->c->peer);
        return 1;
    }
    return 0;
}

void
ric_upstream_request_build(ric_request_t *r, int attempt, ric_buf_t *b)
{
    const ric_http_msg_t *m = r->msg;
    const ric_http_refs_t *refs = &r->location->refs;
    const ric_header_set_t *h;
    const ric_header_edit_t *e;
    ric_str_t target = upstream_target(r);
    uint64_t held = ric_body_size(&r->body);
    char num[48];
    size_t mark, value_start;
    copy_t copy;

    b->len = 0;
    ric_buf_put(b, r->c->in + m->method_off, m->method_len);
    ric_buf_puts(b, " ");
    if (target.len > 0 && target.data[0] == '?') {
        ric_buf_puts(b, "/"); /* "http://host?q" has an empty path: "/?q" */
    }
    ric_buf_put(b, target.data, target.len);
    ric_buf_puts(b, " HTTP/1.1\r\n");

    /* Host first, as RFC 9112 §3.2 asks */
    if (!replaced(r, "Host")) {
        ric_buf_puts(b, "Host: ");
        ric_buf_puts(b, r->up->conf->host_header);
        ric_buf_puts(b, "\r\n");
    }
    copy = (copy_t) { r, b };
    ric_headers_copy(r->c->in, m, skipped, put, &copy);
    if (!replaced(r, "X-Forwarded-For")) {
        ric_buf_puts(b, "X-Forwarded-For: ");
        put_xff(r, b);
        ric_buf_puts(b, "\r\n");
    }
    if (!replaced(r, "X-Forwarded-Proto")) {
        ric_buf_puts(b, r->c->listener->ssl ? "X-Forwarded-Proto: https\r\n"
                                            : "X-Forwarded-Proto: http\r\n");
    }
    for (h = refs->headers; h; h = h->next) {
        ric_str_t name = { (const u_char *) h->name, strlen(h->name) };
        if (find_edit(r->edits, name) || gateways(refs, name)) {
            continue; /* the script's word is the last; the gateway's own is its */
        }
        mark = b->len;
        ric_buf_puts(b, h->name);
        ric_buf_puts(b, ": ");
        value_start = b->len;
        put_template(r, h->value, b);
        if (b->len == value_start) {
            b->len = mark; /* an empty value drops the field, as in nginx */
            continue;
        }
        ric_buf_puts(b, "\r\n");
    }
    for (e = r->edits; e; e = e->next) {
        if (e->value.data != NULL && !gateways(refs, e->name)) {
            ric_buf_put(b, e->name.data, e->name.len);
            ric_buf_puts(b, ": ");
            ric_buf_put(b, e->value.data, e->value.len);
            ric_buf_puts(b, "\r\n");
        }
    }
    if (r->body_mode == RIC_REQ_BODY_STREAM && r->upload.chunked) {
        ric_buf_puts(b, "Transfer-Encoding: chunked\r\n");
    } else if (r->body_mode == RIC_REQ_BODY_STREAM) {
        ric_buf_puts(b, "Content-Length: ");
        ric_buf_put_u64(b, m->content_length);
        ric_buf_puts(b, "\r\n");
    } else if (m->body != RIC_BODY_NONE || ric_headers_find(r->c->in, m, "content-length").data) {
        /* a chunked body goes upstream with its length, now known */
        ric_buf_puts(b, "Content-Length: ");
        ric_buf_put_u64(b, held);
        ric_buf_puts(b, "\r\n");
    }
    if (r->up->conf->keepalive <= 0) {
        ric_buf_puts(b, "Connection: close\r\n");
    }
    if (refs->retry_attempt_header[0] != '\0') {
        ric_buf_puts(b, refs->retry_attempt_header);
        ric_buf_puts(b, ": ");
        ric_buf_put_u64(b, (uint64_t) attempt);
        ric_buf_puts(b, "\r\n");
    }
    /* the upstream learns how long the client will still wait */
    ric_buf_puts(b, refs->client_deadline_header);
    ric_buf_puts(b, ": ");
    ric_buf_put_u64(b, (uint64_t) ric_max(r->deadline_ms - ric_now_ms(), (int64_t) 0));
    ric_buf_puts(b, "\r\n");
    if (r->minted_key[0] != '\0') {
        ric_buf_puts(b, refs->idempotency_key_header);
        ric_buf_puts(b, ": ");
        ric_buf_puts(b, r->minted_key);
        ric_buf_puts(b, "\r\n");
    }
    ric_buf_puts(b, "\r\n");
    if (r->body_mode == RIC_REQ_BODY_STREAM && r->upload.chunked && held > 0) {
        /* what was held before streaming began goes first, as one chunk;
         * its closing CRLF opens the upload's stage */
        snprintf(num, sizeof(num), "%llx\r\n", (unsigned long long) held);
        ric_buf_puts(b, num);
    }
}
