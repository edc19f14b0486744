/* tls_server.h: TLS for clients (listen ... ssl): each server's context, made with the config, and SNI picking the server. */
#ifndef RIC_TLS_SERVER_H
#define RIC_TLS_SERVER_H

#include "ric_core.h"
#include "conf.h"
#include "io.h"
#include "pool.h"

/* Makes the SSL_CTX of every server on an ssl address (its certificate and
 * key, ssl_protocols, ssl_ciphers, ALPN http/1.1, the session cache and
 * tickets), owned by pool: one set per configuration generation, so that
 * a reload (not built yet) brings new certificates and keys while
 * connections of the old generation finish on theirs. Ticket keys are made here, in the master,
 * so every worker forked from it resumes the others' tickets. RIC_OK, or
 * RIC_ERROR with "FILE:LINE: reason" in err (a missing certificate or
 * key, one that does not load, a key that does not match). */
int ric_tls_server_setup(ric_conf_t *conf, ric_pool_t *pool, char *err, size_t errlen);

/* Makes io, an accepted socket on the ssl listener ls, the server side of a
 * TLS session; the handshake is then ric_tls_handshake's. RIC_OK or
 * RIC_ERROR. */
int ric_tls_server_accept(ric_io_t *io, const ric_listener_t *ls);

/* The host name in a ClientHello's server_name extension (its bytes,
 * p[0, len), as the client sent them: RFC 6066 3, a list of (type, name)
 * where type 0 is a host name): its length, with *name pointing into p; 0
 * when there is none or the extension is malformed. */
size_t ric_tls_sni_name(const u_char *p, size_t len, const u_char **name);

/* The server whose certificate a client's handshake on ls got (SNI's
 * pick), else the address's default server. */
ric_server_conf_t *ric_tls_server_of(const ric_io_t *io, const ric_listener_t *ls);

#endif /* RIC_TLS_SERVER_H */
