/* http1_client.c: the upstream side of an exchange as plain I/O: connect, send, read the head, frame the body. */
#include "http1_client.h"
#include "retry.h"
#include "tls.h"

#include <stdio.h>

#include <errno.h>
#include <limits.h>

/* What the first read of a response from a plain socket takes at most: a
 * head and a small body (the rest of a larger one may be spliced); a head
 * longer than this is read on to RIC_HTTP1_BUF_SIZE. */
#define HEAD_READ (16 * 1024)

static void on_read(ric_upconn_t *uc, short what);
static void on_write(ric_upconn_t *uc, short what);

/* Response buffers given back, kept for the next exchange. */
static ric_keep_t bufs = RIC_KEEP(32);

void
ric_http1_init(ric_http1_t *h, const ric_http1_handler_t *handler, void *data,
               ric_upstream_t *up, ric_http_method_t method)
{
    memset(h, 0, offsetof(ric_http1_t, resp));
    ric_http_msg_init(&h->resp); /* all but its fields array */
    h->handler = handler;
    h->data = data;
    h->up = up;
    h->method = method;
}

int
ric_http1_start(ric_http1_t *h, ric_peer_t *peer, int careful, const u_char *req,
                size_t req_len, const ric_body_t *body, ric_upload_t *upload)
{
    h->peer = peer;
    h->req = req;
    h->req_len = req_len;
    h->body = body;
    h->upload = upload;
    if (h->buf == NULL && (h->buf = ric_keep_take(&bufs)) == NULL) {
        h->buf = ric_xmalloc(RIC_HTTP1_BUF_SIZE);
    }
    h->uc = ric_upstream_pool_get(h->up, peer, careful);
    if (h->uc != NULL) {
        h->reused = 1;
        ric_upconn_own(h->uc, h, on_read, on_write);
        ric_upconn_read_timeout(h->uc, 0); /* the idle timeout no longer applies */
        h->state = RIC_HTTP1_SENDING;
        /* sent from the loop, so that no callback runs inside this call */
        event_active(&h->uc->wev, EV_WRITE, 1);
        return RIC_OK;
    }
    h->uc = ric_upconn_connect(h->up, peer);
    if (h->uc == NULL) {
        if (errno == 0) {
            errno = ECONNREFUSED;
        }
        return RIC_ERROR;
    }
    h->state = RIC_HTTP1_CONNECTING;
    ric_upconn_own(h->uc, h, on_read, on_write);
    ric_upconn_read_timeout(h->uc, 0);
    ric_upconn_want_write(h->uc, h->connect_timeout);
    return RIC_OK;
}

/* --- sending ----------------------------------------------------------------- */

static uint64_t
replay_size(const ric_http1_t *h)
{
    return h->req_len + (h->body ? ric_body_size(h->body) : 0);
}

/* A write returned RIC_AGAIN or RIC_ERROR: wait for the socket, or fail. */
static void
write_stopped(ric_http1_t *h, ssize_t n, const char *what)
{
    if (n == RIC_AGAIN) {
        h->send_blocked = 1;
        ric_upconn_want_write(h->uc, h->send_timeout);
        return;
    }
    h->handler->failed(h, RIC_CLASS_RESET, errno, what);
}

static void
send_request(ric_http1_t *h)
{
    ric_io_t *io = &h->uc->io;
    const ric_body_t *b = h->body;
    size_t mem_len = b ? b->mem_len : 0;
    uint64_t total = replay_size(h), at;
    struct iovec iov[2];
    int iovcnt;
    ssize_t n;
    off_t off;

    while (h->sent < total) {
        at = h->sent;
        if (at < h->req_len + mem_len) {
            iovcnt = 0;
            if (at < h->req_len) {
                iov[iovcnt].iov_base = (void *) (h->req + at);
                iov[iovcnt++].iov_len = h->req_len - (size_t) at;
                at = h->req_len;
            }
            if (mem_len > 0) {
                size_t m = (size_t) (at - h->req_len);
                iov[iovcnt].iov_base = b->mem + m;
                iov[iovcnt++].iov_len = mem_len - m;
            }
            n = ric_io_writev(io, iov, iovcnt);
        } else {
            off = (off_t) (at - h->req_len - mem_len);
            n = ric_io_sendfile(io, b->fd, &off, (size_t) ric_min(total - at, (uint64_t) 1 << 20));
            if (n == 0) {
                /* the temp file ended before its recorded length: never spin */
                errno = EIO;
                n = RIC_ERROR;
            }
        }
        if (n < 0) {
            write_stopped(h, n, "sending the request failed");
            return;
        }
        h->sent += (uint64_t) n;
    }
    h->send_blocked = 0;
    if (h->upload != NULL) {
        while (ric_upload_pending(h->upload) > 0) {
            n = ric_io_write(io, h->upload->data + h->upload->sent,
                             ric_upload_pending(h->upload));
            if (n < 0) {
                write_stopped(h, n, "sending the request body failed");
                return;
            }
            ric_upload_sent(h->upload, (size_t) n);
        }
        if (!h->upload->done) {
            h->handler->upload_room(h); /* drained: let the client send more */
            return;
        }
    }
    h->state = RIC_HTTP1_HEAD;
    ric_upconn_read_timeout(h->uc, h->read_timeout);
    h->handler->sent(h);
}

void
ric_http1_upload_kick(ric_http1_t *h)
{
    /* from the loop (as a write event), never inside the client's read
     * that staged the bytes */
    if (h->uc != NULL && h->state == RIC_HTTP1_SENDING && !h->send_blocked
        && h->sent >= replay_size(h)) {
        event_active(&h->uc->wev, EV_WRITE, 1);
    }
}

/* One step of the TLS handshake with an https upstream (nothing is sent
 * before it ends; a failure is a connect_error, safe to retry). */
static void
handshake_step(ric_http1_t *h)
{
    ric_upconn_t *uc = h->uc;
    char why[160];
    int rc = ric_tls_handshake(&uc->io, why, sizeof(why));

    if (rc == RIC_AGAIN) {
        if (uc->io.want == RIC_IO_WANT_WRITE) {
            ric_upconn_want_write(uc, h->connect_timeout);
        } else {
            ric_upconn_read_timeout(uc, h->connect_timeout); /* the read event reports */
        }
        return;
    }
    if (rc != RIC_OK) {
        snprintf(h->tls_error, sizeof(h->tls_error), "TLS handshake failed: %s", why);
        h->tls_failed = 1; /* a refusal (502), not a connect that timed out (504) */
        h->handler->failed(h, RIC_CLASS_CONNECT_ERROR, 0, h->tls_error);
        return;
    }
    ric_upconn_read_timeout(uc, 0);
    h->state = RIC_HTTP1_SENDING;
    send_request(h);
}

/* The socket moved (or the connect timeout ran out) during a handshake. */
static void
handshake_event(ric_http1_t *h, short what)
{
    if (what & EV_TIMEOUT) {
        h->handler->failed(h, RIC_CLASS_CONNECT_ERROR, 0,
                           "upstream timed out (TLS handshake, proxy_connect_timeout)");
        return;
    }
    handshake_step(h);
}

/* Connected: TLS first for an https upstream, then the request. */
static void
connected(ric_http1_t *h)
{
    const ric_upstream_conf_t *u = h->up->conf;

    if (!u->tls) {
        h->state = RIC_HTTP1_SENDING;
        send_request(h);
        return;
    }
    if (ric_tls_connect(&h->uc->io, u->ssl_ctx, u->ssl_name,
                        u->tls_owner->settings.proxy_ssl_server_name == 1,
                        h->peer->tls_session, &h->peer->tls_session)
        != RIC_OK) {
        h->handler->failed(h, RIC_CLASS_CONNECT_ERROR, ENOMEM, "TLS setup failed");
        return;
    }
    h->state = RIC_HTTP1_HANDSHAKE;
    handshake_step(h);
}

/* A read of a TLS upstream that must write first (the answer to its
 * KeyUpdate, which OpenSSL sends with the next write, once that write met
 * a full send buffer; or a renegotiation it asked for): the socket may
 * stay readable while nothing can be read, and a read event would wake
 * the worker in a loop. Reading waits for writability instead, as the
 * handshake does (a send waiting already keeps its timer, else
 * proxy_read_timeout's), and on_write resumes it. */
static void
read_wait_write(ric_http1_t *h)
{
    ric_upconn_t *uc = h->uc;

    h->read_wants_write = 1;
    ric_upconn_reading(uc, 0, 0);
    if (!event_pending(&uc->wev, EV_WRITE, NULL)) {
        ric_upconn_want_write(uc, h->read_timeout);
    }
}

/* Whether the response is in buf whole, as far as a look can tell (a
 * chunked body: its last chunk ends the buffer). */
static int
all_here(const ric_http1_t *h)
{
    switch (h->resp.body) {
    case RIC_BODY_NONE:
        return 1;
    case RIC_BODY_LENGTH:
        return h->buf_len - h->resp.head_len >= h->resp.content_length;
    case RIC_BODY_CHUNKED:
        return h->buf_len >= h->resp.head_len + 5
               && memcmp(h->buf + h->buf_len - 5, "0\r\n\r\n", 5) == 0;
    default:
        return 0;
    }
}

/* Every read of the response into buf (n bytes at most). */
static ssize_t
read_some(ric_http1_t *h, size_t n)
{
    ssize_t r = ric_io_read(&h->uc->io, h->buf + h->buf_len, n);

    if (r == RIC_AGAIN && h->uc->io.want == RIC_IO_WANT_WRITE) {
        read_wait_write(h);
    }
    return r;
}

/* A read that emptied the socket (it took less than it could) while the
 * response goes on: the upstream may be holding the rest until it hears
 * that this part arrived (an answer's head and body written apart, under
 * Nagle), so it hears at once. Asked where a response starts (its head)
 * and where a body is read for the decision or dropped, not for each read
 * of a body being relayed: a response that came in one piece costs no
 * system call, and a large one at most one (a TLS record read is short of
 * what was asked). */
static void
ack_partial(ric_http1_t *h, ssize_t n, size_t asked)
{
    if (n > 0 && (size_t) n < asked && h->uc != NULL) {
        ric_io_quickack(&h->uc->io);
    }
}

/* The write event while a read waited for it: reading goes on as it was
 * armed and is tried at once (what OpenSSL took in before, no readable
 * event announces), or its timeout is the read's. 1 when the event was
 * the read's alone; 0 when a send waited on it too. */
static int
read_resume(ric_http1_t *h, short what)
{
    int sending = h->state == RIC_HTTP1_SENDING && h->send_blocked;

    h->read_wants_write = 0;
    if (what & EV_TIMEOUT) {
        if (sending) {
            return 0; /* the send's timer: proxy_send_timeout */
        }
        on_read(h->uc, EV_TIMEOUT);
        return 1;
    }
    if (!h->reading_paused) {
        /* SENDING reads without a timer until an answer begins (read_head) */
        ric_upconn_read_timeout(h->uc, h->state == RIC_HTTP1_SENDING && h->buf_len == 0
                                           ? 0 : h->read_timeout);
        event_active(&h->uc->rev, EV_READ, 0);
    }
    return !sending;
}

static void
on_write(ric_upconn_t *uc, short what)
{
    ric_http1_t *h = uc->owner;
    int err;

    if (h->read_wants_write && read_resume(h, what)) {
        return;
    }
    if (h->state == RIC_HTTP1_CONNECTING) {
        if (what & EV_TIMEOUT) {
            h->handler->failed(h, RIC_CLASS_CONNECT_ERROR, 0,
                               "upstream timed out (proxy_connect_timeout)");
            return;
        }
        err = ric_upconn_connect_result(uc);
        if (err != 0) {
            h->handler->failed(h, RIC_CLASS_CONNECT_ERROR, err, "connect() failed");
            return;
        }
        connected(h);
        return;
    }
    if (h->state == RIC_HTTP1_HANDSHAKE) {
        handshake_event(h, what);
        return;
    }
    if (h->state == RIC_HTTP1_SENDING) {
        if (what & EV_TIMEOUT) {
            h->handler->failed(h, RIC_CLASS_TIMEOUT, 0, "upstream timed out (proxy_send_timeout)");
            return;
        }
        h->send_blocked = 0;
        send_request(h);
    }
}

/* --- the response ------------------------------------------------------------ */

/* A chunked body relayed as it came, parsed up to buf[at]: the relay
 * region ends before the trailer section, which the client never gets
 * (as nginx and Envoy: RFC 9110 §6.5.1 forbids framing, routing and
 * other fields there, and the Trailer field that announced them is
 * dropped as hop-by-hop). Once done, the section's closing CRLF is
 * relayed in its place (written over the section's first bytes, read
 * and parsed; when what was held went with a relay that emptied the
 * buffer, at its start), and the section, when last in the buffer,
 * leaves it: what is kept or read again ends with the body. */
static void
drop_trailers(ric_http1_t *h, size_t at, int done, int last)
{
    uint32_t t = h->chunked.trailer_len; /* the section's bytes so far */
    size_t held = ric_max(at > t ? at - t : 0, h->relay_end);

    if (!done) {
        h->relay_end = held;
        return;
    }
    memcpy(h->buf + held, "\r\n", 2);
    h->relay_end = held + 2;
    if (last) {
        h->buf_len = h->relay_end;
    }
}

/* Runs the framing over buf[from, buf_len): extends the relay region and
 * notes the end of the response. RIC_ERROR on broken framing. */
static int
scan_body(ric_http1_t *h, size_t from)
{
    size_t avail = h->buf_len - from, take, w;
    const u_char *pos, *end, *data;
    size_t dlen;
    int rc;

    switch (h->resp.body) {
    case RIC_BODY_NONE:
        h->relay_end = from;
        h->done = 1;
        if (avail > 0) {
            h->reusable = 0; /* bytes after a response that has no body */
        }
        return RIC_OK;
    case RIC_BODY_CLOSE:
        h->relay_end = h->buf_len;
        return RIC_OK;
    case RIC_BODY_LENGTH:
        take = (size_t) ric_min((uint64_t) avail, h->body_left);
        h->body_left -= take;
        h->relay_end = from + take;
        if (h->body_left == 0) {
            h->done = 1;
            if (avail > take) {
                h->reusable = 0; /* more than Content-Length: never reuse */
            }
        }
        return RIC_OK;
    case RIC_BODY_CHUNKED:
        break;
    }

    pos = h->buf + from;
    end = h->buf + h->buf_len;
    w = from; /* where decoded data goes when dechunking (in place) */
    while ((rc = ric_http_chunked_next(&h->chunked, &pos, end, &data, &dlen)) == RIC_OK) {
        if (h->dechunk) {
            memmove(h->buf + w, data, dlen);
            w += dlen;
        }
    }
    if (rc == RIC_ERROR) {
        return RIC_ERROR;
    }
    if (rc == RIC_DONE) {
        h->done = 1;
        if (pos < end) {
            h->reusable = 0;
        }
    }
    if (h->dechunk) {
        h->relay_end = w; /* the trailers go with the framing */
    } else {
        drop_trailers(h, (size_t) (pos - h->buf), rc == RIC_DONE, pos == end);
    }
    return RIC_OK;
}

/* Framing from the start of the body, over what already arrived. */
static int
scan_from_head(ric_http1_t *h, int dechunk)
{
    h->reusable = !h->early_answer;
    h->body_left = h->resp.content_length;
    ric_http_chunked_init(&h->chunked);
    h->dechunk = dechunk;
    h->done = 0;
    h->relay_start = h->relay_end = h->resp.head_len;
    return scan_body(h, h->resp.head_len);
}

static void
read_head(ric_http1_t *h)
{
    ric_upconn_t *uc = h->uc;
    size_t asked;
    ssize_t n;
    int rc;

    /* a head and a small body in one read; of a larger body, the rest is
     * left in the socket to be spliced (ric_http1_splice) */
    asked = h->buf_len < HEAD_READ && ric_io_can_splice(&uc->io) ? HEAD_READ - h->buf_len
                                                                : RIC_HTTP1_BUF_SIZE - h->buf_len;
    n = read_some(h, asked);
    if (n == 0) {
        h->handler->failed(h, RIC_CLASS_RESET, 0,
                           "upstream closed the connection before a complete response head");
        return;
    }
    if (n == RIC_AGAIN) {
        return;
    }
    if (n == RIC_ERROR) {
        h->handler->failed(h, RIC_CLASS_RESET, errno, "reading from the upstream failed");
        return;
    }
    h->buf_len += (size_t) n;
    if (h->state == RIC_HTTP1_SENDING) {
        /* an answer is coming while the request still goes up: from now
         * on the upstream's pace is watched, so a stalled head cannot hang */
        ric_upconn_read_timeout(uc, h->read_timeout);
    }

    for (;;) {
        rc = ric_http_parse_response(&h->resp, h->buf, h->buf_len, h->method);
        if (rc == RIC_AGAIN) {
            if (h->buf_len == RIC_HTTP1_BUF_SIZE) {
                h->handler->failed(h, RIC_CLASS_BAD_RESPONSE, 0,
                                   "upstream sent too big a response head");
                return;
            }
            ack_partial(h, n, asked);
            return;
        }
        if (rc == RIC_ERROR) {
            h->handler->failed(h, RIC_CLASS_BAD_RESPONSE, 0, h->resp.error_reason
                               ? h->resp.error_reason : "upstream sent an invalid response");
            return;
        }
        if (h->resp.status >= 100 && h->resp.status < 200) {
            if (h->resp.status == 101) {
                h->handler->failed(h, RIC_CLASS_BAD_RESPONSE, 0,
                                   "upstream switched protocols unasked");
                return;
            }
            /* interim responses (103 Early Hints...) are not passed on */
            memmove(h->buf, h->buf + h->resp.head_len, h->buf_len - h->resp.head_len);
            h->buf_len -= h->resp.head_len;
            ric_http_msg_init(&h->resp);
            continue;
        }
        if (!all_here(h)) {
            ack_partial(h, n, asked);
        }
        if (h->state == RIC_HTTP1_SENDING) {
            /* a final answer before the whole request went up (413, 401...):
             * stop sending; the connection is not reused */
            event_del(&uc->wev);
            h->early_answer = 1;
        }
        h->state = RIC_HTTP1_HEAD;
        h->handler->head(h);
        return;
    }
}

int
ric_http1_read_body(ric_http1_t *h, int dechunk)
{
    h->state = RIC_HTTP1_BODY;
    if (scan_from_head(h, dechunk) != RIC_OK) {
        h->reusable = 0;
        return RIC_ERROR;
    }
    if (h->uc != NULL) {
        /* the body's pace: proxy_read_timeout between reads, whatever came before */
        ric_upconn_read_timeout(h->uc, h->read_timeout);
    }
    return RIC_OK;
}

void
ric_http1_pause(ric_http1_t *h)
{
    if (!h->reading_paused && h->uc != NULL) {
        ric_upconn_reading(h->uc, 0, 0);
        h->reading_paused = 1;
    }
}

int
ric_http1_splice(ric_http1_t *h)
{
    if (h->pipe == NULL) {
        if (h->done || h->uc == NULL || h->resp.body != RIC_BODY_LENGTH || h->body_left == 0
            || h->relay_start != h->relay_end || h->buf_len != 0
            || !ric_io_can_splice(&h->uc->io)) {
            return 0;
        }
        h->pipe = ric_pipe_get();
    }
    return h->pipe != NULL;
}

void
ric_http1_spliced(ric_http1_t *h)
{
    if (h->pipe->len == 0 && h->reading_paused && !h->done && h->uc != NULL) {
        h->reading_paused = 0;
        ric_upconn_reading(h->uc, 1, h->read_timeout);
    }
}

/* BODY, spliced: the next bytes of the body into the pipe. */
static void
splice_body(ric_http1_t *h)
{
    ssize_t n = ric_io_splice_in(&h->uc->io, h->pipe, (size_t) ric_min(h->body_left, (uint64_t) SSIZE_MAX));

    if (n == RIC_AGAIN) {
        if (h->pipe->len > 0) {
            ric_http1_pause(h); /* full (or the socket is dry): the caller empties it first */
        }
        return;
    }
    if (n == 0) {
        h->handler->body_failed(h, 0, "upstream closed the connection before the end of the body");
        return;
    }
    if (n == RIC_ERROR) {
        h->handler->body_failed(h, errno, "reading from the upstream failed");
        return;
    }
    h->body_left -= (uint64_t) n;
    if (h->body_left == 0) {
        h->done = 1;
        if (ric_io_unread(&h->uc->io)) {
            h->reusable = 0; /* more than Content-Length: never reuse (as scan_body) */
        }
    }
    h->handler->body(h);
}

void
ric_http1_consumed(ric_http1_t *h, size_t n)
{
    h->relay_start += n;
    if (h->relay_start < h->relay_end || h->done) {
        return;
    }
    /* everything relayed: the buffer is free for the next read (and a
     * spliced body reads on once its pipe is empty: ric_http1_spliced) */
    h->buf_len = h->relay_start = h->relay_end = 0;
    if (h->reading_paused && h->uc != NULL && (h->pipe == NULL || h->pipe->len == 0)) {
        h->reading_paused = 0;
        ric_upconn_reading(h->uc, 1, h->read_timeout);
    }
}

static void
read_body(ric_http1_t *h)
{
    size_t from = h->buf_len;
    ssize_t n;

    if (h->pipe != NULL && !h->done) {
        splice_body(h);
        return;
    }
    if (h->done || h->buf_len == RIC_HTTP1_BUF_SIZE) {
        /* nothing more is wanted, or no room: wait for the caller */
        ric_http1_pause(h);
        return;
    }
    n = read_some(h, RIC_HTTP1_BUF_SIZE - h->buf_len);
    if (n == RIC_AGAIN) {
        return;
    }
    if (n == 0) {
        if (h->resp.body == RIC_BODY_CLOSE) {
            h->done = 1;
            h->reusable = 0;
            h->handler->body(h);
            return;
        }
        h->handler->body_failed(h, 0, "upstream closed the connection before the end of the body");
        return;
    }
    if (n == RIC_ERROR) {
        h->handler->body_failed(h, errno, "reading from the upstream failed");
        return;
    }
    h->buf_len += (size_t) n;
    if (scan_body(h, from) != RIC_OK) {
        h->handler->body_failed(h, 0, "upstream sent an invalid chunked body");
        return;
    }
    h->handler->body(h);
}

/* --- a response dropped for a retry ------------------------------------------ */

void
ric_http1_release(ric_http1_t *h)
{
    ric_pipe_put(h->pipe);
    h->pipe = NULL;
    if (h->uc == NULL) {
        return;
    }
    if (h->done && h->reusable && h->resp.keep_alive) {
        h->uc->requests++;
        ric_upstream_pool_put(h->uc);
    } else {
        ric_upconn_close(h->uc);
    }
    h->uc = NULL;
}

/* The dropped response is here whole: keep its bytes only. */
static void
kept_whole(ric_http1_t *h)
{
    h->buf_len = h->relay_end;
    ric_http1_release(h);
}

/* --- a response nobody wants, drained off its connection ----------------- */

/* The body bytes of a response read so far into buf (a chunked body's
 * framing included). */
static uint64_t
drain_taken(const ric_http1_t *h)
{
    return h->buf_len > h->resp.head_len ? h->buf_len - h->resp.head_len : 0;
}

/* Whether the rest of the dropped response may be read off its
 * connection: its framing says where it ends, and its body is within
 * upstream_drain_max (a chunked one's bytes, framing included, so far). */
static int
drain_allowed(const ric_http1_t *h)
{
    if (h->uc == NULL || h->read_wants_write || h->pipe != NULL) {
        return 0;
    }
    switch (h->resp.body) {
    case RIC_BODY_LENGTH:
        return h->resp.content_length <= h->drain_max;
    case RIC_BODY_CHUNKED:
        return drain_taken(h) <= h->drain_max;
    default:
        return 0; /* to the close: nothing to keep the connection for */
    }
}

/* The read timer of a drain: what is left of upstream_drain_timeout. */
static void
drain_arm(ric_upconn_t *uc, int64_t until_ms)
{
    ric_upconn_read_timeout(uc, ric_max(until_ms - ric_now_ms(), (int64_t) 1));
}

static void on_drain_read(ric_upconn_t *uc, short what);

/* The connection goes on draining without h (h->uc is NULL after), when
 * it may carry another request once drained; else it is closed. */
static void
drain_alone(ric_http1_t *h)
{
    ric_upconn_t *uc = h->uc;
    ric_upconn_drain_t *d = &uc->drain;
    int may = h->reusable && h->resp.keep_alive && drain_allowed(h);

    h->uc = NULL;
    if (!may) {
        ric_upconn_close(uc);
        return;
    }
    d->chunked_body = h->resp.body == RIC_BODY_CHUNKED;
    d->chunked = h->chunked;
    d->left = d->chunked_body ? h->drain_max - drain_taken(h) : h->body_left;
    d->until_ms = h->drain_until_ms;
    event_del(&uc->wev);
    ric_upconn_own(uc, uc, on_drain_read, NULL);
    ric_upstream_drain_begin(uc);
    drain_arm(uc, d->until_ms);
}

/* A connection draining alone: read and count what is left (into a
 * scratch buffer: the bytes go nowhere), then back to the pool; closed
 * when the response breaks, outgrows upstream_drain_max, or outlasts
 * upstream_drain_timeout. */
static void
on_drain_read(ric_upconn_t *uc, short what)
{
    ric_upconn_drain_t *d = &uc->drain;
    u_char scratch[4096];
    const u_char *pos, *end, *data;
    size_t dlen;
    ssize_t n;
    int rc;

    if (what & EV_TIMEOUT) {
        ric_upstream_drain_end(uc, 0);
        return;
    }
    for (;;) {
        n = ric_io_read(&uc->io, scratch, (size_t) ric_min(d->left, (uint64_t) sizeof(scratch)));
        if (n == RIC_AGAIN && uc->io.want != RIC_IO_WANT_WRITE) {
            drain_arm(uc, d->until_ms);
            return;
        }
        if (n <= 0) {
            ric_upstream_drain_end(uc, 0); /* closed, broken, or TLS that must write first */
            return;
        }
        d->left -= (uint64_t) n;
        if (!d->chunked_body) {
            if (d->left == 0) {
                ric_upstream_drain_end(uc, 1);
                return;
            }
            continue;
        }
        pos = scratch;
        end = scratch + n;
        while ((rc = ric_http_chunked_next(&d->chunked, &pos, end, &data, &dlen)) == RIC_OK) {
            /* the data goes nowhere */
        }
        if (rc == RIC_DONE) {
            ric_upstream_drain_end(uc, pos == end); /* bytes past the end: never reused */
            return;
        }
        if (rc == RIC_ERROR || d->left == 0) {
            ric_upstream_drain_end(uc, 0);
            return;
        }
    }
}

int
ric_http1_drop(ric_http1_t *h)
{
    int rc = scan_from_head(h, 0);

    if (rc == RIC_OK && h->done) {
        kept_whole(h);
        return 1;
    }
    if (rc != RIC_OK || !drain_allowed(h)) {
        if (h->uc != NULL) {
            ric_upconn_close(h->uc);
            h->uc = NULL;
        }
        return -1;
    }
    h->drain_until_ms = ric_now_ms() + h->drain_timeout;
    if (h->resp.body == RIC_BODY_CHUNKED
        || h->resp.head_len + h->resp.content_length <= RIC_HTTP1_BUF_SIZE) {
        /* small: read on into buf, to keep it as an answer of last resort */
        h->state = RIC_HTTP1_DRAIN;
        drain_arm(h->uc, h->drain_until_ms);
        return 0;
    }
    drain_alone(h);
    return -1;
}

static void
read_drain(ric_http1_t *h)
{
    size_t from = h->buf_len, asked = RIC_HTTP1_BUF_SIZE - h->buf_len;
    ssize_t n;

    n = read_some(h, asked);
    if (n == RIC_AGAIN) {
        if (!h->read_wants_write) {
            drain_arm(h->uc, h->drain_until_ms);
            return;
        }
        n = RIC_ERROR; /* TLS that must write first: not worth it for a dropped answer */
    }
    if (n > 0) {
        h->buf_len += (size_t) n;
        if (scan_body(h, from) == RIC_OK) {
            if (h->done) {
                kept_whole(h);
                h->handler->drained(h, 1);
                return;
            }
            if (h->buf_len < RIC_HTTP1_BUF_SIZE && drain_allowed(h)) {
                ack_partial(h, n, asked);
                drain_arm(h->uc, h->drain_until_ms);
                return;
            }
            /* too big to keep (a chunked body): drained alone, if it may */
            drain_alone(h);
            h->handler->drained(h, 0);
            return;
        }
    }
    /* broken or closed */
    ric_upconn_close(h->uc);
    h->uc = NULL;
    h->handler->drained(h, 0);
}

/* --- a small body read before the decision (a script classifies it) ------- */

static int
peek_too_big(const ric_http1_t *h)
{
    if (h->resp.body == RIC_BODY_LENGTH) {
        return h->resp.content_length > h->peek_max; /* peek_max fits the buffer */
    }
    /* the bytes read (chunk framing included): a chunked body near the limit
     * may be judged by its head although its data would fit */
    return h->buf_len - h->resp.head_len > h->peek_max
           || (!h->done && h->buf_len == RIC_HTTP1_BUF_SIZE);
}

int
ric_http1_peek(ric_http1_t *h, size_t max)
{
    h->peek_max = ric_min(max, RIC_HTTP1_BUF_SIZE - h->resp.head_len);
    if (scan_from_head(h, 0) != RIC_OK) {
        return RIC_ERROR;
    }
    if (peek_too_big(h)) {
        return 0; /* even when it is all here already: the rule is the size */
    }
    if (h->done) {
        return 1;
    }
    if (h->uc == NULL) {
        return 0;
    }
    h->state = RIC_HTTP1_PEEK;
    return RIC_AGAIN;
}

static void
read_peek(ric_http1_t *h)
{
    size_t from = h->buf_len, asked = RIC_HTTP1_BUF_SIZE - h->buf_len;
    ssize_t n;

    n = read_some(h, asked);
    if (n == RIC_AGAIN) {
        return;
    }
    if (n == 0 && h->resp.body == RIC_BODY_CLOSE) {
        h->done = 1;
        h->reusable = 0;
        h->handler->peeked(h, 1);
        return;
    }
    if (n == 0 || n == RIC_ERROR) {
        h->handler->failed(h, RIC_CLASS_RESET, n == 0 ? 0 : errno,
                           "upstream closed the connection before the end of the body");
        return;
    }
    h->buf_len += (size_t) n;
    if (scan_body(h, from) != RIC_OK) {
        h->handler->failed(h, RIC_CLASS_BAD_RESPONSE, 0, "upstream sent an invalid chunked body");
        return;
    }
    if (peek_too_big(h)) {
        h->handler->peeked(h, 0);
    } else if (h->done) {
        h->handler->peeked(h, 1);
    } else {
        ack_partial(h, n, asked);
    }
}

void
ric_http1_peeked_body(const ric_http1_t *h, ric_buf_t *out)
{
    ric_http_chunked_t c;
    const u_char *p = h->buf + h->resp.head_len, *end = h->buf + h->buf_len, *data;
    size_t dlen;

    if (h->resp.body != RIC_BODY_CHUNKED) {
        ric_buf_put(out, p, (size_t) (h->relay_end - h->resp.head_len));
        return;
    }
    ric_http_chunked_init(&c);
    while (ric_http_chunked_next(&c, &p, end, &data, &dlen) == RIC_OK) {
        ric_buf_put(out, data, dlen);
    }
}

void
ric_http1_free(ric_http1_t *h)
{
    if (h->uc != NULL && h->state == RIC_HTTP1_PEEK) {
        /* a peek's framing is the body's so far: it drains as a drop would */
        h->drain_until_ms = ric_now_ms() + h->drain_timeout;
        h->state = RIC_HTTP1_DRAIN;
    }
    if (h->uc != NULL && h->state == RIC_HTTP1_DRAIN) {
        drain_alone(h); /* a dropped response nobody keeps now: its connection may be reused */
    }
    ric_pipe_put(h->pipe);
    h->pipe = NULL;
    if (h->uc != NULL) {
        ric_upconn_close(h->uc);
        h->uc = NULL;
    }
    if (h->buf != NULL && !ric_keep_give(&bufs, h->buf)) {
        free(h->buf);
    }
    h->buf = NULL;
}

static void
on_read(ric_upconn_t *uc, short what)
{
    ric_http1_t *h = uc->owner;

    if (h->state == RIC_HTTP1_DRAIN) {
        if (what & EV_TIMEOUT) { /* upstream_drain_timeout */
            ric_upconn_close(h->uc);
            h->uc = NULL;
            h->handler->drained(h, 0);
            return;
        }
        read_drain(h);
        return;
    }
    if (h->state == RIC_HTTP1_PEEK && !(what & EV_TIMEOUT)) {
        read_peek(h);
        return;
    }
    if (h->state == RIC_HTTP1_HANDSHAKE) {
        handshake_event(h, what);
        return;
    }
    if (what & EV_TIMEOUT) {
        if (h->state == RIC_HTTP1_BODY) {
            h->handler->body_failed(h, 0, "upstream timed out (proxy_read_timeout)");
        } else {
            h->handler->failed(h, RIC_CLASS_TIMEOUT, 0, "upstream timed out (proxy_read_timeout)");
        }
        return;
    }
    switch (h->state) {
    case RIC_HTTP1_SENDING: /* an interim 1xx, or an early final answer */
    case RIC_HTTP1_HEAD:
        read_head(h);
        return;
    case RIC_HTTP1_BODY:
        read_body(h);
        return;
    default:
        return; /* connecting: the write event reports it */
    }
}
