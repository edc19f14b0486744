/* tls.c: TLS as the I/O layer's second kind of socket: OpenSSL on a non-blocking fd; a read may want a write and a write a read, and io->want says which. */
#include "tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <stdio.h>

#define COALESCE_MAX (16 * 1024) /* one full TLS record of joined pieces */

/* What an SSL call's failure means for the layer: RIC_AGAIN with what to
 * wait for, 0 for the end of the stream (a read's only), RIC_ERROR with
 * errno. */
static ssize_t
failure(ric_io_t *io, int rc, int reading)
{
    int e = SSL_get_error(io->tls, rc);

    /* nothing read ahead is kicked until a read succeeds: after a read
     * wanted more, what OpenSSL holds is a record in part; while it must
     * write first (a TLS 1.3 KeyUpdate's answer into a full send buffer),
     * each kick would fail the same way; after an end or an error, no
     * read will ever return it. Each case is a loop that never gives the
     * event loop back */
    io->dry = 1;
    switch (e) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
        io->want = e == SSL_ERROR_WANT_READ ? RIC_IO_WANT_READ : RIC_IO_WANT_WRITE;
        return RIC_AGAIN;
    case SSL_ERROR_ZERO_RETURN:
        if (reading) {
            return 0; /* close_notify, or (SSL_OP_IGNORE_UNEXPECTED_EOF) a bare close */
        }
        /* a write after the peer's end was read: OpenSSL says "the end"
         * whatever the socket said, but a write of 0 bytes would be
         * tried again for ever */
        errno = EPIPE;
        return RIC_ERROR;
    case SSL_ERROR_SYSCALL:
        if (errno == 0) {
            errno = ECONNRESET;
        }
        return RIC_ERROR;
    default:
        errno = EPROTO;
        return RIC_ERROR;
    }
}

/* SSL_get_error needs an empty error queue before the call; on the hot
 * path it nearly always is, and a look is cheaper than clearing all of
 * its slots. */
static void
clear_errors(void)
{
    if (ERR_peek_error() != 0) {
        ERR_clear_error();
    }
}

static ssize_t
tls_read(ric_io_t *io, void *buf, size_t n)
{
    size_t got;
    int rc;

    clear_errors();
    errno = 0;
    rc = SSL_read_ex(io->tls, buf, n, &got);
    if (rc == 1) {
        io->dry = 0;
        return (ssize_t) got;
    }
    return failure(io, rc, 1);
}

static ssize_t
tls_write(ric_io_t *io, const void *buf, size_t n)
{
    size_t put;
    int rc;

    clear_errors();
    errno = 0;
    rc = SSL_write_ex(io->tls, buf, n, &put);
    return rc == 1 ? (ssize_t) put : failure(io, rc, 0);
}

/* TLS has no writev: the first record is filled from the pieces in turn
 * (a head and a short body go as one; a head and a long body as one full
 * record, then the rest of the body), so that no record or write is spent
 * on a head alone. A single piece is written as it is. A retry after
 * RIC_AGAIN comes with the same pieces, joined into the same bytes
 * (SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER). */
static ssize_t
tls_writev(ric_io_t *io, const struct iovec *iov, int iovcnt)
{
    u_char joined[COALESCE_MAX];
    size_t at = 0, take;
    int i;

    if (iovcnt == 1) {
        return iov[0].iov_len == 0 ? 0 : tls_write(io, iov[0].iov_base, iov[0].iov_len);
    }
    for (i = 0; i < iovcnt && at < sizeof(joined); i++) {
        take = ric_min(iov[i].iov_len, sizeof(joined) - at);
        memcpy(joined + at, iov[i].iov_base, take);
        at += take;
    }
    return at == 0 ? 0 : tls_write(io, joined, at);
}

static int
tls_shutdown_write(ric_io_t *io)
{
    /* close_notify is TLS's end of stream; a peer that never answers it
     * is not waited for */
    ERR_clear_error();
    SSL_shutdown(io->tls);
    return ric_io_plain.shutdown_write(io); /* the socket under it, as a plain one */
}

/* An idle TLS connection may have received records that are not data (a
 * TLS 1.3 session ticket): they are taken in, and only data, an alert or
 * an end make it not alive. */
static int
tls_peek_alive(ric_io_t *io)
{
    char byte;
    size_t got;
    int rc;

    if (SSL_pending(io->tls) > 0) {
        return 0;
    }
    ERR_clear_error();
    rc = SSL_peek_ex(io->tls, &byte, 1, &got);
    return rc != 1 && SSL_get_error(io->tls, rc) == SSL_ERROR_WANT_READ;
}

/* Decrypted bytes, or records taken off the socket ahead (a client's
 * connection reads ahead: ric_tls_handshake) and not yet read. Not once
 * a read wanted more: then what OpenSSL holds is a record in part, the
 * socket announces the rest, and counting it would wake the reader in a
 * loop with nothing to read. */
static int
tls_pending(ric_io_t *io)
{
    return SSL_pending(io->tls) > 0 || (!io->dry && SSL_has_pending(io->tls));
}

static void
tls_close(ric_io_t *io)
{
    /* close_notify, once and without waiting (a peer reading to the end
     * of the stream learns it was not cut off); the shutdown also keeps
     * the session good: OpenSSL drops a session whose connection ended
     * without one, and no later connection could resume it */
    if (!(SSL_get_shutdown(io->tls) & SSL_SENT_SHUTDOWN)) {
        ERR_clear_error();
        SSL_shutdown(io->tls);
    }
    ERR_clear_error();
    SSL_free(io->tls);
    io->tls = NULL;
    ric_io_plain.close(io);
}

const ric_io_ops_t ric_io_tls = {
    "tls", tls_read, tls_writev, NULL, tls_shutdown_write, tls_peek_alive, tls_pending, tls_close
};

static int
start(ric_io_t *io, SSL_CTX *ctx, SSL **out)
{
    SSL *ssl = SSL_new(ctx);

    if (ssl == NULL || SSL_set_fd(ssl, io->fd) != 1) {
        SSL_free(ssl);
        return RIC_ERROR;
    }
    SSL_set_mode(ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER
                          | SSL_MODE_RELEASE_BUFFERS);
    SSL_set_options(ssl, SSL_OP_IGNORE_UNEXPECTED_EOF);
    io->dry = 0;
    *out = ssl;
    return RIC_OK;
}

static int slot_index = -1; /* ex_data of an SSL: where its new sessions go */

/* A session the server issued (a TLS 1.3 ticket comes after the
 * handshake): it replaces the one in the connection's slot. */
static int
on_new_session(SSL *ssl, SSL_SESSION *session)
{
    void **slot = SSL_get_ex_data(ssl, slot_index);

    if (slot == NULL) {
        return 0;
    }
    ric_tls_session_free(*slot);
    *slot = session;
    return 1; /* ours now */
}

void
ric_tls_session_free(void *session)
{
    if (session != NULL) {
        SSL_SESSION_free(session);
    }
}

SSL_CTX *
ric_tls_client_ctx(int verify, const char *ca_file, char *err, size_t errlen)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    unsigned long e;

    if (ctx == NULL) {
        snprintf(err, errlen, "cannot make a TLS context");
        return NULL;
    }
    if (slot_index < 0) {
        slot_index = SSL_get_ex_new_index(0, NULL, NULL, NULL, NULL);
    }
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    /* sessions are kept per server by the caller, not in the context */
    SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
    SSL_CTX_sess_set_new_cb(ctx, on_new_session);
    if (verify) {
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        ERR_clear_error();
        if ((ca_file != NULL ? SSL_CTX_load_verify_locations(ctx, ca_file, NULL)
                             : SSL_CTX_set_default_verify_paths(ctx)) != 1) {
            e = ERR_get_error();
            snprintf(err, errlen, "cannot load %s: %s", ca_file ? ca_file : "the system's CA store",
                     e ? ERR_reason_error_string(e) : "unknown reason");
            ERR_clear_error();
            SSL_CTX_free(ctx);
            return NULL;
        }
    }
    return ctx;
}

int
ric_tls_connect(ric_io_t *io, SSL_CTX *ctx, const char *name, int sni, SSL_SESSION *session,
                void **slot)
{
    SSL *ssl;
    int ip;
    u_char addr[16];

    if (start(io, ctx, &ssl) != RIC_OK) {
        return RIC_ERROR;
    }
    if (name != NULL && name[0] != '\0') {
        ip = inet_pton(AF_INET, name, addr) == 1 || inet_pton(AF_INET6, name, addr) == 1;
        /* the name the certificate must carry (when ctx verifies), and
         * SNI, which never names an address (RFC 6066) */
        if ((ip ? X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name)
                : SSL_set1_host(ssl, name)) != 1
            || (sni && !ip && SSL_set_tlsext_host_name(ssl, name) != 1)) {
            SSL_free(ssl);
            return RIC_ERROR;
        }
    }
    if (slot != NULL && slot_index >= 0) {
        SSL_set_ex_data(ssl, slot_index, slot);
    }
    if (session != NULL) {
        SSL_set_session(ssl, session);
    }
    SSL_set_connect_state(ssl);
    io->tls = ssl;
    io->ops = &ric_io_tls;
    return RIC_OK;
}

int
ric_tls_ciphers_valid(const char *list)
{
    SSL_CTX *ctx = SSL_CTX_new(TLS_server_method());
    int ok = ctx != NULL && SSL_CTX_set_cipher_list(ctx, list) == 1;

    SSL_CTX_free(ctx);
    ERR_clear_error();
    return ok;
}

int
ric_tls_accept(ric_io_t *io, SSL_CTX *ctx)
{
    SSL *ssl;

    if (start(io, ctx, &ssl) != RIC_OK) {
        return RIC_ERROR;
    }
    SSL_set_accept_state(ssl);
    io->tls = ssl;
    io->ops = &ric_io_tls;
    return RIC_OK;
}

int
ric_tls_handshake(ric_io_t *io, char *err, size_t errlen)
{
    unsigned long e;
    long verify;
    int rc;
    ssize_t r;

    ERR_clear_error();
    errno = 0;
    rc = SSL_do_handshake(io->tls);
    if (rc == 1) {
        if (SSL_is_server(io->tls)) {
            /* from now on a read takes what the socket has, not a record
             * header and then its body: one system call a request, not
             * two (the handshake read record by record, so that plain
             * HTTP is told apart before anything more is taken) */
            SSL_set_read_ahead(io->tls, 1);
        }
        io->dry = 0;
        return RIC_OK;
    }
    r = failure(io, rc, 1);
    if (r == RIC_AGAIN) {
        return RIC_AGAIN;
    }
    verify = SSL_get_verify_result(io->tls);
    e = ERR_peek_error();
    if (ERR_GET_LIB(e) == ERR_LIB_SSL
        && (ERR_GET_REASON(e) == SSL_R_HTTP_REQUEST
            || ERR_GET_REASON(e) == SSL_R_HTTPS_PROXY_REQUEST)) {
        ERR_clear_error();
        snprintf(err, errlen, "a plain HTTP request");
        return RIC_DECLINED;
    }
    if (verify != X509_V_OK) {
        snprintf(err, errlen, "the certificate did not verify: %s",
                 X509_verify_cert_error_string(verify));
    } else if (e != 0) {
        ERR_error_string_n(e, err, errlen);
    } else {
        snprintf(err, errlen, "%s", r == 0 || errno == ECONNRESET
                                        ? "the peer closed the connection during the handshake"
                                        : strerror(errno));
    }
    ERR_clear_error();
    return RIC_ERROR;
}

void
ric_tls_drop(ric_io_t *io)
{
    SSL_free(io->tls);
    io->tls = NULL;
    io->ops = &ric_io_plain;
}

int
ric_tls_resumed(const ric_io_t *io)
{
    return io->tls != NULL && SSL_session_reused(io->tls);
}

SSL_SESSION *
ric_tls_session(const ric_io_t *io)
{
    SSL_SESSION *s = io->tls ? SSL_get1_session(io->tls) : NULL;

    if (s != NULL && !SSL_SESSION_is_resumable(s)) {
        SSL_SESSION_free(s);
        return NULL;
    }
    return s;
}

const char *
ric_tls_version(void)
{
    return OpenSSL_version(OPENSSL_VERSION);
}
