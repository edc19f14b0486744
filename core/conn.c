/* conn.c: client connections: read requests and their bodies, write answers in order, keep-alive, timeouts, lingering close. */
#include "conn.h"
#include "log.h"
#include "metrics.h"
#include "tls.h"
#include "tls_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>

#define CONN_IN_INITIAL 4096
/* the longest head we may have to hold: request line, fields, CRLFs */
#define CONN_IN_MAX (RIC_HTTP_MAX_REQUEST_LINE + RIC_HTTP_MAX_HEADER_BYTES + 1024)
#define LINGER_TIMEOUT_MS 5000  /* quiet time that ends a lingering close */
#define LINGER_TOTAL_MS 30000   /* a lingering close never lasts longer */
#define DRAIN_IDLE_MS 1000      /* at a drain, an idle connection's last chance for a request */

static void on_read(evutil_socket_t fd, short what, void *arg);
static void wait_read(ric_conn_t *c, const struct timeval *tv);
static void arm_read(ric_conn_t *c, int64_t deadline);
static void on_write(evutil_socket_t fd, short what, void *arg);
static void conn_run(ric_conn_t *c);
static ric_conn_t *conn_alloc(void);
static void conn_free(ric_conn_t *c);
/* The worker stops now: closes c, a request under way ending as shutdown. */
static void conn_stop(ric_conn_t *c);
/* Closes c if it is idle between requests (the set needs the room); 1 when it did. */
static int conn_reclaim(ric_conn_t *c);
/* Graceful stop: closes c if it is idle (after a moment for a request that
 * may be on its way); otherwise once its current answer is written. */
static void conn_shutdown(ric_conn_t *c);

/* The client's address as logs show it: "IP:PORT", "[IPv6]:PORT". Once
 * per connection, so by hand rather than by printf. */
static void
format_peer(ric_conn_t *c, const struct sockaddr *sa)
{
    unsigned port = 0;
    size_t n = 0, ip;
    int v6 = sa->sa_family == AF_INET6;

    if (v6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *) sa;
        inet_ntop(AF_INET6, &s6->sin6_addr, c->peer_ip, sizeof(c->peer_ip));
        port = ntohs(s6->sin6_port);
    } else if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *) sa;
        inet_ntop(AF_INET, &s4->sin_addr, c->peer_ip, sizeof(c->peer_ip));
        port = ntohs(s4->sin_port);
    } else {
        memcpy(c->peer_ip, "unknown", 8);
        memcpy(c->peer, "unknown", 8);
        memcpy(c->peer_port, "0", 2);
        return;
    }
    c->peer_port[ric_u64_to_dec(port, (u_char *) c->peer_port)] = '\0';
    ip = strlen(c->peer_ip);
    if (v6) {
        c->peer[n++] = '[';
    }
    memcpy(c->peer + n, c->peer_ip, ip);
    n += ip;
    if (v6) {
        c->peer[n++] = ']';
    }
    c->peer[n++] = ':';
    memcpy(c->peer + n, c->peer_port, strlen(c->peer_port) + 1);
}

/* --- the worker's set ------------------------------------------------------ */

#define RECLAIM_AT_ONCE 32 /* idle connections closed when the set is full */

/* A connection's state as the instance's gauges count it
 * (ricochet_connections): a head after the first is read while idle. */
static int
gauge_of(const ric_conn_t *c)
{
    switch (c->state) {
    case RIC_CONN_HANDSHAKE:
        return RIC_CS_HANDSHAKE;
    case RIC_CONN_REQUEST:
        return RIC_CS_ACTIVE;
    case RIC_CONN_LINGER:
        return RIC_CS_CLOSING;
    default:
        return c->requests > 0 ? RIC_CS_IDLE : RIC_CS_READING;
    }
}

static void
state_set(ric_conn_t *c, ric_conn_state_t st)
{
    int g;

    c->state = st;
    g = gauge_of(c);
    if (c->gauge > 0 && g != c->gauge - 1) {
        ric_metrics_conn_state(c->gauge - 1, g);
        c->gauge = g + 1;
    }
}

static void
set_add(ric_conn_set_t *s, ric_conn_t *c)
{
    ric_link_t *l, *next;
    int reclaimed = 0;

    if (s->counted) {
        c->gauge = gauge_of(c) + 1;
        ric_metrics_conn_state(-1, c->gauge - 1);
    }
    ric_list_push_front(&s->list, &c->link);
    if (++s->n < s->max) {
        return;
    }
    /* full: idle keep-alive clients make room for waiting ones (and
     * answers close their connections until there is room again) */
    for (l = s->list.head; l && reclaimed < RECLAIM_AT_ONCE; l = next) {
        next = l->next;
        if (l != &c->link) {
            reclaimed += conn_reclaim(ric_list_entry(l, ric_conn_t, link));
        }
    }
    if (s->n >= s->max && !s->draining) {
        ric_log_error(RIC_LOG_WARN, 0, "%lld worker_connections are not enough",
                      (long long) s->max);
        s->room(s->ctx, 0);
    }
}

static void
set_remove(ric_conn_set_t *s, ric_conn_t *c)
{
    ric_list_remove(&s->list, &c->link);
    if (c->gauge > 0) {
        ric_metrics_conn_state(c->gauge - 1, -1);
        c->gauge = 0;
    }
    s->n--;
    if (s->draining) {
        if (s->n == 0) {
            s->emptied(s->ctx);
        }
    } else if (s->n < s->max) {
        s->room(s->ctx, 1);
    }
}

void
ric_conn_set_drain(ric_conn_set_t *s, int64_t drain_ms)
{
    ric_link_t *l, *next;

    s->draining = 1;
    s->drain_ms = drain_ms;
    for (l = s->list.head; l; l = next) {
        next = l->next;
        conn_shutdown(ric_list_entry(l, ric_conn_t, link));
    }
}

void
ric_conn_set_close_all(ric_conn_set_t *s)
{
    ric_conn_t *c;

    s->draining = 1; /* closing the rest must not ask for room */
    while ((c = ric_list_first(&s->list, ric_conn_t, link)) != NULL) {
        conn_stop(c);
    }
}

/* --- a new connection ------------------------------------------------------- */

int
ric_conn_accept(ric_conn_set_t *s, ric_listener_t *ls, int fd, const struct sockaddr *sa,
                socklen_t salen)
{
    ric_conn_t *c = conn_alloc();

    (void) salen;
    ric_io_init_plain(&c->io, fd);
    c->set = s;
    c->base = s->base;
    c->listener = ls;
    state_set(c, RIC_CONN_HEAD);
    format_peer(c, sa); /* TCP_NODELAY: set on the listening socket, copied to c's */
    event_assign(&c->rev_ev, s->base, fd, EV_READ | EV_PERSIST, on_read, c);
    event_assign(&c->wev_ev, s->base, fd, EV_WRITE, on_write, c);
    c->rev = &c->rev_ev;
    c->wev = &c->wev_ev;
    c->settings = &ls->default_server->settings;
    ric_http_msg_init(&c->msg);
    if (ls->ssl) {
        /* the handshake first, within ssl_handshake_timeout; the request
         * head's clock starts when it is done */
        state_set(c, RIC_CONN_HANDSHAKE);
        c->read_deadline = ric_now_ms() + c->settings->ssl_handshake_timeout;
        if (ric_tls_server_accept(&c->io, ls) != RIC_OK) {
            ric_log_error(RIC_LOG_ERR, 0, "cannot start TLS on a connection, client: %s", c->peer);
            ric_io_close(&c->io);
            conn_free(c);
            return RIC_ERROR;
        }
    } else {
        /* the first request must arrive within client_header_timeout */
        c->read_deadline = ric_now_ms() + c->settings->client_header_timeout;
    }
    set_add(s, c);
    ric_log_debug("accepted connection from %s on %s", c->peer, ls->text);
    if (c->state == RIC_CONN_HANDSHAKE) {
        /* its first step when the loop comes to it, in turn with the
         * other connections, not within the accepting burst */
        arm_read(c, c->read_deadline);
        return RIC_OK;
    }
    conn_run(c);
    return RIC_OK;
}

/* Closes c; a request under way ends first, as `end` says. */
static void
conn_end(ric_conn_t *c, ric_request_end_t end)
{
    if (c->closed) {
        return;
    }
    if (c->r != NULL) {
        if (end == RIC_END_CLIENT_GONE && !c->orphan && c->set->handler->outlive(c->r, 0)) {
            /* the socket goes now; the connection, which the request
             * reads its head from, when the request ends */
            c->orphan = 1;
            event_del(c->rev);
            event_del(c->wev);
            c->rev = c->wev = NULL;
            ric_io_close(&c->io);
            /* an answer paused for a slow client waits for nobody now */
            c->running++;
            c->set->handler->writable(c->r);
            if (--c->running == 0 && c->closed) {
                conn_free(c);
            }
            return;
        }
        /* the request's finalize comes back here with c->r cleared */
        c->set->handler->gone(c->r, end);
        return;
    }
    ric_log_debug("closing connection from %s", c->peer);
    c->closed = 1;
    if (!c->orphan) {
        event_del(c->rev);
        event_del(c->wev);
        ric_io_close(&c->io);
    }
    set_remove(c->set, c);
    if (c->running == 0) {
        conn_free(c);
    }
    /* else the outermost entry on the stack frees it on its way out */
}

void
ric_conn_close(ric_conn_t *c)
{
    conn_end(c, RIC_END_CLIENT_GONE);
}

static void
conn_stop(ric_conn_t *c)
{
    conn_end(c, RIC_END_SHUTDOWN);
}

/* Freed connections kept, with their buffers, for the next ones. */
#define CONNS_KEPT 64
#define CONN_OUT_KEPT (16 * 1024)

static ric_keep_t conns = RIC_KEEP(CONNS_KEPT);

static ric_conn_t *
conn_alloc(void)
{
    ric_conn_t *c = ric_keep_take(&conns);
    u_char *in;
    size_t in_size;
    ric_buf_t out;

    if (c == NULL) {
        return ric_xcalloc(1, sizeof(*c));
    }
    in = c->in;
    in_size = c->in_size;
    out = c->out;
    memset(c, 0, sizeof(*c));
    c->in = in;
    c->in_size = in_size;
    c->out = out;
    c->out.len = 0;
    return c;
}

static void
conn_free(ric_conn_t *c)
{
    ric_assert(!c->recycled); /* freed twice would be handed out twice */
    /* the buffers a large head or an own answer grew go: a kept
     * connection holds what an ordinary request needs */
    if (c->in_size > CONN_IN_INITIAL) {
        free(c->in);
        c->in = NULL;
        c->in_size = 0;
    }
    if (c->out.size > CONN_OUT_KEPT) {
        ric_buf_free(&c->out);
    }
    c->recycled = 1;
    if (ric_keep_give(&conns, c)) {
        return;
    }
    free(c->in);
    ric_buf_free(&c->out);
    free(c);
}

/* --- reading --------------------------------------------------------------- */

/* Keeps reading c with no timer. */
static void
read_without_timeout(ric_conn_t *c)
{
    wait_read(c, NULL);
}

static void
arm_read(ric_conn_t *c, int64_t deadline)
{
    struct timeval tv = ric_ms_to_tv(deadline - ric_now_ms());

    wait_read(c, &tv);
}

/* Every wait for the client's bytes (the I/O layer reads at once what TLS
 * already took off the socket). None while a TLS read must write first:
 * the socket taking bytes resumes reading (on_write). */
static void
wait_read(ric_conn_t *c, const struct timeval *tv)
{
    if (!c->read_wants_write) {
        ric_io_arm(&c->io, c->rev, tv);
    }
}

/* A TLS read that must write before it reads on (a TLS 1.3 KeyUpdate's
 * answer, which OpenSSL sends before anything else, into a full send
 * buffer): the socket may stay readable while nothing can be read, and a
 * read event would wake the worker in a loop. Reading stops until the
 * socket takes bytes, as during the handshake; a client that takes
 * nothing for send_timeout is gone. */
static void
read_wait_write(ric_conn_t *c)
{
    struct timeval tv;

    c->read_wants_write = 1;
    event_del(c->rev);
    if (!event_pending(c->wev, EV_WRITE, NULL)) {
        tv = ric_ms_to_tv(c->settings->send_timeout); /* an answer's write keeps its own */
        event_add(c->wev, &tv);
    }
}

/* The socket took bytes after a read had to write first: the read waits
 * as its state has it again, and is tried at once (what OpenSSL took in
 * before, no readable event announces). */
static void
read_resume(ric_conn_t *c)
{
    c->read_wants_write = 0;
    switch (c->state) {
    case RIC_CONN_LINGER:
        arm_read(c, ric_min(c->read_deadline, ric_now_ms() + LINGER_TIMEOUT_MS));
        break;
    case RIC_CONN_REQUEST:
        if (c->body_reading && c->body_paused) {
            return; /* the request resumes it when it has room */
        }
        if (c->body_reading && !c->body_discard) {
            arm_read(c, c->read_deadline);
        } else {
            read_without_timeout(c);
        }
        break;
    default:
        /* a head: conn_run arms its wait, with its timer, when the read is done */
        event_add(c->rev, NULL);
        break;
    }
    event_active(c->rev, EV_READ, 0);
}

/* Gives the buffer room to read into; RIC_ERROR when the head is at its limit. */
static int
in_reserve(ric_conn_t *c)
{
    size_t size, max = CONN_IN_MAX + CONN_IN_INITIAL;

    if (c->in_len < c->in_size) {
        return RIC_OK;
    }
    if (c->in_size >= max) {
        return RIC_ERROR;
    }
    size = ric_min(c->in_size ? c->in_size * 2 : CONN_IN_INITIAL, max);
    c->in = ric_xrealloc(c->in, size);
    c->in_size = size;
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
    n = ric_io_read(&c->io, c->in + c->in_len, c->in_size - c->in_len);
    if (n == RIC_AGAIN && c->io.want == RIC_IO_WANT_WRITE) {
        read_wait_write(c);
    }
    if (n == RIC_ERROR && errno != ECONNRESET) {
        ric_log_error(RIC_LOG_INFO, errno, "reading from the client failed, client: %s", c->peer);
    }
    if (n > 0) {
        c->in_len += (size_t) n;
    }
    return n;
}

static void
log_client_error(ric_conn_t *c, const char *what, int status, const char *reason)
{
    ric_log_error(RIC_LOG_INFO, 0, "client sent %s (%d: %s) while reading the request, client: %s",
                  what, status, reason ? reason : ric_http_status_text(status), c->peer);
}

/* Drops body bytes [from, to) of in[] by moving what follows down. */
static void
in_discard(ric_conn_t *c, size_t from, size_t to)
{
    memmove(c->in + from, c->in + to, c->in_len - to);
    c->in_len -= to - from;
}

/* Hands n body bytes to the request (or drops them). RIC_OK, RIC_AGAIN
 * (the request is full: paused), RIC_ERROR (the request failed them). */
static int
body_sink(ric_conn_t *c, const u_char *data, size_t n)
{
    int rc;

    if (c->body_discard || n == 0) {
        return RIC_OK;
    }
    rc = c->set->handler->body_data(c->r, data, n);
    if (rc == RIC_AGAIN) {
        c->body_paused = 1;
    }
    return rc;
}

/* Consumes the body bytes in the buffer. Returns RIC_DONE, RIC_AGAIN (more
 * to come, or paused), or RIC_ERROR with c->body_error set. */
static int
body_consume(ric_conn_t *c)
{
    size_t avail = c->in_len - c->in_used, take;
    uint64_t limit = (uint64_t) c->settings->client_max_body_size;
    const u_char *p, *end, *data;
    size_t dlen;
    int rc = RIC_AGAIN;

    if (c->msg.body == RIC_BODY_LENGTH) {
        take = (size_t) ric_min((uint64_t) avail, c->body_left);
        rc = body_sink(c, c->in + c->in_used, take);
        in_discard(c, c->in_used, c->in_used + take);
        c->body_left -= take;
        c->body_received += take;
        if (rc == RIC_ERROR) {
            c->body_error = 500;
            return RIC_ERROR;
        }
        return c->body_left == 0 ? RIC_DONE : RIC_AGAIN;
    }

    p = c->in + c->in_used;
    end = c->in + c->in_len;
    while (!c->body_paused
           && (rc = ric_http_chunked_next(&c->chunked, &p, end, &data, &dlen)) == RIC_OK) {
        c->body_received += dlen;
        if (limit > 0 && c->body_received > limit) {
            log_client_error(c, "too large a body", 413, NULL);
            c->body_error = 413;
            return RIC_ERROR;
        }
        if (body_sink(c, data, dlen) == RIC_ERROR) {
            c->body_error = 500;
            return RIC_ERROR;
        }
    }
    in_discard(c, c->in_used, (size_t) (p - c->in));
    if (c->body_paused) {
        return RIC_AGAIN;
    }
    if (rc == RIC_ERROR) {
        log_client_error(c, "an invalid chunked body", 400, NULL);
        c->body_error = 400;
        return RIC_ERROR;
    }
    return rc == RIC_DONE ? RIC_DONE : RIC_AGAIN;
}

/* Moves the body along with what the buffer holds. */
static void
body_step(ric_conn_t *c)
{
    int rc;

    if (!c->body_reading || c->body_paused) {
        return;
    }
    rc = body_consume(c);
    if (c->r == NULL || !c->body_reading) {
        return; /* the request ended meanwhile */
    }
    switch (rc) {
    case RIC_DONE:
        c->body_reading = 0;
        c->body_complete = 1;
        read_without_timeout(c);
        c->set->handler->body_done(c->r);
        return;
    case RIC_ERROR:
        c->body_reading = 0;
        c->set->handler->body_failed(c->r, c->body_error);
        return;
    default:
        if (c->body_paused) {
            event_del(c->rev); /* the request is behind: stop reading the client */
        } else if (c->body_discard) {
            read_without_timeout(c);
        } else {
            arm_read(c, c->read_deadline);
        }
    }
}

/* Sends "100 Continue" once, when the client waits for it before sending
 * its body (and has sent none yet), through the one writer: a part the
 * socket does not take goes when it turns writable, or ahead of the
 * answer's head, whichever comes first. */
static int
send_continue(ric_conn_t *c)
{
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    size_t taken;
    int rc = RIC_OK;

    if (c->msg.expect_continue && !c->continue_sent && c->in_len == c->in_used
        && c->msg.version == 11) {
        ric_buf_put(&c->out, cont, sizeof(cont) - 1);
        rc = ric_conn_write(c, NULL, 0, &taken);
        c->interim_pending = rc == RIC_AGAIN;
    }
    c->continue_sent = 1;
    return rc == RIC_ERROR ? RIC_ERROR : RIC_OK;
}

/* The socket took more: the rest of the 100 Continue. */
static void
interim_flush(ric_conn_t *c)
{
    size_t taken;

    switch (ric_conn_write(c, NULL, 0, &taken)) {
    case RIC_OK:
        event_del(c->wev);
        break;
    case RIC_AGAIN:
        c->interim_pending = 1; /* armed again */
        break;
    default:
        ric_conn_close(c);
    }
}

void
ric_conn_body_read(ric_conn_t *c)
{
    if (!c->body_reading) {
        c->body_reading = 1;
        c->body_left = c->msg.content_length;
        ric_http_chunked_init(&c->chunked);
        if (send_continue(c) != RIC_OK) {
            ric_conn_close(c);
            return;
        }
    }
    c->body_paused = 0;
    c->read_deadline = ric_now_ms() + c->settings->client_body_timeout;
    c->running++;
    body_step(c);
    c->running--;
    conn_run(c);
}

void
ric_conn_body_discard(ric_conn_t *c)
{
    if (c->body_reading && !c->body_discard) {
        c->body_discard = 1;
        c->body_paused = 0;
        read_without_timeout(c);
    }
}

/* --- writing --------------------------------------------------------------- */

void
ric_conn_use_settings(ric_conn_t *c, const ric_http_settings_t *s)
{
    c->settings = s;
}

int
ric_conn_keepalive(ric_conn_t *c)
{
    /* a worker with no room for another client closes after answers, so
     * clients waiting to be accepted get a place (nginx reuses idle
     * keep-alive connections the same way) */
    if (!c->close_after && c->msg.keep_alive && !c->set->draining
        && c->set->n < c->set->max
        && c->settings->keepalive_timeout > 0
        && c->requests + 1 < c->settings->keepalive_requests
        && (c->msg.body == RIC_BODY_NONE || c->body_complete)) {
        c->promised = 1;
        return 1;
    }
    c->close_after = 1;
    return 0;
}

void
ric_conn_close_after(ric_conn_t *c)
{
    c->close_after = 1;
}

void
ric_conn_head_append(ric_conn_t *c, const void *p, size_t n)
{
    ric_buf_put(&c->out, p, n);
}

size_t
ric_conn_head_len(const ric_conn_t *c)
{
    return c->out.len;
}

ric_str_t
ric_conn_head_since(const ric_conn_t *c, size_t from, ric_pool_t *pool)
{
    ric_str_t v = ric_null_string;

    if (from < c->out.len) {
        v.len = c->out.len - from;
        v.data = (const u_char *) ric_pstrndup(pool, (const char *) c->out.data + from, v.len);
    }
    return v;
}

/* A write to the client returned RIC_AGAIN (wait for it, within
 * send_timeout) or RIC_ERROR (it is gone). */
static int
write_stopped(ric_conn_t *c, ssize_t w)
{
    struct timeval tv;

    if (w == RIC_AGAIN) {
        tv = ric_ms_to_tv(c->settings->send_timeout);
        ric_io_arm(&c->io, c->wev, &tv);
        return RIC_AGAIN;
    }
    if (errno != EPIPE && errno != ECONNRESET) {
        ric_log_error(RIC_LOG_INFO, errno, "writing to the client failed, client: %s", c->peer);
    }
    return RIC_ERROR;
}

int
ric_conn_write(ric_conn_t *c, const u_char *data, size_t n, size_t *taken)
{
    struct iovec iov[2];
    size_t head_left;
    ssize_t w;
    int iovcnt;

    *taken = 0;
    c->interim_pending = 0; /* whatever waited goes first now */
    if (c->orphan) {
        /* nobody to send to: the request goes on for its own sake */
        c->out.len = c->out_sent = 0;
        *taken = n;
        return RIC_OK;
    }
    for (;;) {
        head_left = c->out.len - c->out_sent;
        if (head_left == 0 && *taken == n) {
            c->out.len = c->out_sent = 0;
            return RIC_OK;
        }
        iovcnt = 0;
        if (head_left) {
            iov[iovcnt].iov_base = c->out.data + c->out_sent;
            iov[iovcnt++].iov_len = head_left;
        }
        if (*taken < n) {
            iov[iovcnt].iov_base = (void *) (data + *taken);
            iov[iovcnt++].iov_len = n - *taken;
        }
        w = ric_io_writev(&c->io, iov, iovcnt);
        if (w < 0) {
            return write_stopped(c, w);
        }
        c->response_bytes += (uint64_t) w;
        if ((size_t) w >= head_left) {
            c->out_sent = c->out.len;
            *taken += (size_t) w - head_left;
        } else {
            c->out_sent += (size_t) w;
        }
    }
}

int
ric_conn_can_splice(const ric_conn_t *c)
{
    return !c->orphan && ric_io_can_splice(&c->io);
}

int
ric_conn_splice(ric_conn_t *c, ric_pipe_t *p)
{
    size_t taken;
    ssize_t w;
    int rc;

    if ((rc = ric_conn_write(c, NULL, 0, &taken)) != RIC_OK) {
        return rc; /* the head first */
    }
    while (p->len > 0) {
        w = ric_io_splice_out(&c->io, p);
        if (w == 0) {
            errno = EIO; /* the pipe said it was empty: never spin on it */
            w = RIC_ERROR;
        }
        if (w < 0) {
            return write_stopped(c, w);
        }
        c->response_bytes += (uint64_t) w;
    }
    return RIC_OK;
}

/* --- between requests ------------------------------------------------------ */

/* After an answer that closes: stop sending, read and drop what the client
 * still sends for a while, so that neither the answer nor anything before
 * it is destroyed by a reset (a close with unread input sends one). */
static void
start_linger(ric_conn_t *c)
{
    if (ric_io_shutdown_write(&c->io) != RIC_OK) {
        ric_conn_close(c);
        return;
    }
    state_set(c, RIC_CONN_LINGER);
    c->in_len = 0;
    event_del(c->wev);
    c->read_deadline = ric_now_ms() + LINGER_TOTAL_MS;
    arm_read(c, ric_min(c->read_deadline, ric_now_ms() + LINGER_TIMEOUT_MS));
}

/* Whether closing now could reset the connection (a close with unread
 * input does): pipelined bytes, a body not read whole, or bytes waiting
 * in the socket (the client's end of stream alone is not one: a client
 * that read its answer and closed gets a plain close back). As nginx,
 * only then is the close a lingering one (records TLS took off the socket
 * ahead are unread input too). A client that asked to close
 * sends nothing after its request (RFC 9112 §9.6): the socket is not
 * asked then, a system call less on every such request. */
static int
unread_input(ric_conn_t *c)
{
    return c->in_len > c->in_used || (c->msg.body != RIC_BODY_NONE && !c->body_complete)
           || ric_io_pending(&c->io) /* records TLS read ahead */
           || (!c->msg.close_asked && ric_io_unread(&c->io));
}

/* The answer is out: get ready for the next request on the connection. */
static void
request_finish(ric_conn_t *c)
{
    c->requests++;
    /* the idle wait follows the route that answered, not the defaults; at a
     * drain it is the last moment a client gets for its next request */
    c->keepalive_timeout = c->set->draining
                               ? ric_min(c->settings->keepalive_timeout, (int64_t) DRAIN_IDLE_MS)
                               : c->settings->keepalive_timeout;
    c->promised = 0;
    if (c->in_used > 0 && c->in_used <= c->in_len) {
        in_discard(c, 0, c->in_used);
    }
    c->in_used = 0;
    ric_http_msg_init(&c->msg);
    c->body_reading = c->body_paused = c->body_discard = c->body_complete = 0;
    c->body_received = 0;
    c->continue_sent = 0;
    c->interim_pending = 0;
    c->response_bytes = 0;
    state_set(c, RIC_CONN_HEAD);
    c->settings = &c->listener->default_server->settings;
    if (c->in_len > 0) {
        c->read_deadline = ric_now_ms() + c->settings->client_header_timeout;
    }
}

void
ric_conn_request_done(ric_conn_t *c, ric_request_end_t end)
{
    c->r = NULL;
    if (c->orphan) {
        ric_conn_close(c);
        return;
    }
    event_del(c->wev);
    if (end == RIC_END_CLIENT_GONE || end == RIC_END_SHUTDOWN) {
        ric_conn_close(c);
        return;
    }
    /* a head that promised the connection stays open is kept to, also when
     * a drain began meanwhile: the client may be sending its next request
     * already (it gets an answer with Connection: close) */
    if (end != RIC_END_ANSWERED
        || !(c->promised && !c->close_after ? 1 : ric_conn_keepalive(c))) {
        if (unread_input(c)) {
            start_linger(c);
        } else {
            ric_conn_close(c); /* nothing to reset the answer with: a plain FIN */
        }
        return;
    }
    request_finish(c);
    if (c->running == 0) {
        conn_run(c);
    }
    /* else the entry on the stack goes on with the next request */
}

/* A head arrived (error_status 0) or was refused: the request takes over. */
static void
start_request(ric_conn_t *c, int error_status)
{
    state_set(c, RIC_CONN_REQUEST);
    c->in_used = error_status ? 0 : c->msg.head_len;
    /* until the answer is out nothing more is read but the body, when the
     * request asks, and an end of stream, which ends the request */
    read_without_timeout(c);
    c->r = c->set->handler->begin(c->set->handler_ctx, c, error_status);
    c->set->handler->run(c->r);
}

/* A handshake's end, counted for the server whose certificate went. */
static void
tls_count(ric_conn_t *c, int result)
{
    ric_route_shard_t *sh = ric_metrics_route(ric_tls_server_of(&c->io, c->listener)->metrics);

    if (sh != NULL) {
        ric_metric_add(&sh->tls[result], 1);
    }
}

/* One step of a TLS client's handshake; done, the connection waits for
 * its first request head as a plain one would. */
static void
handshake_step(ric_conn_t *c)
{
    struct timeval tv = ric_ms_to_tv(c->read_deadline - ric_now_ms());
    char err[256];

    switch (ric_tls_handshake(&c->io, err, sizeof(err))) {
    case RIC_OK:
        tls_count(c, RIC_TLS_OK);
        event_del(c->wev);
        state_set(c, RIC_CONN_HEAD);
        c->read_deadline = ric_now_ms() + c->settings->client_header_timeout;
        return;
    case RIC_AGAIN:
        /* waiting for one side only: a socket readable while the
         * handshake wants to write must not wake it in a loop */
        if (c->io.want == RIC_IO_WANT_WRITE) {
            event_del(c->rev);
            ric_io_arm(&c->io, c->wev, &tv);
        } else {
            event_del(c->wev);
            wait_read(c, &tv);
        }
        return;
    case RIC_DECLINED:
        /* as nginx: a 400 the client can read, in the plain HTTP it spoke,
         * closed with a linger so the rest of its request cannot reset it */
        ric_log_error(RIC_LOG_INFO, 0, "client sent plain HTTP to a TLS address (400), "
                      "client: %s", c->peer);
        tls_count(c, RIC_TLS_FAILED);
        ric_tls_drop(&c->io);
        event_del(c->wev);
        start_request(c, 400);
        return;
    default:
        ric_log_error(RIC_LOG_INFO, 0, "TLS handshake failed: %s, client: %s", err, c->peer);
        tls_count(c, RIC_TLS_FAILED);
        ric_conn_close(c);
    }
}

static void
handshake_timed_out(ric_conn_t *c)
{
    ric_log_error(RIC_LOG_INFO, 0, "client timed out during the TLS handshake, client: %s",
                  c->peer);
    tls_count(c, RIC_TLS_TIMEOUT);
    ric_conn_close(c);
}

/* Runs the connection's steps as far as they go. Calls may nest (a request
 * that ends at once moves the connection on from inside the step that
 * began it), so a close inside only marks the connection, and the
 * outermost entry frees it. */
static void
conn_run(ric_conn_t *c)
{
    struct timeval tv;
    int rc;

    c->running++;
    if (!c->closed && c->state == RIC_CONN_HANDSHAKE) {
        handshake_step(c);
    }
    while (!c->closed && c->state == RIC_CONN_HEAD) {
        if (c->in_len == 0) {
            if (c->requests > 0) {
                /* idle between requests: keepalive_timeout applies */
                tv = ric_ms_to_tv(c->keepalive_timeout);
                wait_read(c, &tv);
            } else {
                arm_read(c, c->read_deadline);
            }
            break;
        }
        rc = ric_http_parse_request(&c->msg, c->in, c->in_len);
        if (rc == RIC_AGAIN) {
            arm_read(c, c->read_deadline);
            break;
        }
        if (rc == RIC_ERROR) {
            log_client_error(c, "an invalid request", c->msg.error_status, c->msg.error_reason);
            start_request(c, c->msg.error_status);
        } else {
            start_request(c, 0);
        }
    }
    if (--c->running == 0 && c->closed) {
        conn_free(c);
    }
}

static int
conn_reclaim(ric_conn_t *c)
{
    /* idle between requests, nothing arrived and not closed by the client:
     * a plain close, which a keep-alive client must expect at any time */
    if (c->closed || c->state != RIC_CONN_HEAD || c->r != NULL || c->requests == 0
        || c->in_len > 0 || c->running > 0) {
        return 0;
    }
    if (!ric_io_alive(&c->io)) {
        ric_io_kick(&c->io, c->rev); /* the look may have taken a request off the socket */
        return 0;
    }
    ric_conn_close(c);
    return 1;
}

static void
conn_shutdown(ric_conn_t *c)
{
    ssize_t n;

    if (!c->promised) {
        c->close_after = 1; /* the answer being made says so */
    }
    if (c->state == RIC_CONN_HANDSHAKE) {
        ric_conn_close(c); /* no request yet: as an idle connection */
        return;
    }
    if (c->r != NULL) {
        /* leave room to write the answer before worker_shutdown_timeout */
        c->set->handler->drain(c->r, ric_now_ms() + c->set->drain_ms);
        return;
    }
    if (c->state != RIC_CONN_HEAD || c->in_len > 0) {
        return; /* lingering, or a head on its way: closes once answered */
    }
    /* idle, unless a request arrived that the loop has not read yet: such
     * a client already sent its request and deserves an answer */
    n = read_some(c);
    if (n > 0) {
        if (c->requests > 0) {
            c->read_deadline = ric_now_ms() + c->settings->client_header_timeout;
        }
        conn_run(c);
        return;
    }
    if (n == 0 || n == RIC_ERROR) {
        ric_conn_close(c);
        return;
    }
    /* a keep-alive client may be sending its next request right now: a
     * close would lose it. It gets a moment: a request that comes is
     * answered (with Connection: close), silence closes the connection */
    c->keepalive_timeout = ric_min(c->keepalive_timeout, (int64_t) DRAIN_IDLE_MS);
    c->read_deadline = ric_min(c->read_deadline, ric_now_ms() + DRAIN_IDLE_MS);
    conn_run(c);
}

/* --- events ---------------------------------------------------------------- */

static void
on_linger_read(ric_conn_t *c, short what)
{
    char drain[4096];
    ssize_t n;

    if (what & EV_TIMEOUT) {
        ric_conn_close(c);
        return;
    }
    n = ric_io_read(&c->io, drain, sizeof(drain));
    if (n == 0 || n == RIC_ERROR || ric_now_ms() >= c->read_deadline) {
        ric_conn_close(c);
        return;
    }
    if (n == RIC_AGAIN && c->io.want == RIC_IO_WANT_WRITE) {
        read_wait_write(c);
        return;
    }
    arm_read(c, ric_min(c->read_deadline, ric_now_ms() + LINGER_TIMEOUT_MS));
}

/* Readable while a request is under way: its body, pipelined requests, or
 * the client giving up. */
static void
on_request_read(ric_conn_t *c, short what)
{
    ssize_t n;

    if (c->body_reading && !c->body_paused) {
        if (what & EV_TIMEOUT) {
            ric_log_error(RIC_LOG_INFO, 0, "client timed out (408) while sending the request "
                          "body, client: %s", c->peer);
            c->body_reading = 0;
            c->set->handler->body_failed(c->r, 408);
            return;
        }
        n = read_some(c);
        if (n == 0 || n == RIC_ERROR) {
            ric_log_error(RIC_LOG_INFO, 0, "client closed the connection while sending the "
                          "request body, client: %s", c->peer);
            ric_conn_close(c);
            return;
        }
        if (n > 0) {
            /* client_body_timeout is the longest pause between two reads */
            c->read_deadline = ric_now_ms() + c->settings->client_body_timeout;
        }
        body_step(c);
        return;
    }
    if (what & EV_TIMEOUT) {
        event_remove_timer(c->rev); /* the client's clocks stop while the upstream works */
        return;
    }
    /* pipelined bytes wait in the buffer; an end of stream means the
     * client gave up, and the request with it */
    if (c->in_len == c->in_size && in_reserve(c) != RIC_OK) {
        event_del(c->rev);
        return;
    }
    n = read_some(c);
    if (n == 0 && c->set->handler->outlive(c->r, 1)) {
        /* a shutdown of the client's side and a close look alike here:
         * the answer still goes to it, and a close shows when a write
         * fails. Nothing more is read (the socket stays readable at its
         * end), and the connection ends with the answer */
        event_del(c->rev);
        c->close_after = 1;
        return;
    }
    if (n == 0 || n == RIC_ERROR) {
        ric_log_error(RIC_LOG_INFO, 0, "client closed the connection while waiting for the "
                      "answer, client: %s", c->peer);
        ric_conn_close(c);
    }
}

static void
on_head_read(ric_conn_t *c, short what)
{
    ssize_t n;

    if (what & EV_TIMEOUT) {
        if (c->in_len == 0 && (c->requests > 0 || c->set->draining)) {
            ric_conn_close(c); /* idle keep-alive connection, or a silent one at a drain */
            return;
        }
        ric_log_error(RIC_LOG_INFO, 0, "client timed out (408) while reading the request head, "
                      "client: %s", c->peer);
        start_request(c, 408);
        return;
    }
    if (c->in_len == 0 && c->requests > 0) {
        /* the first byte of a new request starts its header timeout */
        c->read_deadline = ric_now_ms() + c->settings->client_header_timeout;
    }
    n = read_some(c);
    if (n == 0 || n == RIC_ERROR) {
        if (c->in_len > 0) {
            ric_log_error(RIC_LOG_INFO, 0, "client closed the connection while reading the "
                          "request, client: %s", c->peer);
        }
        ric_conn_close(c);
    }
}

static void
on_read(evutil_socket_t fd, short what, void *arg)
{
    ric_conn_t *c = arg;

    (void) fd;
    c->running++;
    switch (c->state) {
    case RIC_CONN_LINGER:
        on_linger_read(c, what);
        break;
    case RIC_CONN_REQUEST:
        on_request_read(c, what);
        break;
    case RIC_CONN_HEAD:
        on_head_read(c, what);
        break;
    case RIC_CONN_HANDSHAKE:
        if (what & EV_TIMEOUT) {
            handshake_timed_out(c);
        } /* else conn_run takes the next step */
        break;
    }
    c->running--;
    conn_run(c);
}

static void
on_write(evutil_socket_t fd, short what, void *arg)
{
    ric_conn_t *c = arg;

    (void) fd;
    c->running++;
    if (c->state == RIC_CONN_HANDSHAKE && (what & EV_TIMEOUT)) {
        handshake_timed_out(c);
    } else if (c->interim_pending && !(what & EV_TIMEOUT)) {
        interim_flush(c);
    } else if (c->r != NULL) {
        if (what & EV_TIMEOUT) {
            ric_log_error(RIC_LOG_INFO, 0, "client timed out while sending the response, "
                          "client: %s", c->peer);
            ric_conn_close(c);
        } else {
            c->set->handler->writable(c->r);
        }
    } else if (c->read_wants_write && (what & EV_TIMEOUT)) {
        ric_log_error(RIC_LOG_INFO, 0, "client timed out (send_timeout) while TLS had to write "
                      "to it before reading on, client: %s", c->peer);
        ric_conn_close(c);
    }
    if (c->read_wants_write && !c->closed && !(what & EV_TIMEOUT)) {
        read_resume(c);
    }
    c->running--;
    conn_run(c);
}
