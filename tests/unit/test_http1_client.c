/* test_http1_client.c: the upstream HTTP/1 client on a real loopback connection: a read that must write first (as OpenSSL's, when an upstream's KeyUpdate must be answered into a full send buffer) waits for writability, not in a loop, and the response is read once the socket takes bytes; a dropped response drains off its connection alone, within its bounds, back to the pool or closed. */
#include "../../core/http1_client.c"
#include "unit.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <unistd.h>

/* --- a socket whose reads must write first while `must_write` is set ---- */

static int must_write;
static int reads, reads_max;
static struct event_base *base;

/* As tls_read after OpenSSL began a handshake message it could not send:
 * nothing is read until the socket takes it. */
static ssize_t
write_first_read(ric_io_t *io, void *buf, size_t n)
{
    if (++reads > reads_max) {
        event_base_loopbreak(base); /* a turn that never ends: counted, not hung */
    }
    if (must_write) {
        io->want = RIC_IO_WANT_WRITE;
        io->dry = 1;
        return RIC_AGAIN;
    }
    return ric_io_plain.read(io, buf, n);
}

/* --- the user ------------------------------------------------------------- */

static int sent, heads, failures;

static void
on_failed(ric_http1_t *h, unsigned class, int err, const char *what)
{
    (void) h;
    (void) class;
    (void) err;
    fprintf(stderr, "failed: %s\n", what);
    failures++;
}

static void
on_head(ric_http1_t *h)
{
    (void) h;
    heads++;
}

static void
on_sent(ric_http1_t *h)
{
    (void) h;
    sent++;
}

static void
on_nothing(ric_http1_t *h)
{
    (void) h;
}

static void
on_body_failed(ric_http1_t *h, int err, const char *what)
{
    (void) h;
    (void) err;
    (void) what;
    failures++;
}

static void
on_drained(ric_http1_t *h, int whole)
{
    (void) h;
    (void) whole;
}

static const ric_http1_handler_t handler = {
    on_failed, on_head, on_sent, on_nothing, on_nothing, on_body_failed, on_drained, on_drained
};

static void
turns(int n)
{
    int i;

    for (i = 0; i < n; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
    }
}

/* A request on a new connection (accepted into *up) and the answer's head
 * given back: the client has it (heads counted one more). */
static void
exchange_head(ric_http1_t *h, ric_upstream_t *u, int lfd, const char *head, int *up)
{
    static const char req[] = "GET /d HTTP/1.1\r\nHost: t\r\n\r\n";
    char junk[512];
    int i, was = heads, sent_before = sent;

    ric_http1_init(h, &handler, NULL, u, RIC_HTTP_GET);
    h->connect_timeout = h->send_timeout = h->read_timeout = 60000;
    h->drain_max = 64 * 1024;
    h->drain_timeout = 60000;
    UNIT_CHECK_INT(ric_http1_start(h, &u->peers[0], 0, (const u_char *) req, sizeof(req) - 1,
                                   NULL, NULL), RIC_OK);
    *up = -1;
    for (i = 0; i < 200 && (*up < 0 || sent == sent_before); i++) {
        if (*up < 0) {
            *up = accept(lfd, NULL, NULL);
        }
        turns(1);
    }
    UNIT_CHECK(*up >= 0 && read(*up, junk, sizeof(junk)) == (ssize_t) sizeof(req) - 1);
    UNIT_CHECK(write(*up, head, strlen(head)) == (ssize_t) strlen(head));
    for (i = 0; i < 2000 && heads == was; i++) {
        turns(1);
        usleep(100);
    }
    UNIT_CHECK_INT(heads, was + 1);
}

/* Whether the upstream's side of a connection sees it closed, within a
 * bounded wait (the spec's bound: far above any drain's). */
static int
closed_by_client(int up)
{
    char c;
    int i;

    fcntl(up, F_SETFL, O_NONBLOCK);
    for (i = 0; i < 20000; i++) {
        if (read(up, &c, 1) == 0) {
            return 1;
        }
        turns(1);
        usleep(100);
    }
    return 0;
}

int
main(void)
{
    static const char req[] = "GET / HTTP/1.1\r\nHost: t\r\n\r\n";
    static const char resp[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    static ric_io_ops_t ops;
    struct sockaddr_in sa = { .sin_family = AF_INET };
    socklen_t salen = sizeof(sa);
    char text[256], junk[4096];
    ric_conf_t *conf;
    ric_upstream_t *ups;
    ric_http1_t h;
    size_t filled = 0, drained = 0;
    ssize_t n;
    int lfd, up, i, before;

    base = event_base_new();
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    lfd = socket(AF_INET, SOCK_STREAM, 0);
    if (base == NULL || lfd < 0 || bind(lfd, (struct sockaddr *) &sa, sizeof(sa)) != 0
        || listen(lfd, 4) != 0 || getsockname(lfd, (struct sockaddr *) &sa, &salen) != 0) {
        perror("setup");
        return 1;
    }
    snprintf(text, sizeof(text), "http { upstream u { server 127.0.0.1:%d; } "
             "server { listen 127.0.0.1:9; location / { proxy_pass http://u; } } }\n",
             ntohs(sa.sin_port));
    conf = unit_conf_load(text);
    ups = ric_upstream_init_all(conf, base);

    UNIT_CASE("a request goes up and the client waits for the answer");
    ric_http1_init(&h, &handler, NULL, &ups[0], RIC_HTTP_GET);
    h.connect_timeout = h.send_timeout = h.read_timeout = 60000;
    UNIT_CHECK_INT(ric_http1_start(&h, &ups[0].peers[0], 0, (const u_char *) req,
                                   sizeof(req) - 1, NULL, NULL), RIC_OK);
    up = -1;
    for (i = 0; i < 200 && (up < 0 || sent == 0); i++) {
        if (up < 0) {
            up = accept(lfd, NULL, NULL);
        }
        turns(1);
    }
    UNIT_CHECK(up >= 0);
    UNIT_CHECK_INT(sent, 1);
    UNIT_CHECK_INT(h.state, RIC_HTTP1_HEAD);
    n = read(up, junk, sizeof(junk));
    UNIT_CHECK_INT(n, (ssize_t) sizeof(req) - 1);

    UNIT_CASE("a read that must write first, the socket toward the upstream full: no loop");
    ops = ric_io_plain;
    ops.read = write_first_read;
    h.uc->io.ops = &ops;
    reads_max = 1000;
    memset(junk, 'j', sizeof(junk));
    for (i = 0; i < 100000; i++) {
        n = write(h.uc->io.fd, junk, sizeof(junk));
        if (n <= 0) {
            break;
        }
        filled += (size_t) n;
    }
    UNIT_CHECK(filled > 0);
    must_write = 1;
    UNIT_CHECK(write(up, resp, sizeof(resp) - 1) == (ssize_t) sizeof(resp) - 1);
    before = reads;
    turns(200);
    /* the answer is in the socket, readable all along: a couple of reads, not one a turn or more */
    UNIT_CHECK(reads - before <= 3);
    UNIT_CHECK_INT(heads, 0);
    UNIT_CHECK_INT(failures, 0);

    UNIT_CASE("...once the socket takes bytes, the read goes on and finds the answer");
    must_write = 0;
    fcntl(up, F_SETFL, O_NONBLOCK);
    for (i = 0; i < 100000 && drained < filled; i++) {
        n = read(up, junk, ric_min(sizeof(junk), filled - drained));
        if (n > 0) {
            drained += (size_t) n;
        }
        turns(1);
    }
    for (i = 0; i < 200 && heads == 0; i++) {
        turns(1);
    }
    UNIT_CHECK_INT(heads, 1);
    UNIT_CHECK_INT(h.resp.status, 200);
    UNIT_CHECK_INT(failures, 0);

    ric_http1_free(&h);
    close(up);

    UNIT_CASE("a dropped response nobody keeps drains alone; its connection goes back to the pool");
    {
        static char body[40000];
        size_t off = 0;

        exchange_head(&h, &ups[0], lfd, "HTTP/1.1 503 No\r\nContent-Length: 40000\r\n\r\n", &up);
        UNIT_CHECK_INT(ric_http1_drop(&h), -1); /* larger than the buffer: not kept */
        UNIT_CHECK(h.uc == NULL);
        ric_http1_free(&h);
        UNIT_CHECK(ups[0].draining.head != NULL);
        UNIT_CHECK_INT(ups[0].nidle, 0);
        memset(body, 'b', sizeof(body));
        fcntl(up, F_SETFL, O_NONBLOCK);
        for (i = 0; i < 20000 && ups[0].nidle == 0; i++) {
            if (off < sizeof(body) && (n = write(up, body + off, sizeof(body) - off)) > 0) {
                off += (size_t) n;
            }
            turns(1);
        }
        UNIT_CHECK_INT(ups[0].nidle, 1);
        UNIT_CHECK(ups[0].draining.head == NULL);
        close(up); /* the pooled connection sees it and goes */
        for (i = 0; i < 200 && ups[0].nidle > 0; i++) {
            turns(1);
            usleep(100);
        }
        UNIT_CHECK_INT(ups[0].nidle, 0);
    }

    UNIT_CASE("...a body larger than upstream_drain_max: the connection is closed at once");
    exchange_head(&h, &ups[0], lfd, "HTTP/1.1 503 No\r\nContent-Length: 5000\r\n\r\n", &up);
    h.drain_max = 1024;
    UNIT_CHECK_INT(ric_http1_drop(&h), -1);
    UNIT_CHECK(h.uc == NULL && ups[0].draining.head == NULL);
    ric_http1_free(&h);
    UNIT_CHECK(closed_by_client(up));
    close(up);

    UNIT_CASE("...a body that does not come within upstream_drain_timeout: closed");
    exchange_head(&h, &ups[0], lfd, "HTTP/1.1 503 No\r\nContent-Length: 10\r\n\r\n", &up);
    h.drain_timeout = 1;
    UNIT_CHECK_INT(ric_http1_drop(&h), 0); /* small: read on into the buffer, to keep it */
    UNIT_CHECK_INT(h.state, RIC_HTTP1_DRAIN);
    ric_http1_free(&h); /* nobody keeps it now: it drains alone */
    UNIT_CHECK(ups[0].draining.head != NULL);
    UNIT_CHECK(closed_by_client(up));
    UNIT_CHECK(ups[0].draining.head == NULL);
    UNIT_CHECK_INT(ups[0].nidle, 0);
    close(up);

    UNIT_CASE("...a chunked one drains to its last chunk, then back to the pool");
    exchange_head(&h, &ups[0], lfd, "HTTP/1.1 503 No\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel", &up);
    UNIT_CHECK_INT(ric_http1_drop(&h), 0);
    ric_http1_free(&h);
    UNIT_CHECK(write(up, "lo\r\n0\r\n\r\n", 9) == 9);
    for (i = 0; i < 2000 && ups[0].nidle == 0; i++) {
        turns(1);
        usleep(100);
    }
    UNIT_CHECK_INT(ups[0].nidle, 1);
    UNIT_CHECK(ups[0].draining.head == NULL);
    close(up); /* the pooled connection sees it and goes */
    for (i = 0; i < 200 && ups[0].nidle > 0; i++) {
        turns(1);
        usleep(100);
    }
    UNIT_CHECK_INT(ups[0].nidle, 0);

    UNIT_CASE("...and one still draining when the upstream goes is closed with it");
    exchange_head(&h, &ups[0], lfd, "HTTP/1.1 503 No\r\nContent-Length: 10\r\n\r\n", &up);
    UNIT_CHECK_INT(ric_http1_drop(&h), 0);
    ric_http1_free(&h);
    UNIT_CHECK(ups[0].draining.head != NULL);

    ric_upstream_free_all(ups, conf->http->nupstreams);
    UNIT_CHECK(closed_by_client(up));
    close(up);
    close(lfd);
    ric_conf_free(conf);
    event_base_free(base);
    return UNIT_DONE("http1_client");
}
