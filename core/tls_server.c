/* tls_server.c: TLS for clients (listen ... ssl): one SSL_CTX per server on an ssl address, made with the config; SNI picks the server whose certificate goes. */
#include "tls_server.h"
#include "route.h"
#include "tls.h"

#include <errno.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <sys/stat.h>
#include <stdio.h>
#include <unistd.h>

/* ALPN: what this gateway speaks (RFC 7301 wire format). */
static const unsigned char alpn_ours[] = "\x08http/1.1\x08http/1.0";

/* A client that offers ALPN must offer HTTP/1: one asking only for h2
 * gets the no_application_protocol alert rather than HTTP/1.1 it did not
 * ask for. A client that offers no ALPN is served HTTP/1.1. */
static int
select_alpn(SSL *ssl, const unsigned char **out, unsigned char *outlen, const unsigned char *in,
            unsigned int inlen, void *arg)
{
    unsigned char *sel;

    (void) ssl;
    (void) arg;
    if (SSL_select_next_proto(&sel, outlen, alpn_ours, sizeof(alpn_ours) - 1, in, inlen)
        != OPENSSL_NPN_NEGOTIATED) {
        return SSL_TLSEXT_ERR_ALERT_FATAL;
    }
    *out = sel;
    return SSL_TLSEXT_ERR_OK;
}

size_t
ric_tls_sni_name(const u_char *p, size_t len, const u_char **name)
{
    size_t list, n;

    if (len < 2) {
        return 0;
    }
    list = (size_t) p[0] << 8 | p[1];
    p += 2;
    if (list != len - 2) {
        return 0;
    }
    while (list >= 3) {
        n = (size_t) p[1] << 8 | p[2];
        if (n > list - 3) {
            return 0;
        }
        if (p[0] == TLSEXT_NAMETYPE_host_name) {
            *name = p + 3;
            return n;
        }
        p += 3 + n;
        list -= 3 + n;
    }
    return 0;
}

/* SNI, read from the ClientHello before anything else is decided: the
 * server named, by the rule Host follows (exact names, then the longest
 * wildcard, then the address's default server), gives its certificate and
 * its session id context, so a session resumes only on the server that
 * issued it. The protocol, ciphers and session settings stay the
 * listener's (ric_tls_server_setup makes the servers on an address agree
 * on them). */
static int
on_client_hello(SSL *ssl, int *alert, void *arg)
{
    const ric_listener_t *ls = SSL_get_app_data(ssl);
    ric_server_conf_t *s;
    ric_str_t host = { NULL, 0 };
    const unsigned char *ext;
    size_t len;

    (void) alert;
    (void) arg;
    if (ls == NULL) {
        return SSL_CLIENT_HELLO_SUCCESS;
    }
    if (SSL_client_hello_get0_ext(ssl, TLSEXT_TYPE_server_name, &ext, &len)) {
        host.len = ric_tls_sni_name(ext, len, &host.data);
    }
    s = host.len > 0 ? ric_route_server(ls, host) : ls->default_server;
    if (s->ssl_ctx != NULL && s->ssl_ctx != SSL_get_SSL_CTX(ssl)) {
        SSL_set_SSL_CTX(ssl, s->ssl_ctx);
    }
    return SSL_CLIENT_HELLO_SUCCESS;
}

ric_server_conf_t *
ric_tls_server_of(const ric_io_t *io, const ric_listener_t *ls)
{
    SSL_CTX *ctx = io->tls != NULL ? SSL_get_SSL_CTX(io->tls) : NULL;
    const ric_listen_t *l;

    for (l = ls->listens; ctx != NULL && l; l = l->addr_next) {
        if (l->server->ssl_ctx == ctx) {
            return l->server;
        }
    }
    return ls->default_server;
}

/* The name was acted on in on_client_hello; this only acknowledges it. */
static int
on_servername(SSL *ssl, int *alert, void *arg)
{
    (void) ssl;
    (void) alert;
    (void) arg;
    return SSL_TLSEXT_ERR_OK;
}

/* Keys are read unencrypted: never a prompt on the terminal. */
static int
no_password(char *buf, int size, int rwflag, void *userdata)
{
    (void) buf;
    (void) size;
    (void) rwflag;
    (void) userdata;
    return 0;
}

/* OpenSSL's reason for the last failure, and the queue cleared. */
static const char *
openssl_reason(unsigned long *code)
{
    unsigned long e = ERR_peek_error(); /* the first: the cause, not "PEM lib" */
    const char *r = e ? ERR_reason_error_string(e) : NULL;

    if (code != NULL) {
        *code = e;
    }
    ERR_clear_error();
    return r != NULL ? r : "unknown reason";
}

static int
readable(const ric_conf_file_t *f, const char *what, char *err, size_t errlen)
{
    struct stat st;

    if (access(f->path, R_OK) != 0 || stat(f->path, &st) != 0) {
        snprintf(err, errlen, "%s:%d: cannot read %s \"%s\": %s", f->file, f->line, what, f->path,
                 strerror(errno));
        return 0;
    }
    if (!S_ISREG(st.st_mode) || st.st_size == 0) {
        snprintf(err, errlen, "%s:%d: %s \"%s\" is %s", f->file, f->line, what, f->path,
                 S_ISDIR(st.st_mode) ? "a directory" : !S_ISREG(st.st_mode) ? "not a file"
                                                                            : "empty");
        return 0;
    }
    return 1;
}

/* Whether a PEM file holds an encrypted key (either form of it). */
static int
encrypted_key(const char *path)
{
    char line[256];
    FILE *f = fopen(path, "r");
    int found = 0;

    while (f != NULL && !found && fgets(line, sizeof(line), f) != NULL) {
        found = strstr(line, "ENCRYPTED") != NULL;
    }
    if (f != NULL) {
        fclose(f);
    }
    return found;
}

/* Which certificate of the chain file (1 = the first) key belongs to; 0:
 * none. For a chain written in the wrong order. */
static int
key_position(const char *chain, const char *key_path)
{
    BIO *kb = BIO_new_file(key_path, "r"), *cb = BIO_new_file(chain, "r");
    EVP_PKEY *key = kb ? PEM_read_bio_PrivateKey(kb, NULL, no_password, NULL) : NULL;
    X509 *x;
    int i, at = 0;

    for (i = 1; key != NULL && cb != NULL && at == 0
                && (x = PEM_read_bio_X509(cb, NULL, no_password, NULL)) != NULL;
         i++) {
        if (X509_check_private_key(x, key) == 1) {
            at = i;
        }
        X509_free(x);
    }
    EVP_PKEY_free(key);
    BIO_free(kb);
    BIO_free(cb);
    ERR_clear_error();
    return at;
}

/* The certificate chain and its key into ctx. */
static int
load_pair(SSL_CTX *ctx, const ric_conf_file_t *cert, const ric_conf_file_t *key, char *err,
          size_t errlen)
{
    unsigned long code;
    const char *why;

    if (!readable(cert, "ssl_certificate", err, errlen)) {
        return RIC_ERROR;
    }
    ERR_clear_error();
    if (SSL_CTX_use_certificate_chain_file(ctx, cert->path) != 1) {
        snprintf(err, errlen, "%s:%d: ssl_certificate \"%s\" is not a PEM certificate chain "
                 "(\"-----BEGIN CERTIFICATE-----\", the leaf first): %s", cert->file, cert->line,
                 cert->path, openssl_reason(NULL));
        return RIC_ERROR;
    }
    if (!readable(key, "ssl_certificate_key", err, errlen)) {
        return RIC_ERROR;
    }
    if (SSL_CTX_use_PrivateKey_file(ctx, key->path, SSL_FILETYPE_PEM) != 1
        || SSL_CTX_check_private_key(ctx) != 1) {
        why = openssl_reason(&code);
        if (encrypted_key(key->path)) {
            snprintf(err, errlen, "%s:%d: ssl_certificate_key \"%s\" is encrypted: the gateway "
                     "reads keys unencrypted and never asks for a passphrase (write a plain "
                     "copy with `openssl pkey -in KEY -out PLAIN.key`, readable by this user "
                     "only)", key->file, key->line, key->path);
        } else if (ERR_GET_REASON(code) == X509_R_KEY_VALUES_MISMATCH
                   || ERR_GET_REASON(code) == SSL_R_PRIVATE_KEY_MISMATCH
                   || ERR_GET_REASON(code) == SSL_R_NO_CERTIFICATE_ASSIGNED) {
            /* (a key of another type lands in another slot, which has no
             * certificate: a mismatch too) */
            int at = key_position(cert->path, key->path);
            if (at > 1) {
                snprintf(err, errlen, "%s:%d: ssl_certificate \"%s\" must start with the "
                         "certificate of ssl_certificate_key (the leaf), then its "
                         "intermediates; here the leaf is certificate %d", cert->file,
                         cert->line, cert->path, at);
            } else {
                snprintf(err, errlen, "%s:%d: ssl_certificate_key \"%s\" is not the key of "
                         "ssl_certificate \"%s\" (%s:%d)", key->file, key->line, key->path,
                         cert->path, cert->file, cert->line);
            }
        } else {
            snprintf(err, errlen, "%s:%d: ssl_certificate_key \"%s\" is not a PEM private key "
                     "(\"-----BEGIN PRIVATE KEY-----\"): %s", key->file, key->line, key->path,
                     why);
        }
        return RIC_ERROR;
    }
    return RIC_OK;
}

/* The digest of the context's certificate (0: none could be made). */
static int
cert_digest(SSL_CTX *ctx, unsigned char md[32])
{
    X509 *x = SSL_CTX_get0_certificate(ctx);
    unsigned int n = 0;

    return x != NULL && X509_digest(x, EVP_sha256(), md, &n) == 1 && n == 32;
}

/* Sessions of one server resume on that server only: its name (an unnamed
 * server: where it is written) and its certificate, so that a reload that
 * keeps both keeps its sessions. */
static void
set_session_context(SSL_CTX *ctx, const ric_server_conf_t *s)
{
    unsigned char md[EVP_MAX_MD_SIZE], cert[32];
    unsigned int n = 0;
    EVP_MD_CTX *m = EVP_MD_CTX_new();
    char where[64];

    snprintf(where, sizeof(where), ":%d:", s->line);
    if (m != NULL && EVP_DigestInit_ex(m, EVP_sha256(), NULL) == 1) {
        if (s->nnames > 0) {
            EVP_DigestUpdate(m, s->names[0], strlen(s->names[0]));
        } else {
            EVP_DigestUpdate(m, s->file, strlen(s->file));
            EVP_DigestUpdate(m, where, strlen(where));
        }
        if (cert_digest(ctx, cert)) {
            EVP_DigestUpdate(m, cert, sizeof(cert));
        }
        EVP_DigestFinal_ex(m, md, &n);
    }
    EVP_MD_CTX_free(m);
    SSL_CTX_set_session_id_context(ctx, md, ric_min(n, (unsigned) SSL_MAX_SID_CTX_LENGTH));
}

/* The session ticket keys, by certificate, for the master's life: a context
 * made again for the same certificate (a reload) gets the keys the last one
 * had, so the tickets clients hold resume after it; a new certificate gets
 * new keys. Every worker forked after shares them. */
typedef struct ticket_keys_s ticket_keys_t;
struct ticket_keys_s {
    unsigned char cert[32];
    unsigned char keys[80]; /* OpenSSL's: name, HMAC and AES keys */
    ticket_keys_t *next;
};

static ticket_keys_t *ticket_keys;

static void
keep_ticket_keys(SSL_CTX *ctx)
{
    unsigned char cert[32];
    ticket_keys_t *t;

    if (!cert_digest(ctx, cert)) {
        return;
    }
    for (t = ticket_keys; t; t = t->next) {
        if (memcmp(t->cert, cert, sizeof(cert)) == 0) {
            SSL_CTX_set_tlsext_ticket_keys(ctx, t->keys, sizeof(t->keys));
            return;
        }
    }
    t = ric_xcalloc(1, sizeof(*t));
    memcpy(t->cert, cert, sizeof(cert));
    if (SSL_CTX_get_tlsext_ticket_keys(ctx, t->keys, sizeof(t->keys)) != 1) {
        free(t);
        return;
    }
    t->next = ticket_keys;
    ticket_keys = t;
}

static void
free_ctx(void *ctx)
{
    SSL_CTX_free(ctx);
}

static SSL_CTX *
server_ctx(const ric_server_conf_t *s, const ric_listen_t *l, char *err, size_t errlen)
{
    const ric_http_settings_t *st = &s->settings;
    const ric_http_refs_t *refs = &s->refs;
    SSL_CTX *ctx;

    if (refs->ssl_certificate == NULL || refs->ssl_certificate_key == NULL) {
        snprintf(err, errlen, "%s:%d: listen %s ssl: the server has no %s (set it in the server "
                 "or in http)", l->file, l->line, l->text,
                 refs->ssl_certificate == NULL ? "ssl_certificate" : "ssl_certificate_key");
        return NULL;
    }
    ctx = SSL_CTX_new(TLS_server_method());
    if (ctx == NULL) {
        snprintf(err, errlen, "%s:%d: cannot make a TLS context: %s", l->file, l->line,
                 openssl_reason(NULL));
        return NULL;
    }
    SSL_CTX_set_min_proto_version(ctx, (st->ssl_protocols & RIC_SSL_TLSV1_2) ? TLS1_2_VERSION
                                                                             : TLS1_3_VERSION);
    SSL_CTX_set_max_proto_version(ctx, (st->ssl_protocols & RIC_SSL_TLSV1_3) ? TLS1_3_VERSION
                                                                             : TLS1_2_VERSION);
    /* a client cannot make the server renegotiate (a CPU sink, and a read
     * that would want a write) */
    SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION
                                 | (st->ssl_session_tickets == 1 ? 0 : SSL_OP_NO_TICKET));
    SSL_CTX_set_cipher_list(ctx, refs->ssl_ciphers); /* checked when it was read */
    SSL_CTX_set_default_passwd_cb(ctx, no_password);
    if (load_pair(ctx, refs->ssl_certificate, refs->ssl_certificate_key, err, errlen) != RIC_OK) {
        SSL_CTX_free(ctx);
        return NULL;
    }
    if (st->ssl_session_cache > 0) {
        SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_SERVER);
        SSL_CTX_sess_set_cache_size(ctx, (long) st->ssl_session_cache);
    } else {
        SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
    }
    SSL_CTX_set_timeout(ctx, (long) ric_max(st->ssl_session_timeout / 1000, (int64_t) 1));
    /* one TLS 1.3 ticket a connection (OpenSSL sends two): a client
     * resumes with one, and each costs the handshake an encryption; none
     * when neither the ticket keys nor the cache could resume it */
    SSL_CTX_set_num_tickets(ctx, st->ssl_session_tickets == 1 || st->ssl_session_cache > 0 ? 1 : 0);
    set_session_context(ctx, s);
    keep_ticket_keys(ctx);
    SSL_CTX_set_alpn_select_cb(ctx, select_alpn, NULL);
    SSL_CTX_set_client_hello_cb(ctx, on_client_hello, NULL);
    SSL_CTX_set_tlsext_servername_callback(ctx, on_servername);
    return ctx;
}

/* What the handshake settles before SNI names a server is the listener's:
 * every server on the address must agree on it. */
static int
agrees(const ric_server_conf_t *a, const ric_server_conf_t *b)
{
    const ric_http_settings_t *x = &a->settings, *y = &b->settings;

    return x->ssl_protocols == y->ssl_protocols && x->ssl_session_cache == y->ssl_session_cache
           && x->ssl_session_timeout == y->ssl_session_timeout
           && x->ssl_session_tickets == y->ssl_session_tickets
           && x->ssl_handshake_timeout == y->ssl_handshake_timeout
           && strcmp(a->refs.ssl_ciphers, b->refs.ssl_ciphers) == 0;
}

int
ric_tls_server_setup(ric_conf_t *conf, ric_pool_t *pool, char *err, size_t errlen)
{
    ric_listener_t *ls;
    ric_listen_t *l;
    ric_server_conf_t *s, *d;

    for (ls = conf->listeners; ls; ls = ls->next) {
        if (!ls->ssl) {
            continue;
        }
        d = ls->default_server;
        for (l = ls->listens; l; l = l->addr_next) {
            s = l->server;
            if (s != d && !agrees(s, d)) {
                snprintf(err, errlen, "%s:%d: ssl_protocols, ssl_ciphers, ssl_session_* and "
                         "ssl_handshake_timeout of the servers on %s differ from those of its "
                         "default server (%s:%d): they apply before SNI names a server (set "
                         "them once, in http)", l->file, l->line, l->text, d->file, d->line);
                return RIC_ERROR;
            }
            if (s->ssl_ctx != NULL) {
                continue; /* on another ssl address too */
            }
            s->ssl_ctx = server_ctx(s, l, err, errlen);
            if (s->ssl_ctx == NULL) {
                return RIC_ERROR;
            }
            ric_pool_cleanup_add(pool, free_ctx, s->ssl_ctx);
        }
    }
    return RIC_OK;
}

int
ric_tls_server_accept(ric_io_t *io, const ric_listener_t *ls)
{
    if (ric_tls_accept(io, ls->default_server->ssl_ctx) != RIC_OK) {
        return RIC_ERROR;
    }
    SSL_set_app_data(io->tls, (void *) ls);
    return RIC_OK;
}
