/* tls.h: TLS as the I/O layer's second kind of socket: OpenSSL on a non-blocking fd, the handshake as a step of its own. */
#ifndef RIC_TLS_H
#define RIC_TLS_H

#include "ric_core.h"
#include "io.h"

#include <openssl/ssl.h>

extern const ric_io_ops_t ric_io_tls;

/* Makes io, a connected (or connecting) plain socket, the client side of
 * a TLS session of ctx: name is verified (a host name, or an IP address
 * against the certificate's IP entries) and, when sni, sent as SNI (never
 * an IP address); session a session to resume (NULL: a full handshake);
 * *slot (NULL: none) receives every session the server issues, to resume
 * the next connection with (the slot's previous one is freed). RIC_OK,
 * or RIC_ERROR with nothing changed. The handshake is then
 * ric_tls_handshake's. */
int ric_tls_connect(ric_io_t *io, SSL_CTX *ctx, const char *name, int sni, SSL_SESSION *session,
                    void **slot);

/* A client context for an upstream: TLS 1.2 and up; verify: the server's
 * certificate must verify against ca_file (NULL: the system's store).
 * NULL with a reason in err. */
SSL_CTX *ric_tls_client_ctx(int verify, const char *ca_file, char *err, size_t errlen);

/* Frees a session kept in a slot (NULL is ok). */
void ric_tls_session_free(void *session);

/* The TLS 1.2 ciphers clients get by default: forward secret AEAD only
 * (TLS 1.3 has its own suites, all of them good). */
#define RIC_TLS_DEFAULT_CIPHERS \
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:" \
    "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"

/* Whether list (OpenSSL's cipher list syntax) names a cipher OpenSSL has. */
int ric_tls_ciphers_valid(const char *list);

/* The server side of a TLS session of ctx on io (downstream). */
int ric_tls_accept(ric_io_t *io, SSL_CTX *ctx);

/* One step of the handshake: RIC_OK when it is done, RIC_AGAIN when it
 * waits (io->want says for what), RIC_ERROR with OpenSSL's reason in err
 * (a certificate that did not verify says why), RIC_DECLINED when the
 * peer spoke plain HTTP instead (its head follows on the socket). */
int ric_tls_handshake(ric_io_t *io, char *err, size_t errlen);

/* io goes on as a plain socket, its TLS session discarded unsent (to
 * answer a peer that spoke plain HTTP in plain HTTP). */
void ric_tls_drop(ric_io_t *io);

/* Whether the session of io was resumed; its session to resume next time
 * (the caller owns it: SSL_SESSION_free), or NULL. */
int ric_tls_resumed(const ric_io_t *io);
SSL_SESSION *ric_tls_session(const ric_io_t *io);

/* The OpenSSL this build runs on ("OpenSSL 3.0.x ..."), for -v. */
const char *ric_tls_version(void);

#endif /* RIC_TLS_H */
