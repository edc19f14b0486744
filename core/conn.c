/* conn.c: client connections: read and check requests, answer them in order, keep-alive and timeouts. */
#include "conn.h"
#include "access_log.h"
#include "log.h"
#include "proxy.h"
#include "route.h"
#include "worker.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CONN_IN_INITIAL 4096
/* the longest head we may have to hold: request line, fields, CRLFs */
#define CONN_IN_MAX (RIC_HTTP_MAX_REQUEST_LINE + RIC_HTTP_MAX_HEADER_BYTES + 1024)
#define CONN_OUT_INITIAL 1024
#define LINGER_TIMEOUT_MS 5000  /* quiet time that ends a lingering close */
#define LINGER_TOTAL_MS 30000   /* a lingering close never lasts longer */

static void on_read(evutil_socket_t fd, short what, void *arg);
static void on_write(evutil_socket_t fd, short what, void *arg);
static void conn_run(ric_conn_t *c);
static void conn_steps(ric_conn_t *c);
static void conn_free(ric_conn_t *c);
static void start_streaming(ric_conn_t *c);

static int64_t
now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct timeval
ms_to_tv(int64_t ms)
{
    struct timeval tv;

    if (ms < 0) {
        ms = 0;
    }
    tv.tv_sec = (time_t) (ms / 1000);
    tv.tv_usec = (suseconds_t) ((ms % 1000) * 1000);
    return tv;
}

static void
format_peer(ric_conn_t *c, const struct sockaddr *sa)
{
    unsigned port = 0;

    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *) sa;
        inet_ntop(AF_INET6, &s6->sin6_addr, c->peer_ip, sizeof(c->peer_ip));
        port = ntohs(s6->sin6_port);
        snprintf(c->peer, sizeof(c->peer), "[%s]:%u", c->peer_ip, port);
    } else if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *) sa;
        inet_ntop(AF_INET, &s4->sin_addr, c->peer_ip, sizeof(c->peer_ip));
        port = ntohs(s4->sin_port);
        snprintf(c->peer, sizeof(c->peer), "%s:%u", c->peer_ip, port);
    } else {
        snprintf(c->peer_ip, sizeof(c->peer_ip), "unknown");
        snprintf(c->peer, sizeof(c->peer), "unknown");
    }
    snprintf(c->peer_port, sizeof(c->peer_port), "%u", port);
}

int
ric_conn_accept(ric_worker_t *w, ric_listener_t *ls, int fd, const struct sockaddr *sa,
                socklen_t salen)
{
    ric_conn_t *c = ric_xcalloc(1, sizeof(*c));
    int one = 1;

    (void) salen;
    c->fd = fd;
    c->worker = w;
    c->listener = ls;
    c->state = RIC_CONN_HEAD;
    format_peer(c, sa);
    if (sa->sa_family != AF_UNIX) {
        /* answers are written whole: don't let Nagle hold back their tail */
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    c->rev = event_new(w->base, fd, EV_READ | EV_PERSIST, on_read, c);
    c->wev = event_new(w->base, fd, EV_WRITE, on_write, c);
    c->server = ls->default_server;
    c->settings = &ls->default_server->settings;
    ric_http_msg_init(&c->msg);
    ric_body_init(&c->body, 0, NULL);
    /* the first request must arrive within client_header_timeout */
    c->read_deadline = now_ms() + c->settings->client_header_timeout;
    ric_worker_conn_opened(w, c);
    ric_log_debug("accepted connection from %s on %s", c->peer, ls->text);
    conn_run(c);
    return RIC_OK;
}

void
ric_conn_close(ric_conn_t *c)
{
    if (c->closed) {
        return;
    }
    ric_log_debug("closing connection from %s", c->peer);
    c->closed = 1;
    if (c->proxy != NULL) {
        ric_proxy_abort(c->proxy);
    }
    ric_body_reset(&c->body);
    event_free(c->rev);
    event_free(c->wev);
    close(c->fd);
    ric_worker_conn_closed(c->worker, c);
    if (c->running == 0) {
        conn_free(c);
    }
    /* else the outermost conn_run on the stack frees it on its way out */
}


/* Makes room for n more bytes of output. */
static void
out_reserve(ric_conn_t *c, size_t n)
{
    if (c->out_len + n <= c->out_size) {
        return;
    }
    c->out_size = ric_max(c->out_size * 2, ric_max(c->out_len + n, (size_t) CONN_OUT_INITIAL));
    c->out = ric_xrealloc(c->out, c->out_size);
}

void
ric_conn_out_append(ric_conn_t *c, const void *p, size_t n)
{
    out_reserve(c, n);
    memcpy(c->out + c->out_len, p, n);
    c->out_len += n;
}

/* Queues a complete answer of the gateway's own, with a short text body. */
static void
respond(ric_conn_t *c, int status)
{
    char head[512], body[128];
    const char *reason = ric_http_status_text(status);
    int blen, hlen, head_only;

    blen = snprintf(body, sizeof(body), "%d %s\n", status, reason);
    head_only = c->msg.method == RIC_HTTP_HEAD && c->msg.head_len > 0;
    if (!c->msg.keep_alive || c->worker->shutting_down
        || c->settings->keepalive_timeout == 0
        || c->requests + 1 >= c->settings->keepalive_requests) {
        c->close_after = 1;
    }
    hlen = snprintf(head, sizeof(head),
                    "HTTP/1.1 %d %s\r\n"
                    "Server: ricochet\r\n"
                    "Date: %s\r\n"
                    "Content-Type: text/plain\r\n"
                    "Content-Length: %d\r\n"
                    "%s"
                    "\r\n",
                    status, reason, ric_worker_date(c->worker), blen,
                    c->close_after ? "Connection: close\r\n"
                    : c->msg.version == 10 ? "Connection: keep-alive\r\n" : "");
    ric_conn_out_append(c, head, (size_t) hlen);
    if (!head_only) {
        ric_conn_out_append(c, body, (size_t) blen);
    }
    c->status = status;
    c->state = RIC_CONN_WRITE;
}

/* Logs an answer the gateway gave itself, to the route's access log. */
static void
log_local_answer(ric_conn_t *c)
{
    const ric_http_refs_t *refs = c->location ? &c->location->refs : &c->server->refs;
    ric_access_entry_t e;

    if (refs->access_log == NULL || refs->access_log->fd == -1) {
        return;
    }
    memset(&e, 0, sizeof(e));
    e.client = c->peer;
    if (c->msg.head_len > 0) {
        e.method = ric_http_span(c->in, c->msg.method_off, c->msg.method_len);
        e.path = ric_http_span(c->in, c->msg.target_off, c->msg.target_len);
        if (c->msg.host_index >= 0) {
            e.host = ric_http_span(c->in, c->msg.fields[c->msg.host_index].value_off,
                                   c->msg.fields[c->msg.host_index].value_len);
        }
    }
    e.status = c->status;
    e.bytes = c->out_len;
    e.duration_us = c->request_start_us ? ric_now_us() - c->request_start_us : 0;
    ric_access_log_write(refs->access_log, &e);
}

/* An answer after which nothing more on this connection is read. */
static void
respond_close(ric_conn_t *c, int status)
{
    c->close_after = 1;
    c->linger = 1;
    c->msg.keep_alive = 0;
    respond(c, status);
    log_local_answer(c);
}

/* Keeps reading c with no timer: event_add with no time leaves an earlier
 * timer in place, so it is removed on its own. */
static void
read_without_timeout(ric_conn_t *c)
{
    event_add(c->rev, NULL);
    event_remove_timer(c->rev);
}

static void
arm_read(ric_conn_t *c, int64_t deadline)
{
    struct timeval tv = ms_to_tv(deadline - now_ms());

    event_add(c->rev, &tv);
}

/* Gives the buffer room to read into; RIC_ERROR when the head is at its limit. */
static int
in_reserve(ric_conn_t *c)
{
    size_t size;

    if (c->in_len < c->in_size) {
        return RIC_OK;
    }
    if (c->in_size >= CONN_IN_MAX + CONN_IN_INITIAL) {
        return RIC_ERROR;
    }
    size = c->in_size ? c->in_size * 2 : CONN_IN_INITIAL;
    c->in = ric_xrealloc(c->in, ric_min(size, (size_t) (CONN_IN_MAX + CONN_IN_INITIAL)));
    c->in_size = ric_min(size, (size_t) (CONN_IN_MAX + CONN_IN_INITIAL));
    return RIC_OK;
}

/* Reads what the socket has. Returns bytes read, 0 at EOF, RIC_AGAIN, or
 * RIC_ERROR. */
static ssize_t
read_some(ric_conn_t *c)
{
    ssize_t n;

    if (in_reserve(c) != RIC_OK) {
        return RIC_AGAIN; /* the parser reports the limit; never read past it */
    }
    do {
        n = recv(c->fd, c->in + c->in_len, c->in_size - c->in_len, 0);
    } while (n == -1 && errno == EINTR);
    if (n == -1) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
            return RIC_AGAIN;
        }
        if (errno != ECONNRESET) {
            ric_log_error(RIC_LOG_INFO, errno, "recv() failed, client: %s", c->peer);
        }
        return RIC_ERROR;
    }
    c->in_len += (size_t) n;
    return n;
}

static void
log_client_error(ric_conn_t *c, const char *what, int status, const char *reason)
{
    ric_log_error(RIC_LOG_INFO, 0, "client sent %s (%d: %s) while reading the request, client: %s",
                  what, status, reason ? reason : ric_http_status_text(status), c->peer);
}

static int
proxied(const ric_conn_t *c)
{
    return c->location != NULL && c->location->upstream != NULL;
}

/* The request is read whole: proxy it, or answer it here. */
static void
handle(ric_conn_t *c)
{
    if (proxied(c)) {
        /* until the answer is out, nothing more is read from the client
         * but an end of stream, which aborts the exchange; the client's
         * own timeouts stop (event_add with no time keeps an old timer) */
        read_without_timeout(c);
        ric_proxy_start(c);
        return;
    }
    respond(c, 404);
    log_local_answer(c);
}

/* An absolute-form target ("http://host/path?q") names the host itself,
 * which wins over Host (RFC 9112 §3.2.2); routing uses its path. path
 * arrives as the target up to '?'. */
static void
split_absolute_form(ric_str_t *path, ric_str_t *host)
{
    const u_char *p = path->data, *end = p + path->len, *auth;

    if (path->len == 0 || p[0] == '/' || p[0] == '*') {
        return;
    }
    auth = memchr(p, ':', path->len);
    if (auth == NULL || end - auth < 3 || auth[1] != '/' || auth[2] != '/') {
        return;
    }
    auth += 3;
    for (p = auth; p < end && *p != '/'; p++) {
    }
    host->data = auth;
    host->len = (size_t) (p - auth);
    if (p == end) {
        static const u_char slash[] = "/";
        path->data = slash;
        path->len = 1;
    } else {
        path->data = p;
        path->len = (size_t) (end - p);
    }
}

/* Sends "100 Continue" once, when the client waits for it before sending
 * its body (and has sent none yet). */
static int
send_continue(ric_conn_t *c)
{
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";

    if (c->msg.expect_continue && !c->continue_sent && c->in_len == c->in_used
        && c->msg.version == 11
        && send(c->fd, cont, sizeof(cont) - 1, MSG_NOSIGNAL) != (ssize_t) sizeof(cont) - 1) {
        return RIC_ERROR;
    }
    c->continue_sent = 1;
    return RIC_OK;
}

/* The head is parsed: pick the route and decide what happens to the body. */
static void
request_start(ric_conn_t *c)
{
    ric_http_msg_t *m = &c->msg;
    ric_location_conf_t *loc;
    ric_str_t host = ric_null_string;
    uint64_t limit;

    ric_str_t path = ric_http_span(c->in, m->target_off, m->path_len);
    u_char norm[RIC_HTTP_MAX_REQUEST_LINE];
    size_t norm_len;

    if (m->host_index >= 0) {
        host = ric_http_span(c->in, m->fields[m->host_index].value_off,
                             m->fields[m->host_index].value_len);
    }
    split_absolute_form(&path, &host);
    c->server = ric_route_server(c->listener, host);
    if (ric_route_normalize(path.data, path.len, norm, &norm_len) != RIC_OK) {
        c->settings = &c->server->settings;
        c->in_used = m->head_len;
        log_client_error(c, "an invalid request", 400, "invalid path");
        respond_close(c, 400);
        return;
    }
    /* locations see the decoded, normalized path, so /x/../small, //small
     * and /%73mall all meet the settings of location /small */
    path.data = norm;
    path.len = norm_len;
    loc = ric_route_location(c->server, path);
    c->location = loc;
    c->settings = loc ? &loc->settings : &c->server->settings;
    c->in_used = m->head_len;
    c->body_received = 0;
    c->continue_sent = 0;
    c->request_start_us = ric_now_us();
    if (proxied(c)) {
        ric_body_init(&c->body, (size_t) c->settings->client_body_buffer_size,
                      loc->refs.body_temp_path);
    }

    limit = (uint64_t) c->settings->client_max_body_size;
    if (m->body == RIC_BODY_LENGTH && limit > 0 && m->content_length > limit) {
        log_client_error(c, "too large a body", 413, NULL);
        respond_close(c, 413);
        return;
    }
    if (m->method == RIC_HTTP_CONNECT) {
        respond_close(c, 405);
        return;
    }
    if (m->body == RIC_BODY_NONE) {
        handle(c);
        return;
    }
    c->body_left = m->content_length;
    ric_http_chunked_init(&c->chunked);
    c->read_deadline = now_ms() + c->settings->client_body_timeout;
    c->state = RIC_CONN_BODY;
    if (proxied(c) && m->body == RIC_BODY_LENGTH
        && m->content_length > (uint64_t) c->settings->retry_body_max) {
        /* too large to hold for replay: it streams through, sent once */
        if (send_continue(c) != RIC_OK) {
            ric_conn_close(c);
            return;
        }
        start_streaming(c);
    }
}

/* Drops body bytes [from, to) of in[] by moving what follows down. */
static void
in_discard(ric_conn_t *c, size_t from, size_t to)
{
    memmove(c->in + from, c->in + to, c->in_len - to);
    c->in_len -= to - from;
}

/* Where body bytes go: nowhere (answered here), the replay buffer, or the
 * upstream as they come (streaming). RIC_OK; RIC_ERROR when the temp file
 * failed; RIC_DECLINED when the buffer just passed retry_body_max, so the
 * rest must stream. */
static int
body_sink(ric_conn_t *c, const u_char *data, size_t n)
{
    if (!proxied(c)) {
        return RIC_OK;
    }
    if (c->body_streaming) {
        if (c->proxy != NULL && ric_proxy_body_data(c->proxy, data, n)) {
            c->body_paused = 1;
        }
        return RIC_OK;
    }
    if (ric_body_append(&c->body, data, n) != RIC_OK) {
        return RIC_ERROR;
    }
    if (ric_body_size(&c->body) > (uint64_t) c->settings->retry_body_max) {
        return RIC_DECLINED;
    }
    return RIC_OK;
}

/* Consumes the body bytes in the buffer into the sink. Returns RIC_DONE,
 * RIC_AGAIN (more to come, or the sink is paused), RIC_DECLINED (switch to
 * streaming), or RIC_ERROR with c->body_error set (400, 413 or 500). */
static int
body_consume(ric_conn_t *c)
{
    size_t avail = c->in_len - c->in_used, take;
    uint64_t limit = (uint64_t) c->settings->client_max_body_size;
    const u_char *p, *end, *data;
    size_t dlen;
    int rc, sink = RIC_OK;

    if (c->msg.body == RIC_BODY_LENGTH) {
        take = (size_t) ric_min((uint64_t) avail, c->body_left);
        if (take > 0) {
            sink = body_sink(c, c->in + c->in_used, take);
            if (sink == RIC_ERROR) {
                c->body_error = 500;
                return RIC_ERROR;
            }
        }
        in_discard(c, c->in_used, c->in_used + take);
        c->body_left -= take;
        c->body_received += take;
        if (c->body_left == 0) {
            return RIC_DONE;
        }
        return sink == RIC_DECLINED ? RIC_DECLINED : RIC_AGAIN;
    }

    p = c->in + c->in_used;
    end = c->in + c->in_len;
    for (;;) {
        rc = ric_http_chunked_next(&c->chunked, &p, end, &data, &dlen);
        if (rc != RIC_OK) {
            break;
        }
        c->body_received += dlen;
        if (limit > 0 && c->body_received > limit) {
            log_client_error(c, "too large a body", 413, NULL);
            c->body_error = 413;
            return RIC_ERROR;
        }
        sink = body_sink(c, data, dlen);
        if (sink == RIC_ERROR) {
            c->body_error = 500;
            return RIC_ERROR;
        }
        if (sink == RIC_DECLINED || c->body_paused) {
            rc = RIC_AGAIN;
            break;
        }
    }
    in_discard(c, c->in_used, (size_t) (p - c->in));
    if (rc == RIC_ERROR) {
        log_client_error(c, "an invalid chunked body", 400, NULL);
        c->body_error = 400;
        return RIC_ERROR;
    }
    if (rc == RIC_DONE) {
        return RIC_DONE;
    }
    return sink == RIC_DECLINED ? RIC_DECLINED : RIC_AGAIN;
}

/* The body of a streaming request broke (bad chunk, too large, stalled):
 * answer it when nothing of the upstream's answer went out yet. */
static void
stream_error(ric_conn_t *c, int status)
{
    if (c->proxy != NULL && ric_proxy_responding(c->proxy)) {
        ric_conn_close(c);
        return;
    }
    if (c->proxy != NULL) {
        ric_proxy_discard(c->proxy); /* the answer below is what gets logged */
    }
    c->out_len = c->out_sent = 0;
    respond_close(c, status);
    conn_run(c);
}

/* Passes the body bytes that arrived to the upstream, while the proxy runs. */
static void
stream_body(ric_conn_t *c)
{
    int rc;

    if (c->body_paused || c->body_done || c->state != RIC_CONN_PROXY) {
        return;
    }
    rc = body_consume(c);
    if (c->state != RIC_CONN_PROXY) {
        return; /* the exchange ended meanwhile */
    }
    switch (rc) {
    case RIC_DONE:
        c->body_done = 1;
        read_without_timeout(c);
        if (c->proxy != NULL) {
            ric_proxy_body_done(c->proxy);
        }
        return;
    case RIC_ERROR:
        stream_error(c, c->body_error);
        return;
    default:
        if (c->body_paused) {
            event_del(c->rev); /* the upstream is behind: stop reading the client */
        } else if (c->proxy != NULL && ric_proxy_answered(c->proxy)) {
            /* the upstream answered early: the rest of the body is read and
             * dropped without a clock, so no 408 can land in the answer */
            read_without_timeout(c);
        } else {
            arm_read(c, c->read_deadline);
        }
    }
}

void
ric_conn_body_answered(ric_conn_t *c)
{
    if (c->body_streaming && !c->body_done) {
        /* the rest of the body is read and dropped, with no clock running,
         * so no 408 can land in the middle of the answer */
        c->body_paused = 0;
        read_without_timeout(c);
    }
}

void
ric_conn_body_resume(ric_conn_t *c)
{
    if (!c->body_paused) {
        return;
    }
    c->body_paused = 0;
    c->read_deadline = now_ms() + c->settings->client_body_timeout;
    stream_body(c);
}

/* Starts proxying a body that will not be held whole. */
static void
start_streaming(ric_conn_t *c)
{
    c->body_streaming = 1;
    handle(c);
    if (c->state == RIC_CONN_PROXY) {
        stream_body(c);
    }
}

/* Writes pending output. RIC_OK when all is written, RIC_AGAIN, RIC_ERROR. */
static int
flush_out(ric_conn_t *c)
{
    ssize_t n;

    while (c->out_sent < c->out_len) {
        n = send(c->fd, c->out + c->out_sent, c->out_len - c->out_sent, MSG_NOSIGNAL);
        if (n == -1) {
            if (errno == EINTR) {
                continue;
            }
            if (errno == EAGAIN || errno == EWOULDBLOCK) {
                return RIC_AGAIN;
            }
            if (errno != EPIPE && errno != ECONNRESET) {
                ric_log_error(RIC_LOG_INFO, errno, "send() failed, client: %s", c->peer);
            }
            return RIC_ERROR;
        }
        c->out_sent += (size_t) n;
    }
    c->out_len = c->out_sent = 0;
    return RIC_OK;
}

/* After an answer that closes: stop sending, read and drop what the client
 * still sends for a while, so the answer is not destroyed by a reset. */
static void
start_linger(ric_conn_t *c)
{
    if (shutdown(c->fd, SHUT_WR) == -1) {
        ric_conn_close(c);
        return;
    }
    c->state = RIC_CONN_LINGER;
    c->in_len = 0;
    c->read_deadline = now_ms() + LINGER_TOTAL_MS;
    arm_read(c, ric_min(c->read_deadline, now_ms() + LINGER_TIMEOUT_MS));
}

/* The answer is written: get ready for the next request on the connection. */
static void
request_finish(ric_conn_t *c)
{
    size_t used = c->in_used ? c->in_used : c->msg.head_len;

    c->requests++;
    /* the idle wait follows the route that answered, not the defaults */
    c->keepalive_timeout = c->settings->keepalive_timeout;
    if (used > 0 && used <= c->in_len) {
        in_discard(c, 0, used);
    }
    c->in_used = 0;
    ric_http_msg_init(&c->msg);
    ric_body_reset(&c->body);
    c->body_streaming = c->body_done = c->body_paused = 0;
    c->location = NULL;
    c->state = RIC_CONN_HEAD;
    c->server = c->listener->default_server;
    c->settings = &c->server->settings;
    if (c->in_len > 0) {
        c->read_deadline = now_ms() + c->settings->client_header_timeout;
    }
}

static void
conn_free(ric_conn_t *c)
{
    free(c->in);
    free(c->out);
    free(c);
}

/* Runs the connection's state machine as far as it goes. Calls may nest
 * (an exchange that ends at once answers from inside the step that began
 * it), so a close inside only marks the connection, and the outermost run
 * frees it. */
static void
conn_run(ric_conn_t *c)
{
    c->running++;
    conn_steps(c);
    if (--c->running == 0 && c->closed) {
        conn_free(c);
    }
}

static void
conn_steps(ric_conn_t *c)
{
    int rc;
    struct timeval tv;

    for (;;) {
        if (c->closed) {
            return;
        }
        switch (c->state) {
        case RIC_CONN_HEAD:
            if (c->in_len == 0) {
                if (c->requests > 0) {
                    /* idle between requests: keepalive_timeout applies */
                    tv = ms_to_tv(c->keepalive_timeout);
                    event_add(c->rev, &tv);
                } else {
                    arm_read(c, c->read_deadline);
                }
                return;
            }
            rc = ric_http_parse_request(&c->msg, c->in, c->in_len);
            if (rc == RIC_AGAIN) {
                arm_read(c, c->read_deadline);
                return;
            }
            if (rc == RIC_ERROR) {
                log_client_error(c, "an invalid request", c->msg.error_status,
                                 c->msg.error_reason);
                respond_close(c, c->msg.error_status);
                break;
            }
            request_start(c);
            break;

        case RIC_CONN_BODY:
            if (send_continue(c) != RIC_OK) {
                ric_conn_close(c);
                return;
            }
            rc = body_consume(c);
            if (rc == RIC_AGAIN) {
                arm_read(c, c->read_deadline);
                return;
            }
            if (rc == RIC_DONE) {
                handle(c);
            } else if (rc == RIC_DECLINED) {
                start_streaming(c);
            } else {
                respond_close(c, c->body_error);
            }
            break;

        case RIC_CONN_PROXY:
            return; /* the proxy drives until ric_conn_proxy_done */

        case RIC_CONN_WRITE:
            rc = flush_out(c);
            if (rc == RIC_AGAIN) {
                /* don't read the next request before this answer is out */
                event_del(c->rev);
                tv = ms_to_tv(c->settings->send_timeout);
                event_add(c->wev, &tv);
                return;
            }
            if (rc == RIC_ERROR) {
                ric_conn_close(c);
                return;
            }
            if (c->close_after) {
                if (c->linger) {
                    start_linger(c);
                } else {
                    ric_conn_close(c);
                }
                return;
            }
            request_finish(c);
            break;

        case RIC_CONN_LINGER:
            return;
        }
    }
}

void
ric_conn_shutdown(ric_conn_t *c)
{
    ssize_t n;

    c->close_after = 1;
    if (c->proxy != NULL) {
        /* leave room to write the answer before worker_shutdown_timeout */
        ric_proxy_shutdown(c->proxy, now_ms() + c->worker->conf->worker_shutdown_timeout * 9 / 10);
        return;
    }
    if (c->state != RIC_CONN_HEAD || c->in_len > 0) {
        return; /* in flight: closes once answered */
    }
    /* idle, unless a request arrived that the loop has not read yet: such
     * a client already sent its request and deserves an answer */
    n = read_some(c);
    if (n > 0) {
        if (c->requests > 0) {
            c->read_deadline = now_ms() + c->settings->client_header_timeout;
        }
        conn_run(c);
        return;
    }
    ric_conn_close(c);
}

static void
on_read(evutil_socket_t fd, short what, void *arg)
{
    ric_conn_t *c = arg;
    ssize_t n;
    char drain[4096];

    (void) fd;
    if (c->state == RIC_CONN_LINGER) {
        if (what & EV_TIMEOUT) {
            ric_conn_close(c);
            return;
        }
        n = recv(c->fd, drain, sizeof(drain), 0);
        if (n == 0 || (n == -1 && errno != EAGAIN && errno != EINTR)
            || now_ms() >= c->read_deadline) {
            ric_conn_close(c);
            return;
        }
        arm_read(c, ric_min(c->read_deadline, now_ms() + LINGER_TIMEOUT_MS));
        return;
    }

    if (c->state == RIC_CONN_PROXY && c->body_streaming && !c->body_done) {
        if (what & EV_TIMEOUT) {
            ric_log_error(RIC_LOG_INFO, 0, "client timed out (408) while sending a streamed "
                          "request body, client: %s", c->peer);
            stream_error(c, 408);
            return;
        }
        n = read_some(c);
        if (n == 0 || n == RIC_ERROR) {
            ric_log_error(RIC_LOG_INFO, 0, "client closed the connection while sending the "
                          "request body, client: %s", c->peer);
            ric_conn_close(c);
            return;
        }
        c->read_deadline = now_ms() + c->settings->client_body_timeout;
        stream_body(c);
        return;
    }
    if (what & EV_TIMEOUT) {
        if (c->state == RIC_CONN_PROXY) {
            /* the client's clocks stop while the upstream works */
            event_remove_timer(c->rev);
            return;
        }
        if (c->state == RIC_CONN_HEAD && c->in_len == 0 && c->requests > 0) {
            ric_conn_close(c); /* idle keep-alive connection */
            return;
        }
        ric_log_error(RIC_LOG_INFO, 0, "client timed out (408) while reading the request %s, "
                      "client: %s", c->state == RIC_CONN_BODY ? "body" : "head", c->peer);
        event_del(c->rev);
        respond_close(c, 408);
        conn_run(c);
        return;
    }
    if (c->state == RIC_CONN_WRITE) {
        event_del(c->rev);
        return;
    }
    if (c->state == RIC_CONN_PROXY) {
        /* pipelined bytes wait in the buffer; an end of stream means the
         * client gave up, and the exchange with it */
        if (c->in_len == c->in_size) {
            event_del(c->rev);
            return;
        }
        n = read_some(c);
        if (n == 0 || n == RIC_ERROR) {
            ric_log_error(RIC_LOG_INFO, 0, "client closed the connection while waiting for "
                          "the upstream, client: %s", c->peer);
            ric_conn_close(c);
        }
        return;
    }

    if (c->state == RIC_CONN_HEAD && c->in_len == 0 && c->requests > 0) {
        /* the first byte of a new request starts its header timeout */
        c->read_deadline = now_ms() + c->settings->client_header_timeout;
    }
    n = read_some(c);
    if (n == RIC_AGAIN) {
        if (c->state == RIC_CONN_BODY) {
            c->read_deadline = now_ms() + c->settings->client_body_timeout;
        }
        conn_run(c);
        return;
    }
    if (n == 0 || n == RIC_ERROR) {
        if (c->state == RIC_CONN_BODY || (c->state == RIC_CONN_HEAD && c->in_len > 0)) {
            ric_log_error(RIC_LOG_INFO, 0, "client closed the connection while reading the "
                          "request, client: %s", c->peer);
        }
        ric_conn_close(c);
        return;
    }
    if (c->state == RIC_CONN_BODY) {
        /* client_body_timeout is the longest pause between two reads */
        c->read_deadline = now_ms() + c->settings->client_body_timeout;
    }
    conn_run(c);
}

static void
on_write(evutil_socket_t fd, short what, void *arg)
{
    ric_conn_t *c = arg;

    (void) fd;
    if (what & EV_TIMEOUT) {
        ric_log_error(RIC_LOG_INFO, 0, "client timed out while sending the response, "
                      "client: %s", c->peer);
        ric_conn_close(c);
        return;
    }
    if (c->state == RIC_CONN_PROXY) {
        ric_proxy_client_writable(c->proxy);
        return;
    }
    /* reading, paused while the answer was pending, is re-armed by the
     * state that follows */
    conn_run(c);
}

void
ric_conn_continue(ric_conn_t *c)
{
    conn_run(c);
}

void
ric_conn_respond(ric_conn_t *c, int status)
{
    if (c->body_streaming && !c->body_done) {
        /* the rest of the body was never read: nothing after it can be trusted */
        c->close_after = 1;
        c->linger = 1;
    }
    c->out_len = c->out_sent = 0;
    respond(c, status);
}

void
ric_conn_proxy_done(ric_conn_t *c)
{
    c->state = RIC_CONN_WRITE;
    conn_run(c);
}
