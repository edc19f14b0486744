/* test_tls.c: the TLS kind of socket over a socketpair: handshakes step by step, reads and writes through the I/O layer, verification, a name that does not match, session resumption, liveness. A throwaway CA and certificate are made in memory. */
#include "../../core/tls.c"
#include "unit.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

static EVP_PKEY *ca_key, *leaf_key;
static X509 *ca_cert, *leaf_cert;

static X509 *
make_cert(const char *cn, EVP_PKEY *key, X509 *issuer, EVP_PKEY *issuer_key, int ca)
{
    X509 *x = X509_new();
    X509V3_CTX v3;
    X509_EXTENSION *ext;
    static long serial = 1;

    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), serial++);
    X509_gmtime_adj(X509_getm_notBefore(x), -60);
    X509_gmtime_adj(X509_getm_notAfter(x), 3600);
    X509_set_pubkey(x, key);
    X509_NAME_add_entry_by_txt(X509_get_subject_name(x), "CN", MBSTRING_ASC,
                               (const u_char *) cn, -1, -1, 0);
    X509_set_issuer_name(x, X509_get_subject_name(issuer ? issuer : x));
    X509V3_set_ctx(&v3, issuer ? issuer : x, x, NULL, NULL, 0);
    if (ca) {
        ext = X509V3_EXT_conf_nid(NULL, &v3, NID_basic_constraints, "critical,CA:TRUE");
    } else {
        ext = X509V3_EXT_conf_nid(NULL, &v3, NID_subject_alt_name, "DNS:api.test");
    }
    X509_add_ext(x, ext, -1);
    X509_EXTENSION_free(ext);
    X509_sign(x, issuer_key ? issuer_key : key, EVP_sha256());
    return x;
}

static SSL_CTX *
server_ctx(void)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());

    SSL_CTX_use_certificate(ctx, leaf_cert);
    SSL_CTX_use_PrivateKey(ctx, leaf_key);
    return ctx;
}

static SSL_CTX *
client_ctx(int trust)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());

    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    if (trust) {
        X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx), ca_cert);
    }
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT);
    return ctx;
}

static void
nonblocking_pair(int fds[2])
{
    socketpair(AF_UNIX, SOCK_STREAM, 0, fds);
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    fcntl(fds[1], F_SETFL, O_NONBLOCK);
}

/* Steps both handshakes until neither waits (bounded). Returns the
 * client's result; err has its reason. */
static int
handshake(ric_io_t *c, ric_io_t *s, char *err, size_t errlen)
{
    char serr[256];
    int rc = RIC_AGAIN, src = RIC_AGAIN, i;

    for (i = 0; i < 200 && (rc == RIC_AGAIN || src == RIC_AGAIN); i++) {
        if (rc == RIC_AGAIN) {
            rc = ric_tls_handshake(c, err, errlen);
        }
        if (src == RIC_AGAIN) {
            src = ric_tls_handshake(s, serr, sizeof(serr));
        }
        if (rc == RIC_ERROR) {
            break;
        }
    }
    return rc;
}

/* Moves n bytes from a to b through the layer, both sides stepping. */
static size_t
pump(ric_io_t *a, ric_io_t *b, const u_char *data, size_t n, u_char *out)
{
    size_t sent = 0, got = 0;
    ssize_t r;
    int i;

    for (i = 0; i < 100000 && got < n; i++) {
        if (sent < n) {
            r = ric_io_write(a, data + sent, n - sent);
            if (r > 0) {
                sent += (size_t) r;
            }
        }
        r = ric_io_read(b, out + got, n - got);
        if (r > 0) {
            got += (size_t) r;
        }
    }
    return got;
}

static void
test_exchange(void)
{
    SSL_CTX *sctx = server_ctx(), *cctx = client_ctx(1);
    ric_io_t c, s, c2, s2;
    int fds[2];
    char err[256] = "";
    struct iovec iov[2];
    static u_char big[200000], back[200000];
    u_char buf[64];
    ssize_t r;
    size_t i;
    SSL_SESSION *session;
    int alive;

    UNIT_CASE("a verified handshake, step by step, TLS 1.3");
    nonblocking_pair(fds);
    ric_io_init_plain(&c, fds[0]);
    ric_io_init_plain(&s, fds[1]);
    UNIT_CHECK(ric_tls_connect(&c, cctx, "api.test", 1, NULL, NULL) == RIC_OK);
    UNIT_CHECK(ric_tls_accept(&s, sctx) == RIC_OK);
    UNIT_CHECK_INT(handshake(&c, &s, err, sizeof(err)), RIC_OK);
    UNIT_CHECK_STR(SSL_get_version(c.tls), "TLSv1.3");
    UNIT_CHECK(!ric_tls_resumed(&c));

    UNIT_CASE("writev joins pieces; reads through the layer");
    iov[0].iov_base = (void *) "hello ";
    iov[0].iov_len = 6;
    iov[1].iov_base = (void *) "world";
    iov[1].iov_len = 5;
    UNIT_CHECK_INT(ric_io_writev(&c, iov, 2), 11);
    memset(buf, 0, sizeof(buf));
    for (i = 0, r = RIC_AGAIN; i < 100 && r == RIC_AGAIN; i++) {
        r = ric_io_read(&s, buf, sizeof(buf));
    }
    UNIT_CHECK_INT(r, 11);
    UNIT_CHECK(memcmp(buf, "hello world", 11) == 0);
    UNIT_CHECK_INT(ric_io_read(&s, buf, sizeof(buf)), RIC_AGAIN);
    UNIT_CHECK_INT(s.want, RIC_IO_WANT_READ);

    UNIT_CASE("200 kB both ways, blocking and resuming");
    for (i = 0; i < sizeof(big); i++) {
        big[i] = (u_char) (i * 7 + 3);
    }
    UNIT_CHECK_INT(pump(&c, &s, big, sizeof(big), back), sizeof(big));
    UNIT_CHECK(memcmp(big, back, sizeof(big)) == 0);
    memset(back, 0, sizeof(back));
    UNIT_CHECK_INT(pump(&s, &c, big, sizeof(big), back), sizeof(big));
    UNIT_CHECK(memcmp(big, back, sizeof(big)) == 0);

    UNIT_CASE("an idle connection is alive (session tickets taken in); a closed one is not");
    UNIT_CHECK(ric_io_alive(&c) == 1);
    session = ric_tls_session(&c);
    UNIT_CHECK(session != NULL);
    UNIT_CHECK(ric_io_shutdown_write(&s) == RIC_OK);
    alive = ric_io_alive(&c);
    UNIT_CHECK(alive == 0);
    ric_io_close(&c);
    ric_io_close(&s);

    UNIT_CASE("the session is resumed on a new connection");
    nonblocking_pair(fds);
    ric_io_init_plain(&c2, fds[0]);
    ric_io_init_plain(&s2, fds[1]);
    ric_tls_connect(&c2, cctx, "api.test", 1, session, NULL);
    ric_tls_accept(&s2, sctx);
    UNIT_CHECK_INT(handshake(&c2, &s2, err, sizeof(err)), RIC_OK);
    UNIT_CHECK(ric_tls_resumed(&c2));
    SSL_SESSION_free(session);

    UNIT_CASE("after the peer's end is read, a write to it is an error, never 0; nothing is pending");
    /* OpenSSL calls a failed write after a received end "the end" too:
     * a writer that took that 0 as "nothing written yet" tried forever */
    for (i = 0, r = RIC_AGAIN; i < 100 && r == RIC_AGAIN; i++) {
        r = ric_io_read(&c2, buf, sizeof(buf)); /* the session tickets, taken in */
    }
    UNIT_CHECK_INT(r, RIC_AGAIN);
    UNIT_CHECK_INT(ric_io_write(&c2, "POST", 4), 4);
    ric_io_close(&c2); /* its close_notify, then the socket closed */
    for (i = 0, r = RIC_AGAIN; i < 100 && r == RIC_AGAIN; i++) {
        r = ric_io_read(&s2, buf, sizeof(buf));
    }
    UNIT_CHECK_INT(r, 4);
    UNIT_CHECK_INT(ric_io_read(&s2, buf, sizeof(buf)), 0);
    UNIT_CHECK(!ric_io_pending(&s2));
    errno = 0;
    UNIT_CHECK_INT(ric_io_write(&s2, "HTTP/1.1 201", 12), RIC_ERROR);
    UNIT_CHECK(errno == EPIPE || errno == ECONNRESET);
    ric_io_close(&s2);
    SSL_CTX_free(sctx);
    SSL_CTX_free(cctx);
}

static void
test_refusals(void)
{
    SSL_CTX *sctx = server_ctx(), *trusting = client_ctx(1), *stranger = client_ctx(0);
    ric_io_t c, s;
    int fds[2];
    char err[256] = "";

    UNIT_CASE("a certificate for another name is refused, and says so");
    nonblocking_pair(fds);
    ric_io_init_plain(&c, fds[0]);
    ric_io_init_plain(&s, fds[1]);
    ric_tls_connect(&c, trusting, "other.test", 1, NULL, NULL);
    ric_tls_accept(&s, sctx);
    UNIT_CHECK_INT(handshake(&c, &s, err, sizeof(err)), RIC_ERROR);
    UNIT_CHECK(strstr(err, "hostname mismatch") != NULL);
    ric_io_close(&c);
    ric_io_close(&s);

    UNIT_CASE("a certificate from a CA not trusted is refused, and says so");
    nonblocking_pair(fds);
    ric_io_init_plain(&c, fds[0]);
    ric_io_init_plain(&s, fds[1]);
    ric_tls_connect(&c, stranger, "api.test", 1, NULL, NULL);
    ric_tls_accept(&s, sctx);
    err[0] = '\0';
    UNIT_CHECK_INT(handshake(&c, &s, err, sizeof(err)), RIC_ERROR);
    UNIT_CHECK(strstr(err, "unable to get local issuer certificate") != NULL);
    ric_io_close(&c);
    ric_io_close(&s);

    UNIT_CASE("a peer that goes away during the handshake");
    nonblocking_pair(fds);
    ric_io_init_plain(&c, fds[0]);
    ric_tls_connect(&c, trusting, "api.test", 1, NULL, NULL);
    UNIT_CHECK_INT(ric_tls_handshake(&c, err, sizeof(err)), RIC_AGAIN);
    close(fds[1]);
    UNIT_CHECK_INT(ric_tls_handshake(&c, err, sizeof(err)), RIC_ERROR);
    ric_io_close(&c);
    SSL_CTX_free(sctx);
    SSL_CTX_free(trusting);
    SSL_CTX_free(stranger);
}

int
main(void)
{
    /* as in the workers: a close_notify to a peer gone is EPIPE, not death */
    signal(SIGPIPE, SIG_IGN);
    ca_key = EVP_EC_gen("P-256");
    leaf_key = EVP_EC_gen("P-256");
    ca_cert = make_cert("ricochet test CA", ca_key, NULL, NULL, 1);
    leaf_cert = make_cert("api.test", leaf_key, ca_cert, ca_key, 0);
    UNIT_CASE("a version to show");
    UNIT_CHECK(strstr(ric_tls_version(), "OpenSSL") != NULL);
    test_exchange();
    test_refusals();
    X509_free(ca_cert);
    X509_free(leaf_cert);
    EVP_PKEY_free(ca_key);
    EVP_PKEY_free(leaf_key);
    return UNIT_DONE("tls");
}
