/* conf.h: the loaded configuration (one generation) and the nginx-grammar parser that builds it. */
#ifndef RIC_CONF_H
#define RIC_CONF_H

#include "ric_core.h"
#include "log.h"
#include "pool.h"

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
} ric_http_settings_t;

struct ric_location_conf_s {
    char *path;
    int exact; /* "location = /path" */
    const char *file;
    int line;
    ric_http_settings_t settings;
    ric_location_conf_t *next;
};

/* One "listen" of one server. */
struct ric_listen_s {
    struct sockaddr_storage addr;
    socklen_t addrlen;
    char *text; /* "127.0.0.1:8080", for logs */
    int default_server;
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
    const char *file;
    int line;
    ric_server_conf_t *next;
};

typedef struct ric_upstream_server_s ric_upstream_server_t;

struct ric_upstream_server_s {
    char *host;
    char *port;
    char *text; /* as written */
    int weight;
    int max_fails;
    int64_t fail_timeout;
    ric_upstream_server_t *next;
};

struct ric_upstream_conf_s {
    char *name;
    ric_upstream_server_t *servers;
    int64_t keepalive;         /* idle connections kept per worker */
    int64_t keepalive_timeout; /* ms */
    const char *file;
    int line;
    ric_upstream_conf_t *next;
};

struct ric_http_conf_s {
    ric_http_settings_t settings;
    ric_server_conf_t *servers;
    ric_upstream_conf_t *upstreams;
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
    ric_listener_t *next;
};

struct ric_conf_s {
    ric_pool_t *pool; /* owns everything below */
    char *prefix;     /* ends with '/' */
    char *file;       /* the main config file, resolved */

    int64_t worker_processes;
    int64_t worker_shutdown_timeout;
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
