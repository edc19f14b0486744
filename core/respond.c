/* respond.c: writing the answer: the gateway's own, or the upstream's with hop-by-hop fields dropped and its body relayed through one buffer. */
#include "respond.h"
#include "headers.h"
#include "log.h"
#include "request.h"
#include "script.h"
#include "worker.h"

#include <stdio.h>

/* The gateway's own answer, with a short text body; or one with fields
 * and a body of its own (a script's req:respond, the idempotency store's
 * replay or problem). */
static void
own_head(ric_request_t *r)
{
    ric_conn_t *c = r->c;
    char head[512], body[128];
    const char *reason = ric_http_status_text(r->status);
    const char *type = "Content-Type: text/plain\r\n";
    const u_char *b = (const u_char *) body;
    size_t blen;
    int hlen, keep = ric_conn_keepalive(c);
    ric_str_t fields = ric_null_string;

    if (r->own_custom) {
        fields = r->own_fields;
        b = r->own_body.data;
        blen = r->own_body.len;
        if (r->own_typed) {
            type = "";
        }
    } else {
        blen = (size_t) snprintf(body, sizeof(body), "%d %s\n", r->status, reason);
    }
    if (r->status == 204 || r->status == 304) {
        type = ""; /* no body, no length (a script's answer) */
        blen = 0;
    }
    hlen = snprintf(head, sizeof(head),
                    "HTTP/1.1 %d %s\r\n"
                    "Server: ricochet\r\n"
                    "Date: %s\r\n"
                    "%s",
                    r->status, reason, ric_worker_date(c->worker), type);
    if (r->status != 204 && r->status != 304) {
        hlen += snprintf(head + hlen, sizeof(head) - (size_t) hlen, "Content-Length: %zu\r\n",
                         blen);
    }
    hlen += snprintf(head + hlen, sizeof(head) - (size_t) hlen, "%s",
                     !keep ? "Connection: close\r\n"
                     : r->msg->version == 10 ? "Connection: keep-alive\r\n" : "");
    ric_conn_head_append(c, head, (size_t) hlen);
    if (fields.len > 0) {
        ric_conn_head_append(c, fields.data, fields.len);
    }
    ric_conn_head_append(c, "\r\n", 2);
    if (!(r->msg->method == RIC_HTTP_HEAD && r->msg->head_len > 0)) {
        ric_conn_head_append(c, b, blen);
    }
}

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

/* The upstream's head as the client gets it (with on_response's edits). */
static void
upstream_head(ric_request_t *r)
{
    const ric_header_edit_t *e;
    ric_conn_t *c = r->c;
    ric_http1_t *h = &r->answer->client;
    const ric_http_msg_t *m = &h->resp;
    const char *date;
    char line[64];
    unsigned i;
    int n, has_date = 0, keep;

    if (m->body == RIC_BODY_CLOSE || h->dechunk) {
        ric_conn_close_after(c); /* the body's end is the connection's */
    }
    keep = ric_conn_keepalive(c);
    n = snprintf(line, sizeof(line), "HTTP/1.1 %03d ", m->status);
    ric_conn_head_append(c, line, (size_t) n);
    ric_conn_head_append(c, h->buf + m->reason_off, m->reason_len);
    ric_conn_head_append(c, "\r\n", 2);
    for (i = 0; i < m->nfields; i++) {
        ric_str_t name = ric_field_name(h->buf, m, i);
        if (ric_headers_hop_by_hop(h->buf, m, name)
            || ((h->dechunk || r->msg->version == 10)
                && ric_str_eq_lower(name, "transfer-encoding"))
            || edited(r, name)) {
            continue;
        }
        has_date = has_date || ric_str_eq_lower(name, "date");
        /* name, ": ", value are contiguous in what the upstream sent only
         * up to OWS, so copy the parts */
        ric_conn_head_append(c, name.data, name.len);
        ric_conn_head_append(c, ": ", 2);
        ric_conn_head_append(c, h->buf + m->fields[i].value_off, m->fields[i].value_len);
        ric_conn_head_append(c, "\r\n", 2);
    }
    for (e = r->res_edits; e; e = e->next) {
        if (e->value.data != NULL) { /* the route script's on_response */
            has_date = has_date || ric_str_eq_lower(e->name, "date");
            ric_conn_head_append(c, e->name.data, e->name.len);
            ric_conn_head_append(c, ": ", 2);
            ric_conn_head_append(c, e->value.data, e->value.len);
            ric_conn_head_append(c, "\r\n", 2);
        }
    }
    if (!has_date) {
        /* RFC 9110 §6.6.1: a proxy adds the Date an origin did not send */
        date = ric_worker_date(c->worker);
        ric_conn_head_append(c, "Date: ", 6);
        ric_conn_head_append(c, date, strlen(date));
        ric_conn_head_append(c, "\r\n", 2);
    }
    if (!keep) {
        ric_conn_head_append(c, "Connection: close\r\n", 19);
    } else if (r->msg->version == 10) {
        ric_conn_head_append(c, "Connection: keep-alive\r\n", 24);
    }
    ric_conn_head_append(c, "\r\n", 2);
}

int
ric_respond_phase(ric_request_t *r)
{
    ric_http1_t *h;
    size_t taken;
    int rc;

    if (!r->responding) {
        r->responding = 1;
        if (r->answer == NULL) {
            own_head(r);
        } else {
            r->status = r->answer->client.resp.status;
            ric_script_on_response(r);
            upstream_head(r);
            if (r->tap != NULL) {
                r->tap(r, NULL, 0);
            }
        }
    }
    if (r->answer == NULL) {
        rc = ric_conn_write(r->c, NULL, 0, &taken);
    } else {
        h = &r->answer->client;
        rc = ric_conn_write(r->c, h->buf + h->relay_start, h->relay_end - h->relay_start, &taken);
        if (r->tap != NULL && taken > 0) {
            r->tap(r, h->buf + h->relay_start, taken);
        }
        ric_http1_consumed(h, taken);
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
    }
    if (rc == RIC_ERROR) {
        ric_log_error(RIC_LOG_INFO, 0, "the client went away while being sent the answer, "
                      "client: %s", r->c->peer);
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
    ric_request_resume(r);
}

void
ric_respond_broken(ric_request_t *r, int err, const char *what)
{
    ric_log_error(RIC_LOG_ERR, err, "%s while sending the response, client: %s, upstream: %s",
                  what, r->c->peer, r->answer->client.peer->conf->addr_text);
    ric_request_finalize(r, RIC_END_CUT_SHORT);
}
