/* test_conn.c: the client connection alone, under a stand-in for the request layer: a 100 Continue the socket takes in pieces, then the body and the answer, and the connection kept for the next request. */
#include "../../core/conn.c"
#include "unit.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/un.h>
#include <unistd.h>

/* --- a socket that takes little at a time ------------------------------- */

static int writes;      /* calls to writev */
static int short_writes; /* ...that took less than they were given */

/* Every other write would block; the others take at most 7 bytes. */
static ssize_t
short_writev(ric_io_t *io, const struct iovec *iov, int iovcnt)
{
    struct iovec one;
    size_t asked = 0;
    ssize_t n;
    int i;

    for (i = 0; i < iovcnt; i++) {
        asked += iov[i].iov_len;
    }
    if (writes++ % 2 == 0) {
        io->want = RIC_IO_WANT_WRITE;
        short_writes++;
        return RIC_AGAIN;
    }
    for (i = 0; i < iovcnt && iov[i].iov_len == 0; i++) {
    }
    if (i == iovcnt) {
        return 0;
    }
    one.iov_base = iov[i].iov_base;
    one.iov_len = ric_min(iov[i].iov_len, (size_t) 7);
    n = ric_io_plain.writev(io, &one, 1);
    if (n >= 0 && (size_t) n < asked) {
        short_writes++;
    }
    return n;
}

/* --- a stand-in request layer ------------------------------------------- */

struct ric_request_s {
    ric_conn_t *c;
    size_t body_bytes;
    int body_done;
    const u_char *rest; /* of the answer's body, still to write */
    size_t rest_len;
};

static struct ric_request_s req;
static int requests_begun, requests_gone, refused_status = -1;

static void
answer_rest(ric_request_t *r)
{
    size_t taken;
    int rc = ric_conn_write(r->c, r->rest, r->rest_len, &taken);

    r->rest += taken;
    r->rest_len -= taken;
    if (rc == RIC_OK) {
        ric_conn_request_done(r->c, RIC_END_ANSWERED);
    } else if (rc == RIC_ERROR) {
        ric_conn_close(r->c);
    }
}

static void
answer(ric_request_t *r)
{
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n";

    ric_conn_head_append(r->c, head, sizeof(head) - 1);
    r->rest = (const u_char *) "ok";
    r->rest_len = 2;
    answer_rest(r);
}

static ric_request_t *
begin(void *ctx, ric_conn_t *c, int error_status)
{
    (void) ctx;
    memset(&req, 0, sizeof(req));
    req.c = c;
    requests_begun++;
    refused_status = error_status;
    return &req;
}

static void
run(ric_request_t *r)
{
    if (r->c->msg.body != RIC_BODY_NONE) {
        ric_conn_body_read(r->c);
    } else {
        answer(r);
    }
}

static int
body_data(ric_request_t *r, const u_char *data, size_t n)
{
    (void) data;
    r->body_bytes += n;
    return RIC_OK;
}

static void
body_done(ric_request_t *r)
{
    r->body_done = 1;
    answer(r);
}

static void
body_failed(ric_request_t *r, int status)
{
    (void) status;
    ric_conn_close(r->c);
}

static int
outlive(ric_request_t *r)
{
    (void) r;
    return 0;
}

static void
gone(ric_request_t *r, ric_request_end_t end)
{
    requests_gone++;
    ric_conn_request_done(r->c, end);
}

static void
drain_soon(ric_request_t *r, int64_t deadline_ms)
{
    (void) r;
    (void) deadline_ms;
}

static const ric_conn_handler_t handler = {
    begin, run, body_data, body_done, body_failed, answer_rest, outlive, gone, drain_soon
};

static void
room(void *ctx, int yes)
{
    (void) ctx;
    (void) yes;
}

static void
emptied(void *ctx)
{
    (void) ctx;
}

/* --- the client's side -------------------------------------------------- */

static char got[4096];
static size_t got_len;
static int got_eof;

/* Turns the loop until the client has read `want` (bounded). */
static int
until_read(struct event_base *base, int fd, const char *want)
{
    int i;
    ssize_t n;

    for (i = 0; i < 2000; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        n = read(fd, got + got_len, sizeof(got) - 1 - got_len);
        if (n > 0) {
            got_len += (size_t) n;
            got[got_len] = '\0';
        } else if (n == 0) {
            got_eof = 1;
        }
        if (strstr(got, want) != NULL || got_eof) {
            break;
        }
    }
    return strstr(got, want) != NULL;
}

static void
send_all(int fd, const char *s)
{
    size_t len = strlen(s);

    if (write(fd, s, len) != (ssize_t) len) {
        perror("write");
        exit(1);
    }
}

int
main(void)
{
    static const char text[] = "http { server { listen 127.0.0.1:9; location / {} } }\n";
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    static ric_io_ops_t shorty;
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    ric_conn_set_t set;
    ric_conf_t *conf;
    ric_conn_t *c;
    int sv[2];
    struct event_base *base = event_base_new();

    conf = unit_conf_load(text);
    if (base == NULL || socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        fprintf(stderr, "setup: %s\n", strerror(errno));
        return 1;
    }
    fcntl(sv[0], F_SETFL, O_NONBLOCK);
    fcntl(sv[1], F_SETFL, O_NONBLOCK);

    memset(&set, 0, sizeof(set));
    set.max = 16;
    set.room = room;
    set.emptied = emptied;
    set.base = base;
    set.handler = &handler;

    UNIT_CASE("a connection is taken into its set");
    UNIT_CHECK_INT(ric_conn_accept(&set, conf->listeners, sv[0], (struct sockaddr *) &sa,
                                   sizeof(sa)), RIC_OK);
    UNIT_CHECK_INT(set.n, 1);
    c = ric_list_first(&set.list, ric_conn_t, link);
    shorty = ric_io_plain;
    shorty.writev = short_writev;
    c->io.ops = &shorty;

    UNIT_CASE("a 100 Continue the socket takes in pieces arrives whole, the connection open");
    send_all(sv[1], "POST /up HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\n"
                    "Content-Length: 5\r\n\r\n");
    UNIT_CHECK(until_read(base, sv[1], cont));
    UNIT_CHECK(short_writes >= 3); /* it went out in four pieces, and waited between */
    UNIT_CHECK_INT(got_len, sizeof(cont) - 1);
    UNIT_CHECK_INT(got_eof, 0);
    UNIT_CHECK_INT(set.n, 1);
    UNIT_CHECK_INT(requests_begun, 1);
    UNIT_CHECK_INT(refused_status, 0);

    UNIT_CASE("...then the body reaches the request and its answer follows the 100");
    send_all(sv[1], "hello");
    UNIT_CHECK(until_read(base, sv[1], "\r\n\r\nok"));
    UNIT_CHECK_INT(req.body_bytes, 5);
    UNIT_CHECK_INT(req.body_done, 1);
    UNIT_CHECK_STR(got + sizeof(cont) - 1, ok);

    UNIT_CASE("...and the connection carries the next request");
    got_len = 0;
    got[0] = '\0';
    send_all(sv[1], "GET /next HTTP/1.1\r\nHost: t\r\n\r\n");
    UNIT_CHECK(until_read(base, sv[1], "\r\n\r\nok"));
    UNIT_CHECK_STR(got, ok);
    UNIT_CHECK_INT(requests_begun, 2);
    UNIT_CHECK_INT(got_eof, 0);
    UNIT_CHECK_INT(set.n, 1);

    UNIT_CASE("a refused head begins a request with its status");
    got_len = 0;
    got[0] = '\0';
    send_all(sv[1], "GET /x HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n");
    until_read(base, sv[1], "\r\n\r\nok");
    UNIT_CHECK_INT(requests_begun, 3);
    UNIT_CHECK_INT(refused_status, 400);

    UNIT_CASE("the client leaving closes the connection and empties the set");
    close(sv[1]);
    for (int i = 0; i < 200 && set.n > 0; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
    }
    UNIT_CHECK_INT(set.n, 0);

    ric_conf_free(conf);
    event_base_free(base);
    printf("conn: %d passed, %d failed\n", unit_passed, unit_failed);
    return unit_failed != 0;
}
