/* test_conn.c: the client connection alone, under a stand-in for the request layer: a 100 Continue the socket takes in pieces, then the body and the answer, and the connection kept for the next request; a client that half-closes while its request waits, answered still; a TLS client whose KeyUpdate must be answered into a full send buffer. */
#include "../../core/conn.c"
#include "unit.h"

#include <fcntl.h>
#include <signal.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
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
static int hold_next;   /* the next request waits for its answer until answered by the test */
static int half_closes; /* outlive(r, 1) calls: ends of stream while a request waited */

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
    if (hold_next) {
        hold_next = 0; /* as a keyed request waiting for its upstream */
        return;
    }
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
outlive(ric_request_t *r, int half)
{
    (void) r;
    half_closes += half;
    return half; /* a half-close is answered; a leave ends the request */
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

/* --- TLS: a read that must write first ----------------------------------- */

static int tls_reads;     /* reads of the connection's TLS socket */
static int tls_reads_max; /* ...past which a turn of the loop is broken off */
static struct event_base *tls_base;

/* Each read counted; a loop that reads on and on (libevent's turn does
 * not end while an event is active) is broken off, so that the test
 * sees the count instead of hanging. */
static ssize_t
counted_tls_read(ric_io_t *io, void *buf, size_t n)
{
    if (++tls_reads > tls_reads_max) {
        event_base_loopbreak(tls_base);
    }
    return ric_io_tls.read(io, buf, n);
}

/* A server context with a throwaway self-signed certificate. */
static SSL_CTX *
self_signed_ctx(void)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    EVP_PKEY *key = EVP_EC_gen("P-256");
    X509 *x = X509_new();

    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
    X509_gmtime_adj(X509_getm_notBefore(x), -60);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_set_pubkey(x, key);
    X509_NAME_add_entry_by_txt(X509_get_subject_name(x), "CN", MBSTRING_ASC,
                               (const u_char *) "conn.test", -1, -1, 0);
    X509_set_issuer_name(x, X509_get_subject_name(x));
    X509_sign(x, key, EVP_sha256());
    SSL_CTX_use_certificate(ctx, x);
    SSL_CTX_use_PrivateKey(ctx, key);
    X509_free(x);
    EVP_PKEY_free(key);
    return ctx;
}

/* The client's TLS reads, the event loop turning, until `want` came
 * (bounded); what came is in got. */
static int
tls_until_read(struct event_base *base, SSL *ssl, const char *want)
{
    int i, n;

    for (i = 0; i < 2000; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
        n = SSL_read(ssl, got + got_len, (int) (sizeof(got) - 1 - got_len));
        if (n > 0) {
            got_len += (size_t) n;
            got[got_len] = '\0';
        } else if (SSL_get_error(ssl, n) != SSL_ERROR_WANT_READ) {
            break;
        }
        if (strstr(got, want) != NULL) {
            return 1;
        }
    }
    return 0;
}

/* A TLS 1.3 client asks for a KeyUpdate (whose answer must be written
 * before anything more is read) while it reads nothing, so the socket
 * toward it is full, and sends more than a read takes behind it: the
 * socket stays readable while OpenSSL cannot read. The worker must wait
 * for writability then, not wake on readability in a loop; once the
 * client reads, the KeyUpdate is answered and what it sent is served. */
static void
test_tls_read_wants_write(struct event_base *base, ric_conn_set_t *set, ric_conf_t *conf)
{
    static ric_io_ops_t counted;
    static const char first[] = "GET /first HTTP/1.1\r\nHost: t\r\n\r\n";
    static const char second[] = "GET /second HTTP/1.1\r\nHost: t\r\n\r\n";
#define ok "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    SSL_CTX *sctx = self_signed_ctx(), *cctx = SSL_CTX_new(TLS_client_method());
    char filler[4096], err[256];
    SSL *cssl;
    ric_conn_t *c;
    int sv[2], i, srv = RIC_AGAIN, cli = -1, reads_before, begun = requests_begun;
    size_t filled = 0, drained = 0;
    ssize_t n;

    UNIT_CASE("TLS: a client's KeyUpdate answered into a full socket does not wake the worker in a loop");
    socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
    fcntl(sv[0], F_SETFL, O_NONBLOCK);
    fcntl(sv[1], F_SETFL, O_NONBLOCK);
    UNIT_CHECK_INT(ric_conn_accept(set, conf->listeners, sv[0], (struct sockaddr *) &sa,
                                   sizeof(sa)), RIC_OK);
    c = ric_list_first(&set->list, ric_conn_t, link);
    UNIT_CHECK(ric_tls_accept(&c->io, sctx) == RIC_OK);
    cssl = SSL_new(cctx);
    SSL_set_fd(cssl, sv[1]);
    SSL_set_connect_state(cssl);
    for (i = 0; i < 200 && (srv == RIC_AGAIN || cli != 1); i++) {
        if (cli != 1) {
            cli = SSL_do_handshake(cssl);
        }
        if (srv == RIC_AGAIN) {
            srv = ric_tls_handshake(&c->io, err, sizeof(err));
        }
    }
    UNIT_CHECK_INT(srv, RIC_OK);
    UNIT_CHECK_INT(cli, 1);
    UNIT_CHECK_STR(SSL_get_version(cssl), "TLSv1.3");
    SSL_read(cssl, got, 1); /* the session tickets taken in: nothing else comes */
    counted = ric_io_tls;
    counted.read = counted_tls_read;
    tls_base = base;
    tls_reads_max = INT_MAX;
    c->io.ops = &counted;

    /* the socket toward the client full (bytes the client will skip) */
    memset(filler, 'f', sizeof(filler));
    for (i = 0; i < 100000; i++) {
        n = write(sv[0], filler, sizeof(filler));
        if (n <= 0) {
            break;
        }
        filled += (size_t) n;
    }
    UNIT_CHECK(filled > 0);

    /* OpenSSL answers a KeyUpdate with its next write: the answer to the
     * request behind it, which the full socket stops at the KeyUpdate */
    UNIT_CHECK_INT(SSL_key_update(cssl, SSL_KEY_UPDATE_REQUESTED), 1);
    UNIT_CHECK_INT(SSL_write(cssl, first, (int) strlen(first)), (int) strlen(first));
    for (i = 0; i < 20; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
    }
    UNIT_CHECK_INT(requests_begun, begun + 1);
    /* a pipelined request now: the socket is readable, but OpenSSL must
     * write the KeyUpdate before it reads on */
    UNIT_CHECK_INT(SSL_write(cssl, second, (int) strlen(second)), (int) strlen(second));
    reads_before = tls_reads;
    tls_reads_max = tls_reads + 1000;
    for (i = 0; i < 200; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
    }
    /* 200 turns of the loop, a couple of reads, not one a turn (or more) */
    UNIT_CHECK(tls_reads - reads_before <= 3);
    tls_reads_max = INT_MAX;
    UNIT_CHECK_INT(set->n, 1);

    UNIT_CASE("...and once the client reads, the KeyUpdate goes and both requests are answered");
    for (i = 0; i < 100000 && drained < filled; i++) {
        n = read(sv[1], filler, ric_min(sizeof(filler), filled - drained));
        if (n > 0) {
            drained += (size_t) n;
        }
        event_base_loop(base, EVLOOP_NONBLOCK);
    }
    UNIT_CHECK(drained == filled);
    got_len = 0;
    got[0] = '\0';
    UNIT_CHECK(tls_until_read(base, cssl, "ok" "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"));
    UNIT_CHECK_STR(got, ok ok);
    UNIT_CHECK_INT(requests_begun, begun + 2);

    SSL_free(cssl);
    close(sv[1]);
    for (i = 0; i < 200 && set->n > 0; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
    }
    UNIT_CHECK_INT(set->n, 0);
    SSL_CTX_free(cctx);
    SSL_CTX_free(sctx);
#undef ok
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

    /* as in the workers: a close_notify to a peer gone is EPIPE, not death */
    signal(SIGPIPE, SIG_IGN);
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

    UNIT_CASE("a client that half-closes while its request waits still gets the answer");
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        fprintf(stderr, "setup: %s\n", strerror(errno));
        return 1;
    }
    fcntl(sv[0], F_SETFL, O_NONBLOCK);
    fcntl(sv[1], F_SETFL, O_NONBLOCK);
    UNIT_CHECK_INT(ric_conn_accept(&set, conf->listeners, sv[0], (struct sockaddr *) &sa,
                                   sizeof(sa)), RIC_OK);
    hold_next = 1;
    got_len = 0;
    got[0] = '\0';
    got_eof = 0;
    send_all(sv[1], "GET /wait HTTP/1.1\r\nHost: t\r\n\r\n");
    shutdown(sv[1], SHUT_WR);
    for (int i = 0; i < 200 && half_closes == 0; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
    }
    UNIT_CHECK_INT(half_closes, 1);
    for (int i = 0; i < 20; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK); /* the end of stream is not read again */
    }
    UNIT_CHECK_INT(half_closes, 1);
    UNIT_CHECK_INT(set.n, 1);
    c = ric_list_first(&set.list, ric_conn_t, link);
    UNIT_CHECK_INT(c->orphan, 0);
    answer(&req);
    UNIT_CHECK(until_read(base, sv[1], "\r\n\r\nok"));
    UNIT_CHECK_STR(got, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok");
    UNIT_CASE("...and the connection closes after it");
    for (int i = 0; i < 200 && set.n > 0; i++) {
        event_base_loop(base, EVLOOP_NONBLOCK);
    }
    UNIT_CHECK_INT(set.n, 0);
    close(sv[1]);

    test_tls_read_wants_write(base, &set, conf);

    ric_conf_free(conf);
    event_base_free(base);
    printf("conn: %d passed, %d failed\n", unit_passed, unit_failed);
    return unit_failed != 0;
}
