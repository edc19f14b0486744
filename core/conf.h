/* conf.h: the loaded configuration (one generation) and the nginx-grammar parser that builds it. */
#ifndef RIC_CONF_H
#define RIC_CONF_H

#include "ric_core.h"
#include "budget.h"
#include "log.h"
#include "pool.h"
#include "retry.h"

#include <sys/socket.h>

#define RIC_CONF_UNSET -1

/* Contexts a directive may appear in (bit mask). */
#define RIC_CONF_MAIN 0x01
#define RIC_CONF_HTTP 0x02
#define RIC_CONF_SRV 0x04
#define RIC_CONF_LOC 0x08
#define RIC_CONF_UPS 0x10
#define RIC_CONF_ANY 0x1f

/* Arity (bit mask of allowed argument counts), and block directives. */
#define RIC_CONF_NOARGS 0x001
#define RIC_CONF_TAKE1 0x002
#define RIC_CONF_TAKE2 0x004
#define RIC_CONF_TAKE3 0x008
#define RIC_CONF_TAKE4 0x010
#define RIC_CONF_TAKE12 (RIC_CONF_TAKE1 | RIC_CONF_TAKE2)
#define RIC_CONF_1MORE 0x100
#define RIC_CONF_BLOCK 0x200
#define RIC_CONF_REF 0x400 /* offset is of a pointer in ric_http_refs_t, NULL when unset */

/* Settings inherited http → server → location. Every field starts UNSET and
 * is filled from its parent, and at the http level from the directive
 * table's default, when the config has been read. Times are milliseconds,
 * sizes bytes. */
typedef struct {
    int64_t client_header_timeout;
    int64_t client_body_timeout;
    int64_t keepalive_timeout;
    int64_t send_timeout;
    int64_t client_max_body_size;
    int64_t keepalive_requests;
    int64_t client_body_buffer_size;
    int64_t proxy_connect_timeout;
    int64_t proxy_send_timeout;
    int64_t proxy_read_timeout;
    int64_t upstream_drain_max;         /* a dropped response's body read on, at most */
    int64_t upstream_drain_timeout;     /* ...for at most this long */
    int64_t retry_attempts;
    int64_t retry_backoff_initial;
    int64_t retry_backoff_max;
    int64_t retry_backoff_factor_milli; /* FACTOR * 1000 */
    int64_t retry_backoff_jitter;       /* ric_jitter_t */
    int64_t retry_backoff_adaptive;     /* 1: the wait follows the upstream's regime (adaptive=on) */
    int64_t retry_hedge;                /* RIC_HEDGE_OFF, RIC_HEDGE_AUTO, or the delay (hedge.h) */
    int64_t retry_timeout;
    int64_t per_try_timeout;
    int64_t per_try_timeout_set;        /* 1: given in the config, not the default */
    int64_t retry_after_max;
    int64_t retries;
    int64_t retry_body_max;
    int64_t idempotency_key;            /* RIC_IDEMPOTENCY_* */
    int64_t underscores_in_headers;     /* 1: forward names with '_' */
    int64_t classify_body_max;          /* response body read for a script's classify */
    int64_t idempotency_ttl;            /* how long a stored answer is replayed */
    int64_t idempotency_lock_ttl;       /* how long a claim outlives a gateway that died */
    int64_t idempotency_max_body;       /* larger answers are kept as "done" only */
    int64_t idempotency_required;       /* 1: 400 for an unsafe method without a key */
    int64_t idempotency_store_failure;  /* RIC_IDEM_FAIL_CLOSED | _OPEN (idem.h) */
    int64_t idempotency_sync;           /* 1: a claim is on disk before the request goes on */
    int64_t idempotency_store_recover;  /* RIC_IDEM_RECOVER_* (idem_store.h): a damaged LMDB file */
    int64_t proxy_ssl_verify;           /* 1: an https upstream's certificate must verify */
    int64_t proxy_ssl_server_name;      /* 1: send SNI */
    int64_t ssl_protocols;              /* RIC_SSL_TLSV1_2 | RIC_SSL_TLSV1_3, for listen ... ssl */
    int64_t ssl_session_cache;          /* sessions kept per worker; 0: no cache */
    int64_t ssl_session_timeout;        /* how long a session (or ticket) resumes */
    int64_t ssl_session_tickets;        /* 1: stateless tickets (resume across workers) */
    int64_t ssl_handshake_timeout;      /* a client's whole TLS handshake */
    int64_t script_timeout;             /* http only: one hook call's wall-clock bound */
    int64_t script_memory_max;          /* http only: the scripts' Lua state's memory */
} ric_http_settings_t;

#define RIC_SSL_TLSV1_2 0x1
#define RIC_SSL_TLSV1_3 0x2

/* A file named by a directive, and where: its errors are reported there. */
typedef struct {
    char *path; /* resolved */
    const char *file;
    int line;
} ric_conf_file_t;




/* What a "$name" in a proxy_set_header value stands for. */
typedef enum {
    RIC_VAR_LITERAL = 0,
    RIC_VAR_HOST,        /* the request's Host, without port */
    RIC_VAR_HTTP_HOST,   /* the request's Host as sent */
    RIC_VAR_REMOTE_ADDR, /* the client's IP address */
    RIC_VAR_REMOTE_PORT,
    RIC_VAR_SCHEME,      /* "http" */
    RIC_VAR_PROXY_HOST,  /* the proxy_pass host[:port] or upstream name */
    RIC_VAR_REQUEST_URI, /* the request target as sent */
    RIC_VAR_REQUEST_METHOD,
    RIC_VAR_PROXY_ADD_XFF, /* X-Forwarded-For of the request plus the client */
    RIC_VAR_HTTP          /* $http_NAME: a request header */
} ric_var_t;

typedef struct ric_template_part_s ric_template_part_t;
struct ric_template_part_s {
    ric_var_t var;
    char *text; /* the literal, or the lowercase field name of $http_NAME */
    size_t len;
    ric_template_part_t *next;
};

/* One proxy_set_header. An empty value removes the header. */
typedef struct ric_header_set_s ric_header_set_t;
struct ric_header_set_s {
    char *name;
    ric_template_part_t *value; /* NULL: the empty value */
    ric_header_set_t *next;
};

/* An access log destination; several routes may share one. */
typedef struct ric_access_log_s ric_access_log_t;
struct ric_access_log_s {
    char *path; /* resolved file, "stdout", "stderr" or "off" */
    int fd;     /* opened by the master; -1 when off or not yet open */
    int64_t buffer;   /* buffer=SIZE: lines gather up to this many bytes; 0: one write a line */
    int64_t flush_ms; /* flush=TIME: a buffered line waits at most this long */
    const char *file; /* where it was first named, for errors */
    int line;
    u_char *buf;      /* this worker's buffer (made on its first line) */
    size_t len;
    int64_t first_ms; /* when the oldest buffered line was written */
    int pipe;         /* not a regular file: a write is whole only up to PIPE_BUF */
    ric_access_log_t *next;
};

/* Inherited settings that are not numbers: NULL means unset. proxy_set_header
 * is inherited only by a level that sets none itself (as in nginx). */
typedef struct {
    ric_header_set_t *headers;
    ric_access_log_t *access_log;
    char *body_temp_path;
    struct ric_retry_on_s *retry_on;
    char *client_deadline_header;
    char *idempotency_key_header;
    char *retry_attempt_header; /* "" when off */
    ric_budget_conf_t *retry_budget; /* its upstream's, unless the upstream block sets one */
    struct ric_script_s *script;     /* the route script (script.h); NULL: none */
    struct ric_idem_store_conf_s *idempotency_store; /* idem_store.h; kind OFF: off */
    char *idempotency_scope;    /* the record key's client part: a field name, "$remote_addr",
                                 * or "" (off) */
    struct ric_retry_on_s *idempotency_release; /* statuses that release the key
                                                 * (idempotency_store_status and the built-in ones) */
    char *proxy_ssl_trusted_certificate; /* CA file for https upstreams; NULL: the system's */
    char *proxy_ssl_name;                /* the name sent and verified; NULL: the upstream's host */
    ric_conf_file_t *ssl_certificate;     /* PEM chain, leaf first, for listen ... ssl */
    ric_conf_file_t *ssl_certificate_key; /* PEM key of ssl_certificate */
    char *ssl_ciphers;                   /* the TLS 1.2 cipher list (OpenSSL's syntax) */
} ric_http_refs_t;

struct ric_location_conf_s {
    char *path;
    int exact; /* "location = /path" */
    const char *file;
    int line;
    ric_http_settings_t settings;
    ric_http_refs_t refs;
    ric_upstream_conf_t *upstream; /* proxy_pass target; NULL: none */
    char *proxy_pass;              /* as written (without the scheme), for errors */
    int proxy_tls;                 /* proxy_pass https:// */
    int warned_key_contract;       /* this process said once that a script key lacks the contract */
    int warned_body_max;           /* ...that res:body() is nil for want of classify_body_max */
    const char *proxy_pass_file;
    int proxy_pass_line;
    char *label;                   /* its metrics' route: "SERVER PATH" (metrics.c) */
    char *idem_route;              /* what tells its idempotency records from another route's
                                    * of the same server_name and path (idem_route.h); NULL:
                                    * no other has them */
    ric_route_metrics_t *metrics;  /* in the shared zone; NULL: not counted */
    ric_location_conf_t *next;
};

/* One "listen" of one server. */
struct ric_listen_s {
    struct sockaddr_storage addr;
    socklen_t addrlen;
    char *text; /* "127.0.0.1:8080", for logs */
    const char *file; /* where the listen directive is */
    int line;
    int default_server;
    int ssl;    /* listen ... ssl */
    int fd;     /* set by the master when bound; shared by every server on it */
    ric_server_conf_t *server;
    ric_listen_t *next;      /* the server's next listen */
    ric_listen_t *addr_next; /* the next listen on the same address */
};

struct ric_server_conf_s {
    char **names; /* server_name values */
    int nnames;
    ric_listen_t *listens;
    ric_location_conf_t *locations;
    ric_http_settings_t settings;
    ric_http_refs_t refs;
    void *ssl_ctx; /* SSL_CTX of this config generation, when on an ssl address (tls_server.h) */
    char *label;   /* its name in metrics: its first server_name, else its first listen */
    ric_route_metrics_t *metrics; /* its requests no location took, its TLS handshakes */
    const char *file;
    int line;
    ric_server_conf_t *next;
};

typedef struct ric_upstream_server_s ric_upstream_server_t;

/* One address of an upstream server: a name that resolves to several
 * addresses gives one entry each. */
struct ric_upstream_server_s {
    char *host;
    char *port;
    char *text; /* as written */
    int weight;
    int max_fails;
    int64_t fail_timeout;
    struct sockaddr_storage addr; /* resolved when the config is loaded */
    socklen_t addrlen;
    char *addr_text;              /* "127.0.0.1:9000", for logs */
    struct ric_peer_health_s *health; /* in the shared zone (upstream.h) */
    const char *file;
    int line;
    ric_upstream_server_t *next;
};

struct ric_upstream_conf_s {
    char *name;
    char *host_header; /* $proxy_host: the name, or host:port of an implicit upstream */
    int implicit;      /* made by "proxy_pass http://host:port" */
    int index;         /* position among the http block's upstreams */
    int nservers;
    ric_upstream_server_t *servers;
    int64_t keepalive;         /* idle connections kept per worker */
    int64_t keepalive_timeout; /* ms */
    ric_budget_conf_t *retry_budget;   /* set in the upstream block; NULL: not */
    const ric_budget_conf_t *budget;   /* its budget's rule, whoever set it */
    ric_budget_state_t *budget_state;  /* in the shared zone */
    struct ric_hedge_state_s *hedge_state; /* retry_hedge auto's p95, in the shared zone */
    int tls;                   /* reached with https:// (tls_file: where that was said) */
    const char *tls_file;
    int tls_line;
    const ric_location_conf_t *tls_owner; /* the location whose proxy_ssl_* it uses */
    void *ssl_ctx;             /* SSL_CTX of this config generation (tls.h) */
    char *ssl_name;            /* sent as SNI (unless proxy_ssl_server_name off) and verified */
    ric_upstream_metrics_t *metrics; /* in the shared zone; NULL: not counted */
    const char *file;
    int line;
    ric_upstream_conf_t *next;
};

/* An admin_allow entry: an address and how many of its leading bits count. */
typedef struct {
    int family; /* AF_INET, AF_INET6 */
    u_char addr[16];
    int bits;
} ric_cidr_t;

struct ric_http_conf_s {
    ric_server_conf_t *admin;   /* admin_listen's server: no locations, no access log; NULL: none */
    ric_cidr_t *admin_allow;    /* who may use it (NULL: anyone who reaches its loopback address) */
    int nadmin_allow;
    const char *admin_allow_file;
    int admin_allow_line;
    ric_http_settings_t settings;
    ric_http_refs_t refs;
    ric_server_conf_t *servers;
    ric_upstream_conf_t *upstreams;
    int nupstreams;
    ric_access_log_t *access_logs; /* every distinct destination */
    struct ric_idem_store_conf_s *idem_stores; /* every distinct idempotency store */
    struct ric_shared_dict_conf_s *shared_dicts; /* lua_shared_dict (shared_dict.h) */
};

/* An address every worker accepts on: the union of the servers' listens. */
typedef struct ric_listener_s ric_listener_t;
struct ric_listener_s {
    struct sockaddr_storage addr;
    socklen_t addrlen;
    char *text;
    int fd;
    ric_server_conf_t *default_server;
    ric_listen_t *listens; /* every server's listen on this address */
    int ssl;               /* clients speak TLS: the handshake starts with the default server's
                            * SSL_CTX, and SNI picks the server whose certificate goes */
    int admin;             /* admin_listen: /metrics, /healthz, /readyz, /status (admin.c) */
    ric_listener_t *next;
};

struct ric_conf_s {
    ric_pool_t *pool; /* owns everything below */
    char *prefix;     /* ends with '/' */
    char *file;       /* the main config file, resolved */

    int64_t worker_processes;
    int64_t worker_shutdown_timeout;
    int64_t worker_watchdog; /* ms a worker's loop may go without a turn; 0: off */
    int64_t worker_connections;
    int64_t daemon;
    char *pid_path;  /* resolved; NULL: no pid file */
    char *error_log; /* resolved path or "stderr" */
    int64_t error_log_level;

    ric_http_conf_t *http; /* NULL without an http block */
    ric_listener_t *listeners;
};

/* Reads and checks the config at path (resolved against prefix when
 * relative), or the embedded default when path is NULL and prefix has no
 * conf/ricochet.conf. Returns the new configuration, owned by the caller
 * (ric_conf_free), or NULL with "FILE:LINE: reason" (or "FILE: reason") in
 * err. Nothing outside the returned object is changed. */
ric_conf_t *ric_conf_load(const char *prefix, const char *path, char *err, size_t errlen);

/* Releases a configuration (listening fds are not closed: they belong to the
 * master). NULL is ok. */
void ric_conf_free(ric_conf_t *conf);

/* Value parsers shared by the directive handlers and tests. Each returns
 * RIC_OK and sets *out, or RIC_ERROR. */
int ric_conf_parse_size(const char *s, int64_t *out);    /* 10, 8k, 1m, 2g */
int ric_conf_parse_time(const char *s, int64_t *out_ms); /* 500ms, 30s, 1m30s, 2h, 1d */
int ric_conf_parse_number(const char *s, int64_t *out);

/* Resolves path against prefix unless absolute; allocated from pool. */
char *ric_conf_full_path(ric_pool_t *pool, const char *prefix, const char *path);

/* The text of the embedded default configuration (conf/ricochet.conf). */
extern const char ric_default_conf[];

#endif /* RIC_CONF_H */
