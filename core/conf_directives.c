/* conf_directives.c: the directive table, its handlers, defaults and inheritance. */
#include "conf_parse.h"
#include "tls.h"
#include "tls_server.h"
#include "idem.h"
#include "idem_store.h"
#include "idem_route.h"
#include "script.h"
#include "shared_dict.h"
#include "backoff.h"
#include "retry.h"
#include "hedge.h"
#include "watchdog.h"
#include "route.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <glob.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/stat.h>
#include <strings.h>
#include <unistd.h>

#define SETTINGS(field) offsetof(ric_http_settings_t, field)
#define MAIN(field) offsetof(ric_conf_t, field)
#define UPS(field) offsetof(ric_upstream_conf_t, field)
#define REFS(field) offsetof(ric_http_refs_t, field)
#define SETTINGS_CTX (RIC_CONF_HTTP | RIC_CONF_SRV | RIC_CONF_LOC)

static int64_t *
field_at(void *conf, const ric_conf_cmd_t *cmd)
{
    return (int64_t *) ((char *) conf + cmd->offset);
}

static const char *
check_unset(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    if (*field_at(conf, cmd) != RIC_CONF_UNSET) {
        return ric_conf_reason(cf, "\"%s\" directive is duplicate", cmd->name);
    }
    return NULL;
}

static const char *
bad_value(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, const char *what)
{
    return ric_conf_reason(cf, "invalid value \"%s\" in \"%s\" directive, %s", cf->args[1],
                           cmd->name, what);
}

/* The shape of set_msec, set_size and set_num: a duplicate check, a value
 * parser, and the hint shown when the value is bad. */
static const char *
set_int64(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf,
          int (*parse)(const char *, int64_t *), const char *hint)
{
    int64_t v;
    const char *dup = check_unset(cf, cmd, conf);

    if (dup) {
        return dup;
    }
    if (parse(cf->args[1], &v) != RIC_OK) {
        return bad_value(cf, cmd, hint);
    }
    *field_at(conf, cmd) = v;
    return NULL;
}

static const char *
set_msec(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    return set_int64(cf, cmd, conf, ric_conf_parse_time,
                     "expected a time like 500ms, 30s, 1m30s, 2h");
}

static const char *
set_size(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    return set_int64(cf, cmd, conf, ric_conf_parse_size, "expected a size like 512, 64k, 1m, 1g");
}

static const char *
set_num(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    return set_int64(cf, cmd, conf, ric_conf_parse_number, "expected a non-negative integer");
}

/* A value named by one of a fixed list of words (NULL-ended); hint says
 * which, when the value is another. */
typedef struct {
    const char *word;
    int64_t value;
} conf_word_t;

static const char *
set_word(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf, const conf_word_t *words,
         const char *hint)
{
    const char *dup = check_unset(cf, cmd, conf);

    if (dup) {
        return dup;
    }
    for (; words->word != NULL; words++) {
        if (strcmp(cf->args[1], words->word) == 0) {
            *field_at(conf, cmd) = words->value;
            return NULL;
        }
    }
    return bad_value(cf, cmd, hint);
}

static const char *
set_flag(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    static const conf_word_t words[] = { { "on", 1 }, { "off", 0 }, { NULL, 0 } };

    return set_word(cf, cmd, conf, words, "it must be \"on\" or \"off\"");
}

static const char *
set_worker_processes(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    ric_conf_t *c = conf;
    long n;

    if (c->worker_processes != RIC_CONF_UNSET) {
        return ric_conf_reason(cf, "\"%s\" directive is duplicate", cmd->name);
    }
    if (strcmp(cf->args[1], "auto") == 0) {
        n = sysconf(_SC_NPROCESSORS_ONLN);
        c->worker_processes = n > 0 ? n : 1;
        return NULL;
    }
    if (ric_conf_parse_number(cf->args[1], &c->worker_processes) != RIC_OK
        || c->worker_processes < 1 || c->worker_processes > 1024) {
        c->worker_processes = RIC_CONF_UNSET;
        return bad_value(cf, cmd, "expected \"auto\" or a number from 1 to 1024");
    }
    return NULL;
}

/* "off", or a time of at least RIC_WATCHDOG_MIN_MS: shorter would take a
 * worker's ordinary pauses (a burst of TLS handshakes, a page-fault storm)
 * for a stall and lose its requests. */
static const char *
set_watchdog(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    const char *dup = check_unset(cf, cmd, conf);
    int64_t ms;

    if (dup) {
        return dup;
    }
    if (strcmp(cf->args[1], "off") == 0) {
        *field_at(conf, cmd) = 0;
        return NULL;
    }
    if (ric_conf_parse_time(cf->args[1], &ms) != RIC_OK || ms < RIC_WATCHDOG_MIN_MS) {
        return bad_value(cf, cmd, "expected off or a time of at least 1s, like 5s");
    }
    *field_at(conf, cmd) = ms;
    return NULL;
}

static const char *
set_pid(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    ric_conf_t *c = conf;

    if (c->pid_path != NULL) {
        return ric_conf_reason(cf, "\"%s\" directive is duplicate", cmd->name);
    }
    c->pid_path = strcmp(cf->args[1], "off") == 0
                      ? ric_pstrdup(cf->pool, "off")
                      : ric_conf_full_path(cf->pool, c->prefix, cf->args[1]);
    return NULL;
}

static const char *
set_error_log(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    ric_conf_t *c = cf->conf;
    int level = RIC_LOG_ERR;

    (void) conf;
    if (c->error_log != NULL) {
        return ric_conf_reason(cf, "\"%s\" directive is duplicate", cmd->name);
    }
    if (cf->nargs == 3) {
        level = ric_log_level_parse(cf->args[2]);
        if (level < 0) {
            return ric_conf_reason(cf, "invalid log level \"%s\"; expected one of debug, info, "
                                   "notice, warn, error, crit, alert, emerg", cf->args[2]);
        }
    }
    c->error_log = strcmp(cf->args[1], "stderr") == 0
                       ? ric_pstrdup(cf->pool, "stderr")
                       : ric_conf_full_path(cf->pool, c->prefix, cf->args[1]);
    c->error_log_level = level;
    return NULL;
}

static int
has_glob(const char *s)
{
    return strpbrk(s, "*?[") != NULL;
}

static const char *
set_include(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    char *pattern = ric_conf_full_path(cf->pool, cf->conf->prefix, cf->args[1]);
    glob_t g;
    size_t i;
    int rc;

    (void) cmd;
    (void) conf;
    if (!has_glob(pattern)) {
        return ric_conf_parse_file(cf, pattern) == RIC_OK ? NULL : ric_conf_reported;
    }
    rc = glob(pattern, 0, NULL, &g);
    if (rc == GLOB_NOMATCH) {
        return NULL; /* like nginx: a pattern may match nothing */
    }
    if (rc != 0) {
        return ric_conf_reason(cf, "cannot read the files of \"%s\"", pattern);
    }
    for (i = 0; i < g.gl_pathc; i++) {
        if (ric_conf_parse_file(cf, g.gl_pathv[i]) != RIC_OK) {
            globfree(&g);
            return ric_conf_reported;
        }
    }
    globfree(&g);
    return NULL;
}

static void
settings_init(ric_http_settings_t *s)
{
    int64_t *f = (int64_t *) s;
    size_t i;

    for (i = 0; i < sizeof(*s) / sizeof(int64_t); i++) {
        f[i] = RIC_CONF_UNSET;
    }
}

/* Runs a block handler's body with the context switched, then restores it. */
static const char *
enter_block(ric_conf_parse_t *cf, unsigned ctx)
{
    unsigned saved = cf->ctx;
    int rc, line = cf->directive_line;

    cf->ctx = ctx;
    rc = ric_conf_parse_block(cf);
    cf->ctx = saved;
    /* errors found after the block refer to its opening line */
    cf->directive_line = line;
    return rc == RIC_OK ? NULL : ric_conf_reported;
}

static const char *
block_http(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    (void) conf;
    if (cf->conf->http != NULL) {
        return ric_conf_reason(cf, "\"%s\" directive is duplicate", cmd->name);
    }
    cf->conf->http = ric_pcalloc(cf->pool, sizeof(ric_http_conf_t));
    settings_init(&cf->conf->http->settings);
    ric_shared_dict_begin();
    return enter_block(cf, RIC_CONF_HTTP);
}

static const char *
block_server(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    ric_server_conf_t *s = ric_pcalloc(cf->pool, sizeof(*s)), **tail;
    const char *rc;

    (void) cmd;
    (void) conf;
    settings_init(&s->settings);
    s->file = cf->file;
    s->line = cf->directive_line;
    for (tail = &cf->conf->http->servers; *tail; tail = &(*tail)->next) {
    }
    *tail = s;
    cf->server = s;
    rc = enter_block(cf, RIC_CONF_SRV);
    if (rc == NULL && s->listens == NULL) {
        return "server has no \"listen\" directive";
    }
    cf->server = NULL;
    return rc;
}

/* NULL when path can be a request's normalized path, which locations are
 * matched against (route.c); else why the location could never match. */
static const char *
check_location_path(ric_conf_parse_t *cf, const char *path)
{
    size_t i, n = strlen(path), len;
    u_char *norm;

    for (i = 0; i < n; i++) {
        if ((u_char) path[i] <= ' ' || (u_char) path[i] == 0x7f) {
            return ric_conf_reason(cf, "location \"%s\" can never match: a request's path has "
                                   "no space or control byte: write it %%-escaped, as a client "
                                   "sends it (%%20)", path);
        }
    }
    if (ric_route_path_normal((const u_char *) path, n)) {
        return NULL;
    }
    norm = ric_palloc(cf->pool, n + 1);
    if (ric_route_normalize((const u_char *) path, n, norm, &len) != RIC_OK) {
        return ric_conf_reason(cf, "location \"%s\" can never match: a request with that path "
                               "is refused (400)", path);
    }
    return ric_conf_reason(cf, "location \"%s\" can never match: locations are matched "
                           "against the normalized path; write \"%.*s\"", path, (int) len,
                           (const char *) norm);
}

static const char *
block_location(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    ric_location_conf_t *l, *o, **tail;
    const char *path;
    int exact = 0;
    const char *rc;

    (void) conf;
    if (cf->nargs == 3) {
        if (strcmp(cf->args[1], "=") == 0) {
            exact = 1;
        } else if (strcmp(cf->args[1], "~") == 0 || strcmp(cf->args[1], "~*") == 0) {
            return "regular expression locations are not supported; use \"=\" or a prefix";
        } else if (strcmp(cf->args[1], "^~") != 0) {
            return ric_conf_reason(cf, "invalid location modifier \"%s\"", cf->args[1]);
        }
        path = cf->args[2];
    } else {
        path = cf->args[1];
    }
    if (path[0] != '/') {
        return ric_conf_reason(cf, "invalid location \"%s\" in \"%s\" directive, it must start "
                               "with \"/\"", path, cmd->name);
    }
    if ((rc = check_location_path(cf, path)) != NULL) {
        return rc;
    }
    for (o = cf->server->locations; o; o = o->next) {
        if (o->exact == exact && strcmp(o->path, path) == 0) {
            return ric_conf_reason(cf, "duplicate location \"%s\"", path);
        }
    }
    l = ric_pcalloc(cf->pool, sizeof(*l));
    l->path = ric_pstrdup(cf->pool, path);
    l->exact = exact;
    l->file = cf->file;
    l->line = cf->directive_line;
    settings_init(&l->settings);
    for (tail = &cf->server->locations; *tail; tail = &(*tail)->next) {
    }
    *tail = l;
    cf->location = l;
    rc = enter_block(cf, RIC_CONF_LOC);
    cf->location = NULL;
    return rc;
}

static const char *
block_upstream(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    ric_upstream_conf_t *u, **tail;
    const char *rc;

    (void) cmd;
    (void) conf;
    for (u = cf->conf->http->upstreams; u; u = u->next) {
        if (strcmp(u->name, cf->args[1]) == 0) {
            return ric_conf_reason(cf, "duplicate upstream \"%s\"", cf->args[1]);
        }
    }
    u = ric_pcalloc(cf->pool, sizeof(*u));
    u->name = ric_pstrdup(cf->pool, cf->args[1]);
    u->keepalive = RIC_CONF_UNSET;
    u->keepalive_timeout = RIC_CONF_UNSET;
    u->file = cf->file;
    u->line = cf->directive_line;
    for (tail = &cf->conf->http->upstreams; *tail; tail = &(*tail)->next) {
    }
    *tail = u;
    cf->upstream = u;
    rc = enter_block(cf, RIC_CONF_UPS);
    cf->upstream = NULL;
    if (rc == NULL && u->servers == NULL) {
        return ric_conf_reason(cf, "no servers in upstream \"%s\"", u->name);
    }
    return rc;
}

/* Splits "host:port", "[v6]:port", "port" or "host" (port defaults to def).
 * Returns NULL or a reason. */
static const char *
split_host_port(ric_conf_parse_t *cf, const char *text, const char *def, char **host,
                char **port)
{
    const char *colon, *end;
    int64_t n;

    if (text[0] == '[') {
        end = strchr(text, ']');
        if (end == NULL) {
            return ric_conf_reason(cf, "invalid address \"%s\": missing \"]\"", text);
        }
        *host = ric_pstrndup(cf->pool, text + 1, (size_t) (end - text - 1));
        colon = end[1] == ':' ? end + 1 : NULL;
        if (end[1] != '\0' && colon == NULL) {
            return ric_conf_reason(cf, "invalid address \"%s\"", text);
        }
    } else {
        colon = strrchr(text, ':');
        if (colon != NULL && strchr(text, ':') != colon) {
            return ric_conf_reason(cf, "invalid address \"%s\": put IPv6 addresses in "
                                   "brackets, like [::1]:8080", text);
        }
        if (colon == NULL && ric_conf_parse_number(text, &n) == RIC_OK) {
            *host = NULL;
            *port = ric_pstrdup(cf->pool, text);
            goto check_port;
        }
        *host = colon ? ric_pstrndup(cf->pool, text, (size_t) (colon - text))
                      : ric_pstrdup(cf->pool, text);
    }
    *port = ric_pstrdup(cf->pool, colon ? colon + 1 : def);
    if (*host != NULL && (*host)[0] == '\0') {
        return ric_conf_reason(cf, "invalid address \"%s\": empty host", text);
    }

check_port:
    if (ric_conf_parse_number(*port, &n) != RIC_OK || n < 1 || n > 65535) {
        return ric_conf_reason(cf, "invalid port in \"%s\"", text);
    }
    return NULL;
}

/* A listen address, cf->args[1] ("ADDRESS:PORT", "PORT", "*:PORT"), of
 * the directive being read, for server s. */
static const char *
listen_new(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, ric_server_conf_t *s,
           ric_listen_t **out)
{
    ric_listen_t *l;
    struct addrinfo hints, *res;
    char *host, *port;
    const char *reason;
    int rc;

    reason = split_host_port(cf, cf->args[1], "80", &host, &port);
    if (reason != NULL) {
        return reason;
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    if (host != NULL && strcmp(host, "*") == 0) {
        host = NULL;
    }
    if (host != NULL) {
        /* listen takes addresses, not names: resolving at load time would
         * tie the config to DNS */
        hints.ai_flags |= AI_NUMERICHOST;
    } else {
        hints.ai_family = AF_INET;
    }
    rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0) {
        return ric_conf_reason(cf, "invalid address \"%s\" in \"%s\": %s", cf->args[1],
                               cmd->name, host ? "expected an IP address" : gai_strerror(rc));
    }

    l = ric_pcalloc(cf->pool, sizeof(*l));
    memcpy(&l->addr, res->ai_addr, res->ai_addrlen);
    l->addrlen = res->ai_addrlen;
    l->fd = -1;
    l->server = s;
    l->file = cf->file;
    l->line = cf->directive_line;
    l->text = ric_pstrdup(cf->pool, res->ai_family == AF_INET6 && host
                                        ? ric_conf_reason(cf, "[%s]:%s", host, port)
                                        : ric_conf_reason(cf, "%s:%s", host ? host : "0.0.0.0",
                                                          port));
    freeaddrinfo(res);
    *out = l;
    return NULL;
}

static const char *
set_listen(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    ric_server_conf_t *s = cf->server;
    ric_listen_t *l, *o, **tail;
    const char *reason;
    int i;

    (void) conf;
    if ((reason = listen_new(cf, cmd, s, &l)) != NULL) {
        return reason;
    }
    for (i = 2; i < cf->nargs; i++) {
        if (strcmp(cf->args[i], "default_server") == 0 || strcmp(cf->args[i], "default") == 0) {
            l->default_server = 1;
        } else if (strcmp(cf->args[i], "ssl") == 0) {
            l->ssl = 1;
        } else if (strcmp(cf->args[i], "http2") == 0 || strcmp(cf->args[i], "quic") == 0) {
            return ric_conf_reason(cf, "\"%s\" in \"%s\" is not supported: the gateway speaks "
                                   "HTTP/1.1 (ALPN offers http/1.1); remove it", cf->args[i],
                                   cmd->name);
        } else {
            return ric_conf_reason(cf, "invalid parameter \"%s\" in \"%s\" directive",
                                   cf->args[i], cmd->name);
        }
    }
    for (o = s->listens; o; o = o->next) {
        if (o->addrlen == l->addrlen && memcmp(&o->addr, &l->addr, l->addrlen) == 0) {
            return ric_conf_reason(cf, "duplicate listen %s", l->text);
        }
    }
    for (tail = &s->listens; *tail; tail = &(*tail)->next) {
    }
    *tail = l;
    return NULL;
}

static int
valid_server_name(const char *n)
{
    const char *p;

    for (p = n; *p; p++) {
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9')
              || *p == '-' || *p == '.' || *p == '_' || *p == ':' || *p == '*'
              || *p == '[' || *p == ']')) {
            return 0;
        }
    }
    /* "*" only as a whole leading label: "*.example.com" */
    p = strchr(n, '*');
    return p == NULL || (p == n && n[1] == '.' && strchr(n + 1, '*') == NULL);
}

/* admin_listen ADDRESS:PORT: the admin listener's server (no locations,
 * no access log), made on first use. */
static const char *
set_admin_listen(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    ric_http_conf_t *http = cf->conf->http;
    ric_server_conf_t *s = http->admin;
    const char *reason;
    ric_listen_t *l;

    (void) conf;
    if (s != NULL) {
        return ric_conf_reason(cf, "\"%s\" directive is duplicate (first at %s:%d)", cmd->name,
                               s->listens->file, s->listens->line);
    }
    s = ric_pcalloc(cf->pool, sizeof(*s));
    settings_init(&s->settings);
    s->file = cf->file;
    s->line = cf->directive_line;
    if ((reason = listen_new(cf, cmd, s, &l)) != NULL) {
        return reason;
    }
    l->default_server = 1;
    s->listens = l;
    http->admin = s;
    return NULL;
}

/* admin_allow CIDR ...: an address with /BITS, or alone (every bit). */
static const char *
set_admin_allow(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    ric_http_conf_t *http = cf->conf->http;
    char buf[64], *slash;
    ric_cidr_t *c;
    int i, max;
    int64_t bits;

    (void) conf;
    if (http->admin_allow != NULL) {
        return ric_conf_reason(cf, "\"%s\" directive is duplicate (first at %s:%d): list every "
                               "address in one", cmd->name, http->admin_allow_file,
                               http->admin_allow_line);
    }
    http->admin_allow = ric_pcalloc(cf->pool, sizeof(ric_cidr_t) * (size_t) (cf->nargs - 1));
    http->admin_allow_file = cf->file;
    http->admin_allow_line = cf->directive_line;
    for (i = 1; i < cf->nargs; i++) {
        c = &http->admin_allow[http->nadmin_allow++];
        snprintf(buf, sizeof(buf), "%s", cf->args[i]);
        slash = strchr(buf, '/');
        if (slash != NULL) {
            *slash++ = '\0';
        }
        if (inet_pton(AF_INET, buf, c->addr) == 1) {
            c->family = AF_INET;
            max = 32;
        } else if (inet_pton(AF_INET6, buf, c->addr) == 1) {
            c->family = AF_INET6;
            max = 128;
        } else {
            return ric_conf_reason(cf, "invalid address \"%s\" in \"%s\": expected an IP "
                                   "address or ADDRESS/BITS", cf->args[i], cmd->name);
        }
        bits = max;
        if (slash != NULL && (ric_conf_parse_number(slash, &bits) != RIC_OK || bits > max)) {
            return ric_conf_reason(cf, "invalid prefix length in \"%s\" of \"%s\": 0 to %d",
                                   cf->args[i], cmd->name, max);
        }
        c->bits = (int) bits;
    }
    return NULL;
}

static const char *
set_server_name(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    ric_server_conf_t *s = cf->server;
    int i;

    (void) conf;
    if (s->names != NULL) {
        return ric_conf_reason(cf, "\"%s\" directive is duplicate", cmd->name);
    }
    /* ".example.com" is two names, as in nginx: example.com and *.example.com */
    s->names = ric_palloc(cf->pool, sizeof(char *) * (size_t) (cf->nargs - 1) * 2);
    for (i = 1; i < cf->nargs; i++) {
        const char *n = cf->args[i];
        if (n[0] == '~') {
            return ric_conf_reason(cf, "regular expression server names are not supported: "
                                   "\"%s\"", n);
        }
        if (n[0] == '.' && n[1] != '\0' && n[1] != '.') {
            s->names[s->nnames++] = ric_pstrdup(cf->pool, ric_conf_reason(cf, "*%s", n));
            n++;
        }
        if (!valid_server_name(n)) {
            return ric_conf_reason(cf, "invalid server name \"%s\"", cf->args[i]);
        }
        s->names[s->nnames++] = ric_pstrdup(cf->pool, n);
    }
    /* names compare case-insensitively: keep them lowercase */
    for (i = 0; i < s->nnames; i++) {
        for (char *p = s->names[i]; *p; p++) {
            if (*p >= 'A' && *p <= 'Z') {
                *p |= 0x20;
            }
        }
    }
    return NULL;
}

static const char *
set_upstream_server(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    ric_upstream_conf_t *u = conf;
    ric_upstream_server_t *s = ric_pcalloc(cf->pool, sizeof(*s)), **tail;
    const char *reason, *v;
    int i;
    int64_t n;

    (void) cmd;
    reason = split_host_port(cf, cf->args[1], "80", &s->host, &s->port);
    if (reason != NULL) {
        return reason;
    }
    if (s->host == NULL) {
        return ric_conf_reason(cf, "invalid server \"%s\": expected HOST:PORT", cf->args[1]);
    }
    s->text = ric_pstrdup(cf->pool, cf->args[1]);
    s->weight = 1;
    s->max_fails = 1;
    s->fail_timeout = 10000;
    for (i = 2; i < cf->nargs; i++) {
        const char *a = cf->args[i];
        if (strncmp(a, "weight=", 7) == 0) {
            v = a + 7;
            if (ric_conf_parse_number(v, &n) != RIC_OK || n < 1 || n > 1000) {
                return ric_conf_reason(cf, "invalid \"%s\": weight is 1 to 1000", a);
            }
            s->weight = (int) n;
        } else if (strncmp(a, "max_fails=", 10) == 0) {
            v = a + 10;
            if (ric_conf_parse_number(v, &n) != RIC_OK || n > 1000000) {
                return ric_conf_reason(cf, "invalid \"%s\": max_fails is a number, "
                                       "0 turns it off", a);
            }
            s->max_fails = (int) n;
        } else if (strncmp(a, "fail_timeout=", 13) == 0) {
            if (ric_conf_parse_time(a + 13, &s->fail_timeout) != RIC_OK) {
                return ric_conf_reason(cf, "invalid \"%s\": expected a time", a);
            }
        } else {
            return ric_conf_reason(cf, "invalid parameter \"%s\"", a);
        }
    }
    s->file = cf->file;
    s->line = cf->directive_line;
    for (tail = &u->servers; *tail; tail = &(*tail)->next) {
    }
    *tail = s;
    u->nservers++;
    return NULL;
}

static ric_http_refs_t *
current_refs(ric_conf_parse_t *cf)
{
    switch (cf->ctx) {
    case RIC_CONF_HTTP: return &cf->conf->http->refs;
    case RIC_CONF_SRV: return &cf->server->refs;
    case RIC_CONF_LOC: return &cf->location->refs;
    }
    return NULL;
}

/* The ric_http_refs_t field of a RIC_CONF_REF directive at this level. */
static char **
ref_at(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd)
{
    return (char **) ((char *) current_refs(cf) + cmd->offset);
}

static const char *
ref_duplicate(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd)
{
    if (*ref_at(cf, cmd) != NULL) {
        return ric_conf_reason(cf, "\"%s\" directive is duplicate", cmd->name);
    }
    return NULL;
}

static const char *
set_proxy_pass(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    ric_location_conf_t *l = cf->location;
    const char *url = cf->args[1], *rest;

    (void) conf;
    if (l->proxy_pass != NULL) {
        return ric_conf_reason(cf, "\"%s\" directive is duplicate", cmd->name);
    }
    l->proxy_tls = strncasecmp(url, "https://", 8) == 0;
    if (!l->proxy_tls && strncasecmp(url, "http://", 7) != 0) {
        return ric_conf_reason(cf, "invalid URL \"%s\" in \"%s\": it must start with http:// "
                               "or https://", url, cmd->name);
    }
    rest = url + (l->proxy_tls ? 8 : 7);
    if (*rest == '\0' || *rest == '/') {
        return ric_conf_reason(cf, "invalid URL \"%s\" in \"%s\": no host", url, cmd->name);
    }
    if (strchr(rest, '/') != NULL) {
        return ric_conf_reason(cf, "a URI in \"%s\" is not supported: \"%s\"; the request's "
                               "own path is passed on", cmd->name, url);
    }
    l->proxy_pass = ric_pstrdup(cf->pool, rest);
    l->proxy_pass_file = cf->file;
    l->proxy_pass_line = cf->directive_line;
    return NULL;
}

static const struct {
    const char *name;
    ric_var_t var;
} variables[] = {
    { "host", RIC_VAR_HOST },
    { "http_host", RIC_VAR_HTTP_HOST },
    { "remote_addr", RIC_VAR_REMOTE_ADDR },
    { "remote_port", RIC_VAR_REMOTE_PORT },
    { "scheme", RIC_VAR_SCHEME },
    { "proxy_host", RIC_VAR_PROXY_HOST },
    { "request_uri", RIC_VAR_REQUEST_URI },
    { "request_method", RIC_VAR_REQUEST_METHOD },
    { "proxy_add_x_forwarded_for", RIC_VAR_PROXY_ADD_XFF },
};

static int
is_var_char(char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')
           || ch == '_';
}

/* Splits a value into literal text and $variables ("${name}" works too). */
static const char *
parse_template(ric_conf_parse_t *cf, const char *v, ric_template_part_t **out)
{
    ric_template_part_t *head = NULL, **tail = &head, *part;
    const char *p = v, *start, *name;
    size_t nlen, i;

    while (*p) {
        part = ric_pcalloc(cf->pool, sizeof(*part));
        if (*p != '$') {
            start = p;
            while (*p && *p != '$') {
                p++;
            }
            part->var = RIC_VAR_LITERAL;
            part->text = ric_pstrndup(cf->pool, start, (size_t) (p - start));
            part->len = (size_t) (p - start);
        } else {
            p++;
            if (*p == '{') {
                name = ++p;
                while (is_var_char(*p)) {
                    p++;
                }
                if (*p != '}') {
                    return ric_conf_reason(cf, "invalid variable in \"%s\": missing \"}\"", v);
                }
                nlen = (size_t) (p++ - name);
            } else {
                name = p;
                while (is_var_char(*p)) {
                    p++;
                }
                nlen = (size_t) (p - name);
            }
            if (nlen == 0) {
                return ric_conf_reason(cf, "invalid variable name in \"%s\"", v);
            }
            if (nlen > 5 && strncmp(name, "http_", 5) == 0) {
                /* $http_x_request_id is the field X-Request-Id */
                part->var = RIC_VAR_HTTP;
                part->text = ric_pstrndup(cf->pool, name + 5, nlen - 5);
                part->len = nlen - 5;
                for (i = 0; i < part->len; i++) {
                    char ch = part->text[i];
                    part->text[i] = ch == '_' ? '-' : (ch >= 'A' && ch <= 'Z') ? ch | 0x20 : ch;
                }
            } else {
                for (i = 0; i < ric_nelems(variables); i++) {
                    if (strlen(variables[i].name) == nlen
                        && strncmp(variables[i].name, name, nlen) == 0) {
                        part->var = variables[i].var;
                        break;
                    }
                }
                if (i == ric_nelems(variables)) {
                    return ric_conf_reason(cf, "unknown variable \"$%.*s\"", (int) nlen, name);
                }
            }
        }
        *tail = part;
        tail = &part->next;
    }
    *out = head;
    return NULL;
}

static const char *
set_proxy_set_header(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    ric_http_refs_t *refs = current_refs(cf);
    ric_header_set_t *h, **tail;
    const char *p, *reason;

    (void) conf;
    for (p = cf->args[1]; *p; p++) {
        if (!is_var_char(*p) && !strchr("!#$%&'*+-.^`|~", *p)) {
            break;
        }
    }
    if (*p != '\0' || cf->args[1][0] == '\0') {
        return ric_conf_reason(cf, "invalid header name \"%s\" in \"%s\"", cf->args[1],
                               cmd->name);
    }
    for (p = cf->args[2]; *p; p++) {
        if ((u_char) *p < 0x20 && *p != '\t') {
            return ric_conf_reason(cf, "invalid header value in \"%s\": control characters "
                                   "are not allowed", cmd->name);
        }
    }
    h = ric_pcalloc(cf->pool, sizeof(*h));
    h->name = ric_pstrdup(cf->pool, cf->args[1]);
    reason = parse_template(cf, cf->args[2], &h->value);
    if (reason != NULL) {
        return reason;
    }
    for (tail = &refs->headers; *tail; tail = &(*tail)->next) {
        if (strcasecmp((*tail)->name, h->name) == 0) {
            return ric_conf_reason(cf, "header \"%s\" is set twice", h->name);
        }
    }
    *tail = h;
    return NULL;
}

/* access_log FILE [buffer=SIZE] [flush=TIME]: one destination for every
 * route naming the same file, which must then say the same of its
 * buffer. */
static const char *
access_log_for(ric_conf_parse_t *cf, ric_access_log_t **out)
{
    ric_http_conf_t *http = cf->conf->http;
    const char *arg = cf->args[1];
    int64_t buffer = 0, flush_ms = -1;
    ric_access_log_t *a;
    char *path;
    int i;

    for (i = 2; i < cf->nargs; i++) {
        if (strncmp(cf->args[i], "buffer=", 7) == 0) {
            if (ric_conf_parse_size(cf->args[i] + 7, &buffer) != RIC_OK || buffer < 1024
                || buffer > ((int64_t) 16 << 20)) {
                return ric_conf_reason(cf, "invalid \"%s\" in \"access_log\": a size from 1k "
                                       "to 16m", cf->args[i]);
            }
        } else if (strncmp(cf->args[i], "flush=", 6) == 0) {
            if (ric_conf_parse_time(cf->args[i] + 6, &flush_ms) != RIC_OK || flush_ms <= 0) {
                return ric_conf_reason(cf, "invalid \"%s\" in \"access_log\": a time above 0",
                                       cf->args[i]);
            }
        } else {
            return ric_conf_reason(cf, "invalid parameter \"%s\" in \"access_log\": "
                                   "buffer=SIZE or flush=TIME", cf->args[i]);
        }
    }
    if (flush_ms > 0 && buffer == 0) {
        buffer = 64 << 10; /* flush= alone: nginx's default buffer */
    }
    if (buffer > 0 && flush_ms < 0) {
        flush_ms = 1000;
    }
    if (strcmp(arg, "off") == 0 || strcmp(arg, "stdout") == 0 || strcmp(arg, "stderr") == 0) {
        if (buffer > 0 && strcmp(arg, "off") == 0) {
            return ric_conf_reason(cf, "\"access_log off\" takes no buffer= or flush=");
        }
        path = ric_pstrdup(cf->pool, arg);
    } else {
        path = ric_conf_full_path(cf->pool, cf->conf->prefix, arg);
    }
    for (a = http->access_logs; a; a = a->next) {
        if (strcmp(a->path, path) == 0) {
            if (a->buffer != buffer || a->flush_ms != flush_ms) {
                return ric_conf_reason(cf, "access_log %s is also named at %s:%d with another "
                                       "buffer= or flush=: one file, one buffer", arg, a->file,
                                       a->line);
            }
            *out = a;
            return NULL;
        }
    }
    a = ric_pcalloc(cf->pool, sizeof(*a));
    a->path = path;
    a->fd = -1;
    a->buffer = buffer;
    a->flush_ms = flush_ms;
    a->file = cf->file;
    a->line = cf->directive_line;
    a->next = http->access_logs;
    http->access_logs = a;
    *out = a;
    return NULL;
}

static const char *
set_access_log(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    const char *dup = ref_duplicate(cf, cmd);

    (void) conf;
    if (dup == NULL) {
        return access_log_for(cf, &current_refs(cf)->access_log);
    }
    return dup;
}

/* A name kept as written. */
static const char *
set_ssl_name(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    const char *dup = ref_duplicate(cf, cmd);

    (void) conf;
    if (dup == NULL) {
        *ref_at(cf, cmd) = ric_pstrdup(cf->pool, cf->args[1]);
    }
    return dup;
}

static int
same_str(const char *a, const char *b)
{
    return (a == NULL && b == NULL) || (a != NULL && b != NULL && strcmp(a, b) == 0);
}

/* A file or directory, relative to the prefix. */
static const char *
set_path(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    const char *dup = ref_duplicate(cf, cmd);

    (void) conf;
    if (dup == NULL) {
        *ref_at(cf, cmd) = ric_conf_full_path(cf->pool, cf->conf->prefix, cf->args[1]);
    }
    return dup;
}

/* ssl_certificate / ssl_certificate_key FILE: kept with where it was
 * said; loaded when the config is finished (tls_server.c), for the servers
 * on an ssl address. */
static const char *
set_ssl_file(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    const char *dup = ref_duplicate(cf, cmd);
    ric_conf_file_t *f;

    (void) conf;
    if (dup != NULL) {
        return dup;
    }
    f = ric_pcalloc(cf->pool, sizeof(*f));
    f->path = ric_conf_full_path(cf->pool, cf->conf->prefix, cf->args[1]);
    f->file = cf->file;
    f->line = cf->directive_line;
    *(ric_conf_file_t **) ref_at(cf, cmd) = f;
    return NULL;
}

/* ssl_protocols TLSv1.2 | TLSv1.3 ...: older ones are refused by name. */
static const char *
set_ssl_protocols(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    int64_t *field = field_at(conf, cmd), mask = 0;
    const char *dup = check_unset(cf, cmd, conf);
    int i;

    if (dup != NULL) {
        return dup;
    }
    for (i = 1; i < cf->nargs; i++) {
        if (strcasecmp(cf->args[i], "TLSv1.2") == 0) {
            mask |= RIC_SSL_TLSV1_2;
        } else if (strcasecmp(cf->args[i], "TLSv1.3") == 0) {
            mask |= RIC_SSL_TLSV1_3;
        } else if (strcasecmp(cf->args[i], "SSLv2") == 0 || strcasecmp(cf->args[i], "SSLv3") == 0
                   || strcasecmp(cf->args[i], "TLSv1") == 0
                   || strcasecmp(cf->args[i], "TLSv1.1") == 0) {
            return ric_conf_reason(cf, "%s is not supported in \"%s\": it is insecure, and "
                                   "TLSv1.2 is the oldest ricochet speaks", cf->args[i], cmd->name);
        } else {
            return ric_conf_reason(cf, "invalid value \"%s\" in \"%s\": expected TLSv1.2 or "
                                   "TLSv1.3", cf->args[i], cmd->name);
        }
    }
    *field = mask;
    return NULL;
}

/* ssl_ciphers LIST: OpenSSL's syntax; a list naming no cipher it knows is
 * an error now, not a failed handshake later. */
static const char *
set_ssl_ciphers(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    const char *dup = ref_duplicate(cf, cmd);

    (void) conf;
    if (dup != NULL) {
        return dup;
    }
    if (!ric_tls_ciphers_valid(cf->args[1])) {
        return ric_conf_reason(cf, "no TLS 1.2 cipher OpenSSL knows in \"%s\" \"%s\" (TLS 1.3 "
                               "suites, TLS_AES_..., are not chosen here: TLS 1.3 uses all of "
                               "them)", cmd->name, cf->args[1]);
    }
    *ref_at(cf, cmd) = ric_pstrdup(cf->pool, cf->args[1]);
    return NULL;
}

/* ssl_session_cache off | builtin[:N]: N sessions kept by each worker. */
static const char *
set_ssl_session_cache(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    int64_t *field = field_at(conf, cmd), n = 20480;
    const char *dup = check_unset(cf, cmd, conf), *a = cf->args[1];

    if (dup != NULL) {
        return dup;
    }
    if (strcmp(a, "off") == 0 || strcmp(a, "none") == 0) {
        n = 0;
    } else if (strncmp(a, "shared:", 7) == 0) {
        return ric_conf_reason(cf, "\"%s\" is not supported in \"%s\": each worker keeps its "
                               "own cache (builtin[:N]); sessions resume across workers by "
                               "ssl_session_tickets", a, cmd->name);
    } else if (strncmp(a, "builtin", 7) != 0
               || (a[7] != '\0'
                   && (a[7] != ':' || ric_conf_parse_number(a + 8, &n) != RIC_OK || n < 1))) {
        return ric_conf_reason(cf, "invalid value \"%s\" in \"%s\": expected off or "
                               "builtin[:N]", a, cmd->name);
    }
    *field = n;
    return NULL;
}

/* classify_body_max SIZE: at most what the upstream client's buffer holds. */
static const char *
set_classify_body_max(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    const char *reason = set_size(cf, cmd, conf);

    if (reason == NULL && ((ric_http_settings_t *) conf)->classify_body_max > 32 * 1024) {
        return ric_conf_reason(cf, "\"%s\" is at most 32k", cmd->name);
    }
    return reason;
}

/* lua_shared_dict NAME SIZE (http): a dictionary every worker shares. */
static const char *
set_shared_dict(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    ric_http_conf_t *http = cf->conf->http;
    ric_shared_dict_conf_t *d;
    const char *name = cf->args[1], *p;
    int64_t size;

    (void) conf;
    for (p = name; *p && (isalnum((unsigned char) *p) || *p == '_'); p++) {
    }
    if (*p != '\0' || p == name || p - name > 64) {
        return ric_conf_reason(cf, "invalid name \"%s\" in \"%s\": 1 to 64 letters, digits or "
                               "'_'", name, cmd->name);
    }
    for (d = http->shared_dicts; d; d = d->next) {
        if (strcmp(d->name, name) == 0) {
            return ric_conf_reason(cf, "lua_shared_dict \"%s\" is already declared in %s:%d",
                                   name, d->file, d->line);
        }
    }
    if (ric_conf_parse_size(cf->args[2], &size) != RIC_OK || size < RIC_DICT_MIN_SIZE
        || size > ((int64_t) 1 << 30)) {
        return ric_conf_reason(cf, "invalid size \"%s\" in \"%s\": from 8k to 1g", cf->args[2],
                               cmd->name);
    }
    d = ric_pcalloc(cf->pool, sizeof(*d));
    d->name = ric_pstrdup(cf->pool, name);
    d->size = size;
    d->file = cf->file;
    d->line = cf->line;
    d->next = http->shared_dicts;
    http->shared_dicts = d;
    ric_shared_dict_declare(http->shared_dicts);
    return NULL;
}

static const char *
set_script_memory(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    const char *reason = set_size(cf, cmd, conf);

    if (reason == NULL && *field_at(conf, cmd) < (4 << 20)) {
        return bad_value(cf, cmd, "it must be at least 4m (the state itself takes about 1m)");
    }
    return reason;
}

/* script FILE: loaded now, so a script that does not load stops the
 * config (and `ricochet -t` says where, in the script). */
static const char *
set_script(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    const char *dup = ref_duplicate(cf, cmd);
    char *path, err[1024];
    ric_script_t *s;

    (void) conf;
    if (dup != NULL) {
        return dup;
    }
    path = ric_conf_full_path(cf->pool, cf->conf->prefix, cf->args[1]);
    /* its main chunk may name a lua_shared_dict declared further down */
    ric_shared_dict_reading(1);
    s = ric_script_load(cf->conf, path, err, sizeof(err));
    ric_shared_dict_reading(0);
    if (s == NULL) {
        return ric_conf_reason(cf, "cannot load script \"%s\": %s", cf->args[1], err);
    }
    *(ric_script_t **) ref_at(cf, cmd) = s;
    return NULL;
}

static const char *
set_retry_backoff(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    ric_http_settings_t *s = conf;
    int64_t initial, max, factor_milli = 2000;
    ric_jitter_t jitter = RIC_JITTER_FULL;
    char *end;
    double factor;
    int i, adaptive = 1;

    if (s->retry_backoff_initial != RIC_CONF_UNSET) {
        return ric_conf_reason(cf, "\"%s\" directive is duplicate", cmd->name);
    }
    if (cf->nargs < 3 || cf->nargs > 6) {
        return ric_conf_reason(cf, "invalid number of arguments in \"%s\" directive", cmd->name);
    }
    if (ric_conf_parse_time(cf->args[1], &initial) != RIC_OK || initial == 0) {
        return ric_conf_reason(cf, "invalid INITIAL \"%s\" in \"%s\": expected a time above 0",
                               cf->args[1], cmd->name);
    }
    if (ric_conf_parse_time(cf->args[2], &max) != RIC_OK) {
        return ric_conf_reason(cf, "invalid MAX \"%s\" in \"%s\": expected a time", cf->args[2],
                               cmd->name);
    }
    if (initial > max) {
        return ric_conf_reason(cf, "INITIAL %s is above MAX %s in \"%s\"", cf->args[1],
                               cf->args[2], cmd->name);
    }
    for (i = 3; i < cf->nargs; i++) {
        if (strncmp(cf->args[i], "jitter=", 7) == 0) {
            if (ric_backoff_parse_jitter(cf->args[i], &jitter) != RIC_OK) {
                return ric_conf_reason(cf, "invalid \"%s\" in \"%s\": expected jitter=full, "
                                       "jitter=equal or jitter=none", cf->args[i], cmd->name);
            }
            continue;
        }
        if (strncmp(cf->args[i], "adaptive=", 9) == 0) {
            if (strcmp(cf->args[i] + 9, "on") != 0 && strcmp(cf->args[i] + 9, "off") != 0) {
                return ric_conf_reason(cf, "invalid \"%s\" in \"%s\": expected adaptive=on or "
                                       "adaptive=off", cf->args[i], cmd->name);
            }
            adaptive = strcmp(cf->args[i] + 9, "on") == 0;
            continue;
        }
        if (i != 3) {
            return ric_conf_reason(cf, "invalid parameter \"%s\" in \"%s\"", cf->args[i],
                                   cmd->name);
        }
        factor = strtod(cf->args[i], &end);
        if (*end != '\0' || end == cf->args[i] || !(factor >= 1.0) || factor > 1000.0) {
            return ric_conf_reason(cf, "invalid FACTOR \"%s\" in \"%s\": expected a number "
                                   "from 1 to 1000", cf->args[i], cmd->name);
        }
        factor_milli = (int64_t) (factor * 1000.0 + 0.5);
    }
    s->retry_backoff_initial = initial;
    s->retry_backoff_max = max;
    s->retry_backoff_factor_milli = factor_milli;
    s->retry_backoff_jitter = jitter;
    s->retry_backoff_adaptive = adaptive;
    return NULL;
}

/* retry_hedge off | auto | TIME (above 0). */
static const char *
set_retry_hedge(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    int64_t ms;
    const char *dup = check_unset(cf, cmd, conf);

    if (dup) {
        return dup;
    }
    if (strcmp(cf->args[1], "off") == 0 || strcmp(cf->args[1], "auto") == 0) {
        *field_at(conf, cmd) = cf->args[1][0] == 'o' ? RIC_HEDGE_OFF : RIC_HEDGE_AUTO;
        return NULL;
    }
    if (ric_conf_parse_time(cf->args[1], &ms) != RIC_OK || ms == 0) {
        return bad_value(cf, cmd, "expected off, auto, or a time above 0 like 50ms");
    }
    *field_at(conf, cmd) = ms;
    return NULL;
}

/* A time that must be above 0: a zero timeout would end every attempt
 * before it began. */
static const char *
set_msec_positive(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    const char *reason = set_msec(cf, cmd, conf);

    if (reason == NULL && *field_at(conf, cmd) == 0) {
        *field_at(conf, cmd) = RIC_CONF_UNSET;
        return bad_value(cf, cmd, "it must be above 0");
    }
    return reason;
}

static const char *
set_retry_attempts(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    const char *reason = set_num(cf, cmd, conf);

    if (reason == NULL && *field_at(conf, cmd) > 10000) {
        *field_at(conf, cmd) = RIC_CONF_UNSET;
        return bad_value(cf, cmd, "expected 0 (no limit but retry_timeout) to 10000");
    }
    return reason;
}

static const char *
set_per_try_timeout(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    const char *reason = set_msec_positive(cf, cmd, conf);

    if (reason == NULL) {
        ((ric_http_settings_t *) conf)->per_try_timeout_set = !cf->applying_defaults;
    }
    return reason;
}

/* "max=N" or "wait=TIME" of an adaptive budget. */
static const char *
budget_option(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, const char *a,
              ric_budget_conf_t *b)
{
    int64_t v;

    if (strncmp(a, "max=", 4) == 0) {
        if (ric_conf_parse_number(a + 4, &v) != RIC_OK || v < 1 || v > 1000000) {
            return ric_conf_reason(cf, "invalid \"%s\" in \"%s\": expected max=N tokens, 1 to "
                                   "1000000", a, cmd->name);
        }
        b->max_tokens = v;
    } else if (strncmp(a, "wait=", 5) == 0) {
        if (ric_conf_parse_time(a + 5, &v) != RIC_OK) {
            return ric_conf_reason(cf, "invalid \"%s\" in \"%s\": expected wait=TIME, e.g. "
                                   "wait=5s (0 never waits)", a, cmd->name);
        }
        b->wait_ms = v;
    } else {
        return ric_conf_reason(cf, "invalid \"%s\" in \"%s\": an adaptive budget takes max=N "
                               "and wait=TIME", a, cmd->name);
    }
    return NULL;
}

/* retry_budget adaptive [max=N] [wait=TIME] | RATIO [min=N/s] | off: the
 * rule of an upstream's budget. In an upstream block it is that
 * upstream's; elsewhere it is inherited and given to the upstreams the
 * locations proxy to (ric_conf_finish checks that they agree). */
static const char *
set_retry_budget(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    ric_budget_conf_t *b, **slot;
    const char *a = cf->args[1], *reason;
    size_t len = strlen(a);
    char *end;
    double ratio;
    int64_t min = 10; /* min= left out keeps the default floor */
    int i;

    slot = cf->ctx == RIC_CONF_UPS ? &((ric_upstream_conf_t *) conf)->retry_budget
                                   : (ric_budget_conf_t **) ref_at(cf, cmd);
    if (*slot != NULL) {
        return ric_conf_reason(cf, "\"%s\" directive is duplicate", cmd->name);
    }
    b = ric_pcalloc(cf->pool, sizeof(*b));
    ric_budget_conf_default(b);
    b->ctx = cf->ctx;
    if (!cf->applying_defaults) {
        b->file = cf->file;
        b->line = cf->directive_line;
    }
    if (strcmp(a, "off") == 0 || strcmp(a, "adaptive") == 0) {
        b->kind = a[0] == 'o' ? RIC_BUDGET_OFF : RIC_BUDGET_ADAPTIVE;
        for (i = 2; i < cf->nargs; i++) {
            if (b->kind == RIC_BUDGET_OFF) {
                return ric_conf_reason(cf, "\"%s off\" takes no options", cmd->name);
            }
            if (i == 3 && strncmp(cf->args[2], cf->args[3], 4) == 0) {
                return ric_conf_reason(cf, "\"%.4s\" given twice in \"%s\"", cf->args[3],
                                       cmd->name);
            }
            if ((reason = budget_option(cf, cmd, cf->args[i], b)) != NULL) {
                return reason;
            }
        }
        *slot = b;
        return NULL;
    }
    ratio = strtod(a, &end);
    if (end == a || !(ratio >= 0.0)) {
        goto bad_ratio;
    }
    if (*end == '%' && end[1] == '\0' && len > 1) {
        ratio /= 100.0;
    } else if (*end != '\0') {
        goto bad_ratio;
    }
    if (ratio > 100.0) {
        goto bad_ratio;
    }
    if (cf->nargs > 3) {
        return ric_conf_reason(cf, "invalid number of arguments in \"%s\" directive", cmd->name);
    }
    if (cf->nargs == 3) {
        const char *m = cf->args[2];
        char digits[32];
        size_t n;
        if (strncmp(m, "min=", 4) != 0 || (n = strlen(m + 4)) < 3
            || strcmp(m + 4 + n - 2, "/s") != 0 || n - 2 >= sizeof(digits)) {
            return ric_conf_reason(cf, "invalid \"%s\" in \"%s\": expected min=N/s", m,
                                   cmd->name);
        }
        memcpy(digits, m + 4, n - 2);
        digits[n - 2] = '\0';
        if (ric_conf_parse_number(digits, &min) != RIC_OK || min > 1000000) {
            return ric_conf_reason(cf, "invalid \"%s\" in \"%s\": expected min=N/s", m,
                                   cmd->name);
        }
    }
    b->kind = RIC_BUDGET_RATIO;
    b->ratio = (double) (int64_t) (ratio * 1000.0 + 0.5) / 1000.0;
    b->min_per_sec = min;
    *slot = b;
    return NULL;

bad_ratio:
    return ric_conf_reason(cf, "invalid \"%s\" in \"%s\": expected adaptive, off, a percentage "
                           "like 20%% or a fraction like 0.2", a, cmd->name);
}

static const char *
set_idempotency_key(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    static const conf_word_t words[] = {
        { "off", RIC_IDEMPOTENCY_OFF }, { "on", RIC_IDEMPOTENCY_ON },
        { "auto", RIC_IDEMPOTENCY_AUTO }, { NULL, 0 }
    };

    return set_word(cf, cmd, conf, words, "it must be \"off\", \"on\" or \"auto\"");
}

/* s[0..n) with %XX decoded, NUL-terminated (pool); NULL when malformed. */
static char *
percent_decode(ric_conf_parse_t *cf, const char *s, size_t n)
{
    char *out = ric_palloc(cf->pool, n + 1), *o = out, hex[3] = { 0, 0, 0 };
    size_t i;

    for (i = 0; i < n; i++) {
        if (s[i] != '%') {
            *o++ = s[i];
            continue;
        }
        if (i + 2 >= n) {
            return NULL; /* a % without its two digits */
        }
        hex[0] = s[i + 1];
        hex[1] = s[i + 2];
        if (!isxdigit((unsigned char) hex[0]) || !isxdigit((unsigned char) hex[1])) {
            return NULL;
        }
        *o++ = (char) strtol(hex, NULL, 16);
        i += 2;
    }
    *o = '\0';
    return out;
}

/* What a redis:// value shows in logs and errors: its password masked. */
static char *
redis_shown(ric_conf_parse_t *cf, const char *a)
{
    const char *auth = a + 8, *slash = strchr(auth, '/'), *at, *colon;
    size_t alen = slash ? (size_t) (slash - auth) : strlen(auth);
    char *out;

    at = memrchr(auth, '@', alen);
    if (at == NULL) {
        return ric_pstrdup(cf->pool, a);
    }
    colon = memchr(auth, ':', (size_t) (at - auth));
    out = ric_palloc(cf->pool, strlen(a) + 8);
    snprintf(out, strlen(a) + 8, "redis://%.*s:***%s", colon ? (int) (colon - auth) : 0, auth,
             at);
    return out;
}

/* The part of "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]" after the scheme, resolved now
 * (the worker's loop must never wait on a resolver). NULL or a reason. */
static const char *
parse_redis(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, ric_idem_store_conf_t *sc,
            const char *rest)
{
    struct addrinfo hints, *res;
    const char *slash = strchr(rest, '/'), *colon, *at;
    char host[256], port[16] = "6379";
    int64_t n;
    size_t hlen;
    int rc;

    /* [[USER]:PASSWORD@]: the credentials, percent-decoded */
    hlen = slash ? (size_t) (slash - rest) : strlen(rest);
    at = memrchr(rest, '@', hlen);
    if (at != NULL) {
        colon = memchr(rest, ':', (size_t) (at - rest));
        if (colon != NULL) {
            sc->user = colon > rest ? percent_decode(cf, rest, (size_t) (colon - rest)) : NULL;
            sc->password = percent_decode(cf, colon + 1, (size_t) (at - colon - 1));
        } else {
            sc->password = percent_decode(cf, rest, (size_t) (at - rest));
        }
        if (sc->password == NULL || sc->password[0] == '\0') {
            goto bad;
        }
        rest = at + 1;
        slash = strchr(rest, '/');
    }
    hlen = slash ? (size_t) (slash - rest) : strlen(rest);
    colon = memchr(rest, ':', hlen);
    if (colon != NULL) {
        if ((size_t) (rest + hlen - colon - 1) >= sizeof(port) || colon + 1 == rest + hlen) {
            goto bad;
        }
        memcpy(port, colon + 1, (size_t) (rest + hlen - colon - 1));
        port[rest + hlen - colon - 1] = '\0';
        hlen = (size_t) (colon - rest);
    }
    if (hlen == 0 || hlen >= sizeof(host) || ric_conf_parse_number(port, &n) != RIC_OK
        || n < 1 || n > 65535) {
        goto bad;
    }
    memcpy(host, rest, hlen);
    host[hlen] = '\0';
    sc->port = (int) n;
    if (slash != NULL && slash[1] != '\0') {
        if (ric_conf_parse_number(slash + 1, &n) != RIC_OK || n > 1000000) {
            goto bad;
        }
        sc->db = (int) n;
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if ((rc = getaddrinfo(host, port, &hints, &res)) != 0) {
        return ric_conf_reason(cf, "host not found in \"%s\" of \"%s\": %s", sc->spec,
                               cmd->name, gai_strerror(rc));
    }
    if (res->ai_family == AF_INET6) {
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *) res->ai_addr)->sin6_addr, sc->addr,
                  sizeof(sc->addr));
    } else {
        inet_ntop(AF_INET, &((struct sockaddr_in *) res->ai_addr)->sin_addr, sc->addr,
                  sizeof(sc->addr));
    }
    freeaddrinfo(res);
    sc->host = ric_pstrdup(cf->pool, host);
    return NULL;
bad:
    return ric_conf_reason(cf, "invalid \"%s\" in \"%s\": expected "
                           "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]", sc->spec, cmd->name);
}

/* idempotency_store off | lmdb:PATH [size=SIZE] | redis://[[USER]:PASSWORD@]HOST[:PORT][/DB].
 * Routes naming the same store share it; an LMDB file is opened now, so
 * a path that cannot be used is this line's error. */
static const char *
set_idempotency_store(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    ric_http_conf_t *http = cf->conf->http;
    ric_idem_store_conf_t *sc, *same;
    const char *dup = ref_duplicate(cf, cmd), *a = cf->args[1], *reason;
    char err[1024];
    int64_t size = 256LL << 20;

    (void) conf;
    if (dup != NULL) {
        return dup;
    }
    sc = ric_pcalloc(cf->pool, sizeof(*sc));
    sc->file = cf->file;
    sc->line = cf->line;
    if (strcmp(a, "off") == 0) {
        if (cf->nargs > 2) {
            return ric_conf_reason(cf, "\"%s off\" takes no options", cmd->name);
        }
        sc->kind = RIC_IDEM_STORE_OFF;
        *(ric_idem_store_conf_t **) ref_at(cf, cmd) = sc;
        return NULL;
    }
    if (strncmp(a, "lmdb:", 5) == 0 && a[5] != '\0') {
        sc->kind = RIC_IDEM_STORE_LMDB;
        sc->ops = &ric_idem_lmdb_ops;
        sc->path = ric_conf_full_path(cf->pool, cf->conf->prefix, a + 5);
        if (cf->nargs > 2) {
            if (strncmp(cf->args[2], "size=", 5) != 0
                || ric_conf_parse_size(cf->args[2] + 5, &size) != RIC_OK || size < 1024 * 1024) {
                return ric_conf_reason(cf, "invalid \"%s\" in \"%s\": expected size=SIZE of at "
                                       "least 1m", cf->args[2], cmd->name);
            }
        }
        sc->map_size = size;
        sc->spec = ric_pstrdup(cf->pool, a);
    } else if (strncmp(a, "redis://", 8) == 0) {
        if (cf->nargs > 2) {
            return ric_conf_reason(cf, "a redis:// store takes no options: \"%s\"", cf->args[2]);
        }
        sc->kind = RIC_IDEM_STORE_REDIS;
        sc->ops = &ric_idem_redis_ops;
        sc->spec = redis_shown(cf, a);
        if ((reason = parse_redis(cf, cmd, sc, a + 8)) != NULL) {
            return reason;
        }
    } else {
        return ric_conf_reason(cf, "invalid value \"%s\" in \"%s\": expected off, lmdb:PATH or "
                               "redis://HOST:PORT[/DB]", a, cmd->name);
    }
    for (same = http->idem_stores; same; same = same->next) {
        if (same->kind != sc->kind) {
            continue;
        }
        if (sc->kind == RIC_IDEM_STORE_LMDB
                ? strcmp(same->path, sc->path) == 0
                : strcmp(same->spec, sc->spec) == 0
                      && strcmp(same->password ? same->password : "",
                                sc->password ? sc->password : "") == 0) {
            if (sc->kind == RIC_IDEM_STORE_LMDB && same->map_size != sc->map_size) {
                return ric_conf_reason(cf, "\"%s\" is named with another size= in %s:%d", a,
                                       same->file, same->line);
            }
            *(ric_idem_store_conf_t **) ref_at(cf, cmd) = same;
            return NULL;
        }
    }
    if (ric_idem_store_check(sc, err, sizeof(err)) != RIC_OK) {
        return ric_conf_reason(cf, "idempotency store \"%s\": %s", a, err);
    }
    sc->next = http->idem_stores;
    http->idem_stores = sc;
    *(ric_idem_store_conf_t **) ref_at(cf, cmd) = sc;
    return NULL;
}

/* A script that reads res:body() or res:json() on a location that reads no
 * body for classify gets nil there: said when the config is read (ricochet
 * -t too), naming the directive. */
static void
warn_body_max(const ric_location_conf_t *l)
{
    const ric_script_t *sc = l->refs.script;
    char buf[65536];
    size_t n;
    FILE *f;

    if (sc == NULL || l->settings.classify_body_max != 0 || l->proxy_pass == NULL) {
        return;
    }
    f = fopen(sc->path, "rb");
    if (f == NULL) {
        return;
    }
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    if (strstr(buf, "res:body(") != NULL || strstr(buf, "res:json(") != NULL) {
        fprintf(stderr, "ricochet: [warn] %s:%d: location \"%s\" has no classify_body_max, so the "
                "res:body() and res:json() of its script %s are nil (add, say, "
                "\"classify_body_max 4k;\")\n", l->file, l->line, l->path, sc->path);
    }
}

static const char *
set_store_recover(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    static const conf_word_t words[] = {
        { "fail", RIC_IDEM_RECOVER_FAIL }, { "rename", RIC_IDEM_RECOVER_RENAME }, { NULL, 0 }
    };

    return set_word(cf, cmd, conf, words, "it must be \"fail\" or \"rename\"");
}

/* A damaged LMDB file (ric_idem_lmdb_verify) is an error of the line that
 * names it, unless idempotency_store_recover rename has the master move it
 * aside at start. */
static const char *
check_idem_stores(ric_conf_parse_t *cf)
{
    const ric_http_conf_t *http = cf->conf->http;
    const ric_idem_store_conf_t *sc;

    if (http->settings.idempotency_store_recover == RIC_IDEM_RECOVER_RENAME) {
        return NULL;
    }
    for (sc = http->idem_stores; sc; sc = sc->next) {
        if (sc->kind == RIC_IDEM_STORE_LMDB && sc->damaged[0] != '\0') {
            return ric_conf_reason(cf, "%s:%d: idempotency store \"%s\" is damaged: %s; move it "
                                   "aside (mv %s %s.damaged) to start with an empty store, whose "
                                   "keys can all run again, or set \"idempotency_store_recover "
                                   "rename\" to have that done at start", sc->file, sc->line,
                                   sc->spec, sc->damaged, sc->path, sc->path);
        }
    }
    return NULL;
}

static const char *
set_store_failure(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    static const conf_word_t words[] = {
        { "closed", RIC_IDEM_FAIL_CLOSED }, { "open", RIC_IDEM_FAIL_OPEN }, { NULL, 0 }
    };

    return set_word(cf, cmd, conf, words, "it must be \"closed\" or \"open\"");
}

static const char *
set_retry_on(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    ric_retry_on_t *on;
    const char *bad;

    (void) conf;
    if (ref_duplicate(cf, cmd) != NULL) {
        return cf->reason;
    }
    on = ric_pcalloc(cf->pool, sizeof(*on));
    bad = ric_retry_on_parse(on, cf->args + 1, cf->nargs - 1);
    if (bad != NULL) {
        return ric_conf_reason(cf, "invalid value \"%s\" in \"%s\": expected connect_error, "
                               "reset, timeout, bad_response, 4xx, 5xx or a status from 100 "
                               "to 599", bad, cmd->name);
    }
    *(ric_retry_on_t **) ref_at(cf, cmd) = on;
    return NULL;
}

/* idempotency_store_status CODE|4xx|5xx ...: answers with these statuses
 * are not kept for their key (it is released, as after a 5xx). The
 * statuses a client must be able to send again with the same key, every
 * 5xx, 408, 409, 425 and 429, always are. */
static const char *
set_idempotency_store_status(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    static char *always[] = { "5xx", "408", "409", "425", "429" };
    ric_retry_on_t *on, base;
    const char *bad;
    size_t i;

    (void) conf;
    if (ref_duplicate(cf, cmd) != NULL) {
        return cf->reason;
    }
    on = ric_pcalloc(cf->pool, sizeof(*on));
    bad = ric_retry_on_parse(on, cf->args + 1, cf->nargs - 1);
    for (i = 1; bad == NULL && on->classes != 0 && i < (size_t) cf->nargs; i++) {
        /* a class word is retry_on's, not a status: name which one */
        if (ric_retry_on_parse(&base, cf->args + i, 1) == NULL && base.classes != 0) {
            bad = cf->args[i];
        }
    }
    if (bad != NULL) {
        return ric_conf_reason(cf, "invalid value \"%s\" in \"%s\": expected 4xx, 5xx or a "
                               "status from 100 to 599", bad, cmd->name);
    }
    ric_retry_on_parse(&base, always, (int) ric_nelems(always));
    for (i = 0; i < ric_nelems(on->statuses); i++) {
        on->statuses[i] |= base.statuses[i];
    }
    *(ric_retry_on_t **) ref_at(cf, cmd) = on;
    return NULL;
}

static const char *set_header_name(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf);

/* idempotency_scope off | $remote_addr | FIELD: what of the client goes
 * into the record key beside its idempotency key. */
static const char *
set_idempotency_scope(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    const char *a = cf->args[1];

    if (strcmp(a, "off") == 0 || strcmp(a, "$remote_addr") == 0) {
        if (ref_duplicate(cf, cmd) != NULL) {
            return cf->reason;
        }
        *ref_at(cf, cmd) = ric_pstrdup(cf->pool, a[0] == 'o' ? "" : a);
        return NULL;
    }
    if (a[0] == '$') {
        return ric_conf_reason(cf, "invalid value \"%s\" in \"%s\": expected off, $remote_addr "
                               "or a header name such as Authorization or X-Api-Key", a, cmd->name);
    }
    return set_header_name(cf, cmd, conf);
}

/* A header name directive; "off" (where allowed) is stored as "". */
static const char *
set_header_name(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd, void *conf)
{
    const char *p;

    (void) conf;
    if (ref_duplicate(cf, cmd) != NULL) {
        return cf->reason;
    }
    if (strcmp(cf->args[1], "off") == 0 && strcmp(cmd->name, "retry_attempt_header") == 0) {
        *ref_at(cf, cmd) = ric_pstrdup(cf->pool, "");
        return NULL;
    }
    for (p = cf->args[1]; *p; p++) {
        if (!is_var_char(*p) && !strchr("!#$%&'*+-.^`|~", *p)) {
            break;
        }
    }
    if (*p != '\0' || cf->args[1][0] == '\0') {
        return ric_conf_reason(cf, "invalid header name \"%s\" in \"%s\"", cf->args[1],
                               cmd->name);
    }
    *ref_at(cf, cmd) = ric_pstrdup(cf->pool, cf->args[1]);
    return NULL;
}

const ric_conf_cmd_t ric_conf_commands[] = {
    { "worker_processes", RIC_CONF_MAIN, RIC_CONF_TAKE1, set_worker_processes,
      MAIN(worker_processes), "auto",
      "number of worker processes; \"auto\" means one per CPU core" },
    { "worker_connections", RIC_CONF_MAIN, RIC_CONF_TAKE1, set_num, MAIN(worker_connections),
      "1024", "most client connections one worker holds open at once" },
    { "worker_shutdown_timeout", RIC_CONF_MAIN, RIC_CONF_TAKE1, set_msec,
      MAIN(worker_shutdown_timeout), "60s",
      "how long a gracefully stopping worker waits for in-flight requests" },
    { "worker_watchdog", RIC_CONF_MAIN, RIC_CONF_TAKE1, set_watchdog, MAIN(worker_watchdog), "5s",
      "off | TIME: a worker whose event loop has not turned this long is killed and replaced" },
    { "daemon", RIC_CONF_MAIN, RIC_CONF_TAKE1, set_flag, MAIN(daemon), "off",
      "detach from the terminal and run in the background" },
    { "pid", RIC_CONF_MAIN, RIC_CONF_TAKE1, set_pid, RIC_CONF_NO_OFFSET, "off",
      "file the master writes its process id to; used by -s" },
    { "error_log", RIC_CONF_MAIN | RIC_CONF_HTTP, RIC_CONF_TAKE12, set_error_log,
      RIC_CONF_NO_OFFSET, "stderr error",
      "where the error log goes (a file or \"stderr\") and its lowest level" },
    { "include", RIC_CONF_ANY, RIC_CONF_TAKE1, set_include, RIC_CONF_NO_OFFSET, NULL,
      "reads other files (glob patterns allowed) in place of the directive" },
    { "http", RIC_CONF_MAIN, RIC_CONF_NOARGS | RIC_CONF_BLOCK, block_http, RIC_CONF_NO_OFFSET,
      NULL, "the HTTP gateway: servers and upstreams" },
    { "upstream", RIC_CONF_HTTP, RIC_CONF_TAKE1 | RIC_CONF_BLOCK, block_upstream,
      RIC_CONF_NO_OFFSET, NULL, "a named group of upstream servers" },
    { "server", RIC_CONF_UPS, RIC_CONF_1MORE, set_upstream_server, RIC_CONF_NO_OFFSET, NULL,
      "an upstream server: HOST:PORT [weight=N] [max_fails=N] [fail_timeout=T]" },
    { "keepalive", RIC_CONF_UPS, RIC_CONF_TAKE1, set_num, UPS(keepalive), "32",
      "idle connections to the upstream each worker keeps for reuse" },
    { "keepalive_timeout", RIC_CONF_UPS, RIC_CONF_TAKE1, set_msec, UPS(keepalive_timeout),
      "60s", "how long an idle upstream connection is kept" },
    { "server", RIC_CONF_HTTP, RIC_CONF_NOARGS | RIC_CONF_BLOCK, block_server,
      RIC_CONF_NO_OFFSET, NULL, "a virtual server: listen addresses, names and locations" },
    { "listen", RIC_CONF_SRV, RIC_CONF_1MORE, set_listen, RIC_CONF_NO_OFFSET, NULL,
      "ADDRESS:PORT | PORT [default_server]: where the server accepts connections" },
    { "server_name", RIC_CONF_SRV, RIC_CONF_1MORE, set_server_name, RIC_CONF_NO_OFFSET, "\"\"",
      "names the server answers for: exact names and *.suffix wildcards" },
    { "location", RIC_CONF_SRV, RIC_CONF_TAKE12 | RIC_CONF_BLOCK, block_location,
      RIC_CONF_NO_OFFSET, NULL, "[=] PATH: settings for requests whose path matches" },
    { "client_header_timeout", RIC_CONF_HTTP | RIC_CONF_SRV, RIC_CONF_TAKE1, set_msec_positive,
      SETTINGS(client_header_timeout), "60s",
      "time to receive a whole request head; then 408 and the connection closes" },
    { "client_body_timeout", SETTINGS_CTX, RIC_CONF_TAKE1, set_msec_positive,
      SETTINGS(client_body_timeout), "60s",
      "longest pause between two reads of a request body; then 408" },
    { "keepalive_timeout", SETTINGS_CTX, RIC_CONF_TAKE1, set_msec,
      SETTINGS(keepalive_timeout), "75s",
      "how long an idle client connection stays open; 0 turns keep-alive off" },
    { "keepalive_requests", SETTINGS_CTX, RIC_CONF_TAKE1, set_num,
      SETTINGS(keepalive_requests), "1000",
      "requests served on one client connection before it is closed" },
    { "send_timeout", SETTINGS_CTX, RIC_CONF_TAKE1, set_msec_positive, SETTINGS(send_timeout), "60s",
      "longest pause between two writes to a client; then the connection closes" },
    { "client_max_body_size", SETTINGS_CTX, RIC_CONF_TAKE1, set_size,
      SETTINGS(client_max_body_size), "1m",
      "largest request body accepted; larger gets 413; 0 means no limit" },
    { "client_body_buffer_size", SETTINGS_CTX, RIC_CONF_TAKE1, set_size,
      SETTINGS(client_body_buffer_size), "64k",
      "request body bytes kept in memory; the rest goes to a temp file" },
    { "client_body_temp_path", SETTINGS_CTX, RIC_CONF_TAKE1 | RIC_CONF_REF, set_path,
      REFS(body_temp_path), "/tmp", "directory for request bodies larger than the buffer" },
    { "classify_body_max", SETTINGS_CTX, RIC_CONF_TAKE1, set_classify_body_max,
      SETTINGS(classify_body_max), "0",
      "response bodies up to this size are read for the script's classify (res:body())" },
    { "lua_shared_dict", RIC_CONF_HTTP, RIC_CONF_TAKE2, set_shared_dict, RIC_CONF_NO_OFFSET, NULL,
      "NAME SIZE: a dictionary every worker shares, for route scripts (ricochet.shared)" },
    { "script_timeout", RIC_CONF_HTTP, RIC_CONF_TAKE1, set_msec_positive,
      SETTINGS(script_timeout), "50ms",
      "the longest a route script's hook (or main chunk) may run before it is stopped" },
    { "script_memory_max", RIC_CONF_HTTP, RIC_CONF_TAKE1, set_script_memory,
      SETTINGS(script_memory_max), "64m",
      "the memory of the route scripts' Lua state; past it, the call is stopped" },
    { "script", SETTINGS_CTX, RIC_CONF_TAKE1 | RIC_CONF_REF, set_script, REFS(script), NULL,
      "FILE: the route script (Lua) whose hooks classify, mark idempotent and attach keys" },
    { "proxy_pass", RIC_CONF_LOC, RIC_CONF_TAKE1, set_proxy_pass, RIC_CONF_NO_OFFSET, NULL,
      "http://UPSTREAM | http://HOST:PORT: where the location's requests go" },
    { "proxy_set_header", SETTINGS_CTX, RIC_CONF_TAKE2, set_proxy_set_header,
      RIC_CONF_NO_OFFSET, NULL, "NAME VALUE: a header sent upstream; an empty value drops it" },
    { "proxy_ssl_verify", SETTINGS_CTX, RIC_CONF_TAKE1, set_flag, SETTINGS(proxy_ssl_verify), "on",
      "on: an https upstream's certificate must verify (against proxy_ssl_trusted_certificate)" },
    { "proxy_ssl_trusted_certificate", SETTINGS_CTX, RIC_CONF_TAKE1 | RIC_CONF_REF,
      set_path, REFS(proxy_ssl_trusted_certificate), NULL,
      "FILE: the CA certificates (PEM) an https upstream's certificate must chain to; default: the system's" },
    { "proxy_ssl_server_name", SETTINGS_CTX, RIC_CONF_TAKE1, set_flag,
      SETTINGS(proxy_ssl_server_name), "on", "on: send the upstream's name as SNI" },
    { "proxy_ssl_name", SETTINGS_CTX, RIC_CONF_TAKE1 | RIC_CONF_REF, set_ssl_name,
      REFS(proxy_ssl_name), NULL,
      "NAME: the name sent as SNI and verified; default: the proxy_pass host or upstream name" },
    { "ssl_certificate", RIC_CONF_HTTP | RIC_CONF_SRV, RIC_CONF_TAKE1 | RIC_CONF_REF, set_ssl_file,
      REFS(ssl_certificate), NULL,
      "FILE: the server's certificate chain (PEM, leaf first), for listen ... ssl" },
    { "ssl_certificate_key", RIC_CONF_HTTP | RIC_CONF_SRV, RIC_CONF_TAKE1 | RIC_CONF_REF,
      set_ssl_file, REFS(ssl_certificate_key), NULL,
      "FILE: the private key (PEM, unencrypted) of ssl_certificate" },
    { "ssl_protocols", RIC_CONF_HTTP | RIC_CONF_SRV, RIC_CONF_1MORE, set_ssl_protocols,
      SETTINGS(ssl_protocols), "TLSv1.2 TLSv1.3", "TLS versions clients may use: TLSv1.2 TLSv1.3" },
    { "ssl_ciphers", RIC_CONF_HTTP | RIC_CONF_SRV, RIC_CONF_TAKE1 | RIC_CONF_REF, set_ssl_ciphers,
      REFS(ssl_ciphers), RIC_TLS_DEFAULT_CIPHERS,
      "LIST: TLS 1.2 ciphers (OpenSSL's syntax); TLS 1.3 always uses its own AEAD suites" },
    { "ssl_session_cache", RIC_CONF_HTTP | RIC_CONF_SRV, RIC_CONF_TAKE1, set_ssl_session_cache,
      SETTINGS(ssl_session_cache), "builtin:20480",
      "off | builtin[:N]: sessions each worker keeps to resume by session id" },
    { "ssl_session_timeout", RIC_CONF_HTTP | RIC_CONF_SRV, RIC_CONF_TAKE1, set_msec_positive,
      SETTINGS(ssl_session_timeout), "5m", "how long a session or ticket may be resumed" },
    { "ssl_session_tickets", RIC_CONF_HTTP | RIC_CONF_SRV, RIC_CONF_TAKE1, set_flag,
      SETTINGS(ssl_session_tickets), "on",
      "on: resume by tickets, whose keys every worker shares (made when the config loads)" },
    { "ssl_handshake_timeout", RIC_CONF_HTTP | RIC_CONF_SRV, RIC_CONF_TAKE1, set_msec_positive,
      SETTINGS(ssl_handshake_timeout), "10s",
      "time for a client's whole TLS handshake; then the connection closes" },
    { "proxy_connect_timeout", SETTINGS_CTX, RIC_CONF_TAKE1, set_msec_positive,
      SETTINGS(proxy_connect_timeout), "5s", "time to establish an upstream connection" },
    { "proxy_send_timeout", SETTINGS_CTX, RIC_CONF_TAKE1, set_msec_positive,
      SETTINGS(proxy_send_timeout), "60s",
      "longest pause between two writes of the request to the upstream" },
    { "proxy_read_timeout", SETTINGS_CTX, RIC_CONF_TAKE1, set_msec_positive,
      SETTINGS(proxy_read_timeout), "60s",
      "longest pause between two reads of the upstream's response" },
    { "upstream_drain_max", SETTINGS_CTX, RIC_CONF_TAKE1, set_size,
      SETTINGS(upstream_drain_max), "64k",
      "a response dropped for a retry is read on, beside the retry, when its body is at most this; "
      "0: its connection is closed" },
    { "upstream_drain_timeout", SETTINGS_CTX, RIC_CONF_TAKE1, set_msec_positive,
      SETTINGS(upstream_drain_timeout), "1s",
      "the longest a dropped response's body is read for its connection to be reused" },
    { "access_log", SETTINGS_CTX, RIC_CONF_TAKE1 | RIC_CONF_TAKE2 | RIC_CONF_TAKE3 | RIC_CONF_REF,
      set_access_log, REFS(access_log), "off",
      "FILE | stdout | stderr | off [buffer=SIZE] [flush=TIME]: one JSON line per request" },
    { "admin_listen", RIC_CONF_HTTP, RIC_CONF_TAKE1, set_admin_listen, RIC_CONF_NO_OFFSET, NULL,
      "ADDRESS:PORT of the admin listener: /metrics, /healthz, /readyz, /status" },
    { "admin_allow", RIC_CONF_HTTP, RIC_CONF_1MORE, set_admin_allow, RIC_CONF_NO_OFFSET, NULL,
      "CIDR ...: who may use the admin listener (others get 403); needed off loopback" },
    { "underscores_in_headers", SETTINGS_CTX, RIC_CONF_TAKE1, set_flag,
      SETTINGS(underscores_in_headers), "off",
      "on: forward request header names with '_'; off drops them" },
    { "retries", SETTINGS_CTX, RIC_CONF_TAKE1, set_flag, SETTINGS(retries), "on",
      "the kill switch: off makes every request a single attempt" },
    { "retry_attempts", SETTINGS_CTX, RIC_CONF_TAKE1, set_retry_attempts, SETTINGS(retry_attempts), "5",
      "attempts in total, the first included; 0: bounded by retry_timeout only" },
    { "retry_backoff", SETTINGS_CTX, RIC_CONF_1MORE,
      set_retry_backoff, SETTINGS(retry_backoff_initial), "250ms 5s 2 jitter=full",
      "INITIAL MAX [FACTOR] [jitter=full|equal|none] [adaptive=on|off]: the wait before each retry" },
    { "retry_hedge", SETTINGS_CTX, RIC_CONF_TAKE1, set_retry_hedge, SETTINGS(retry_hedge), "off",
      "off | auto | TIME: a second attempt to another server when the first has no answer after "
      "TIME (auto: the upstream's p95); the first answer wins" },
    { "retry_timeout", SETTINGS_CTX, RIC_CONF_TAKE1, set_msec_positive, SETTINGS(retry_timeout), "30s",
      "the whole request's deadline: every attempt and every wait" },
    { "per_try_timeout", SETTINGS_CTX, RIC_CONF_TAKE1, set_per_try_timeout,
      SETTINGS(per_try_timeout),
      "10s", "one attempt, until its response head" },
    { "retry_on", SETTINGS_CTX, RIC_CONF_1MORE | RIC_CONF_REF, set_retry_on, REFS(retry_on),
      "connect_error reset timeout 502 503 504 429",
      "outcomes and statuses worth a retry" },
    { "retry_after_max", SETTINGS_CTX, RIC_CONF_TAKE1, set_msec, SETTINGS(retry_after_max),
      "30s", "the longest Retry-After honoured; longer ones fall back to backoff" },
    { "retry_budget", SETTINGS_CTX | RIC_CONF_UPS,
      RIC_CONF_TAKE1 | RIC_CONF_TAKE2 | RIC_CONF_TAKE3 | RIC_CONF_REF, set_retry_budget,
      REFS(retry_budget), "adaptive",
      "adaptive [max=N] [wait=T] | RATIO [min=N/s] | off: an upstream's retry budget, shared by all workers" },
    { "retry_body_max", SETTINGS_CTX, RIC_CONF_TAKE1, set_size, SETTINGS(retry_body_max), "1m",
      "largest request body kept for replay; larger ones get one attempt" },
    { "client_deadline_header", SETTINGS_CTX, RIC_CONF_TAKE1 | RIC_CONF_REF, set_header_name,
      REFS(client_deadline_header), "X-Request-Timeout",
      "the client's own time budget (ms, or 1.5s); the rest is sent upstream in it" },
    { "retry_attempt_header", SETTINGS_CTX, RIC_CONF_TAKE1 | RIC_CONF_REF, set_header_name,
      REFS(retry_attempt_header), "X-Ricochet-Attempt",
      "NAME | off: the attempt number sent upstream" },
    { "idempotency_key", SETTINGS_CTX, RIC_CONF_TAKE1, set_idempotency_key,
      SETTINGS(idempotency_key), "off",
      "off | on | auto: the route's upstream honours idempotency keys" },
    { "idempotency_key_header", SETTINGS_CTX, RIC_CONF_TAKE1 | RIC_CONF_REF, set_header_name,
      REFS(idempotency_key_header), "Idempotency-Key", "the idempotency key's header" },
    { "idempotency_store", SETTINGS_CTX, RIC_CONF_TAKE12 | RIC_CONF_REF, set_idempotency_store,
      REFS(idempotency_store), "off",
      "off | lmdb:PATH [size=SIZE] | redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]: dedupe keyed requests at the gateway" },
    { "idempotency_ttl", SETTINGS_CTX, RIC_CONF_TAKE1, set_msec_positive,
      SETTINGS(idempotency_ttl), "24h", "how long a stored answer is replayed for its key" },
    { "idempotency_lock_ttl", SETTINGS_CTX, RIC_CONF_TAKE1, set_msec_positive,
      SETTINGS(idempotency_lock_ttl), "60s",
      "how long a key in flight stays locked if its gateway dies (never below retry_timeout)" },
    { "idempotency_max_body", SETTINGS_CTX, RIC_CONF_TAKE1, set_size,
      SETTINGS(idempotency_max_body), "1m",
      "largest answer body stored for replay; a larger answer is kept as done, not replayable" },
    { "idempotency_required", SETTINGS_CTX, RIC_CONF_TAKE1, set_flag,
      SETTINGS(idempotency_required), "off",
      "on: 400 for a request of an unsafe method without an idempotency key" },
    { "idempotency_scope", SETTINGS_CTX, RIC_CONF_TAKE1 | RIC_CONF_REF, set_idempotency_scope,
      REFS(idempotency_scope), "Authorization",
      "off | $remote_addr | FIELD: the client part of a key, so clients never share answers" },
    { "idempotency_store_status", SETTINGS_CTX, RIC_CONF_1MORE | RIC_CONF_REF,
      set_idempotency_store_status, REFS(idempotency_release), "5xx 408 409 425 429",
      "statuses whose answers are not kept: the key is released (these five always are)" },
    { "idempotency_store_failure", SETTINGS_CTX, RIC_CONF_TAKE1, set_store_failure,
      SETTINGS(idempotency_store_failure), "closed",
      "closed | open: when the store is unreachable, answer 503, or pass on without dedupe" },
    { "idempotency_store_recover", RIC_CONF_HTTP, RIC_CONF_TAKE1, set_store_recover,
      SETTINGS(idempotency_store_recover), "fail",
      "fail | rename: a damaged LMDB file stops the start, or is moved aside" },
    { "idempotency_sync", SETTINGS_CTX, RIC_CONF_TAKE1, set_flag, SETTINGS(idempotency_sync),
      "off", "on: an LMDB claim is on disk before the request goes upstream" },
    { NULL, 0, 0, NULL, 0, NULL, NULL }
};

int
ric_conf_apply_defaults(ric_conf_parse_t *cf, unsigned ctx, void *conf)
{
    const ric_conf_cmd_t *cmd;
    char *name;
    const char *reason;

    char *copy, *word, *save;
    unsigned saved_ctx = cf->ctx;

    for (cmd = ric_conf_commands; cmd->name != NULL; cmd++) {
        if (!(cmd->contexts & ctx) || cmd->offset == RIC_CONF_NO_OFFSET
            || cmd->default_value == NULL) {
            continue;
        }
        if (cmd->arity & RIC_CONF_REF) {
            /* refs live beside the settings of the http level */
            if (ctx != RIC_CONF_HTTP
                || *(void **) ((char *) &cf->conf->http->refs + cmd->offset) != NULL) {
                continue;
            }
        } else if (*field_at(conf, cmd) != RIC_CONF_UNSET) {
            continue;
        }
        /* defaults go through the same parser as the config text, so the
         * documented value and the effective one cannot drift apart */
        name = (char *) cmd->name;
        cf->args[0] = name;
        cf->nargs = 1;
        copy = ric_pstrdup(cf->pool, cmd->default_value);
        for (word = strtok_r(copy, " ", &save); word && cf->nargs < RIC_CONF_MAX_ARGS;
             word = strtok_r(NULL, " ", &save)) {
            cf->args[cf->nargs++] = word;
        }
        cf->ctx = ctx;
        cf->applying_defaults = 1;
        reason = cmd->set(cf, cmd, conf);
        cf->applying_defaults = 0;
        cf->ctx = saved_ctx;
        if (reason != NULL) {
            snprintf(cf->err, cf->errlen, "default of \"%s\": %s", cmd->name, reason);
            return RIC_ERROR;
        }
    }
    return RIC_OK;
}

static void
settings_merge(ric_http_settings_t *child, const ric_http_settings_t *parent)
{
    int64_t *c = (int64_t *) child;
    const int64_t *p = (const int64_t *) parent;
    size_t i;

    for (i = 0; i < sizeof(*child) / sizeof(int64_t); i++) {
        if (c[i] == RIC_CONF_UNSET) {
            c[i] = p[i];
        }
    }
}

static int
same_addr(const struct sockaddr_storage *a, socklen_t alen, const struct sockaddr_storage *b,
          socklen_t blen)
{
    return alen == blen && memcmp(a, b, alen) == 0;
}

/* A name another server on the address already has: which server a Host or
 * an SNI name picks must not depend on the order of the file. */
static const char *
name_taken(ric_conf_parse_t *cf, const ric_listener_t *ls, const ric_listen_t *l)
{
    const ric_listen_t *o;
    int i, j;

    for (o = ls->listens; o; o = o->addr_next) {
        if (o->server == l->server) {
            continue;
        }
        for (i = 0; i < l->server->nnames; i++) {
            for (j = 0; j < o->server->nnames; j++) {
                if (l->server->names[i][0] != '\0'
                    && strcmp(l->server->names[i], o->server->names[j]) == 0) {
                    return ric_conf_reason(cf, "%s:%d: server name \"%s\" on %s is also the "
                                           "name of the server at %s:%d: one name, one server",
                                           l->file, l->line, l->server->names[i], l->text,
                                           o->server->file, o->server->line);
                }
            }
        }
    }
    return NULL;
}

#define ADMIN_HEAD_MS 10000

static int
loopback(const struct sockaddr_storage *ss)
{
    static const u_char v6_loopback[16] = { [15] = 1 };

    if (ss->ss_family == AF_INET) {
        return (ntohl(((const struct sockaddr_in *) ss)->sin_addr.s_addr) >> 24) == 127;
    }
    return ss->ss_family == AF_INET6
           && memcmp(&((const struct sockaddr_in6 *) ss)->sin6_addr, v6_loopback, 16) == 0;
}

/* The admin listener: an address of its own, and off loopback only with
 * admin_allow, so the page is never open to the world by accident. */
static const char *
admin_listener(ric_conf_parse_t *cf)
{
    ric_conf_t *c = cf->conf;
    ric_server_conf_t *admin = c->http->admin;
    ric_listen_t *l = admin ? admin->listens : NULL;
    ric_listener_t *ls, **tail;

    if (admin == NULL) {
        if (c->http->admin_allow != NULL) {
            return ric_conf_reason(cf, "%s:%d: \"admin_allow\" without \"admin_listen\"",
                                   c->http->admin_allow_file, c->http->admin_allow_line);
        }
        return NULL;
    }
    for (tail = &c->listeners; *tail; tail = &(*tail)->next) {
        ls = *tail;
        if (same_addr(&ls->addr, ls->addrlen, &l->addr, l->addrlen)) {
            return ric_conf_reason(cf, "%s:%d: admin_listen %s is also the address of the listen "
                                   "at %s:%d: the admin listener needs one of its own", l->file,
                                   l->line, l->text, ls->listens->file, ls->listens->line);
        }
    }
    if (!loopback(&l->addr) && c->http->admin_allow == NULL) {
        return ric_conf_reason(cf, "%s:%d: admin_listen %s is not a loopback address: add "
                               "\"admin_allow CIDR ...;\" to say who may read the metrics and "
                               "the status page", l->file, l->line, l->text);
    }
    ls = ric_pcalloc(cf->pool, sizeof(*ls));
    memcpy(&ls->addr, &l->addr, l->addrlen);
    ls->addrlen = l->addrlen;
    ls->text = l->text;
    ls->fd = -1;
    ls->default_server = admin;
    ls->listens = l;
    ls->admin = 1;
    *tail = ls;
    return NULL;
}

/* Groups every server's listens into one listener per address, picking the
 * default server of each. */
static const char *
build_listeners(ric_conf_parse_t *cf)
{
    ric_conf_t *c = cf->conf;
    ric_server_conf_t *s;
    ric_listen_t *l;
    ric_listener_t *ls, **tail;

    for (s = c->http->servers; s; s = s->next) {
        for (l = s->listens; l; l = l->next) {
            for (ls = c->listeners; ls; ls = ls->next) {
                if (same_addr(&ls->addr, ls->addrlen, &l->addr, l->addrlen)) {
                    break;
                }
            }
            if (ls == NULL) {
                ls = ric_pcalloc(cf->pool, sizeof(*ls));
                memcpy(&ls->addr, &l->addr, l->addrlen);
                ls->addrlen = l->addrlen;
                ls->text = l->text;
                ls->fd = -1;
                ls->default_server = s;
                ls->ssl = l->ssl;
                for (tail = &c->listeners; *tail; tail = &(*tail)->next) {
                }
                *tail = ls;
            } else if (ls->ssl != l->ssl) {
                return ric_conf_reason(cf, "%s:%d: listen %s is %s here and %s in %s:%d: an "
                                       "address is one or the other", l->file, l->line, l->text,
                                       l->ssl ? "ssl" : "plain", ls->ssl ? "ssl" : "plain",
                                       ls->listens->file, ls->listens->line);
            }
            if (name_taken(cf, ls, l) != NULL) {
                return cf->reason;
            }
            if (ls->listens != NULL && l->default_server) {
                ric_listen_t *o;
                for (o = ls->listens; o; o = o->addr_next) {
                    if (o->default_server) {
                        return ric_conf_reason(cf, "%s:%d: a duplicate default server for %s",
                                               l->file, l->line, l->text);
                    }
                }
                ls->default_server = s;
            }
            l->addr_next = ls->listens;
            ls->listens = l;
        }
    }
    return admin_listener(cf);
}

static void
refs_merge(ric_http_refs_t *child, const ric_http_refs_t *parent)
{
    void **c = (void **) child;
    void *const *p = (void *const *) parent;
    size_t i;

    /* every field is a pointer, NULL when the level did not set it */
    for (i = 0; i < sizeof(*child) / sizeof(void *); i++) {
        if (c[i] == NULL) {
            c[i] = p[i];
        }
    }
}

/* A per-try timeout longer than the whole deadline can never run out. */
static const char *
check_retry_settings(ric_conf_parse_t *cf, const ric_http_settings_t *s, const char *file,
                     int line)
{
    /* only when both were chosen: the default per-try time is simply cut
     * to what is left of a shorter deadline */
    if (s->per_try_timeout_set == 1 && s->per_try_timeout > s->retry_timeout) {
        return ric_conf_reason(cf, "%s:%d: per_try_timeout (%lldms) is above retry_timeout "
                               "(%lldms)", file, line, (long long) s->per_try_timeout,
                               (long long) s->retry_timeout);
    }
    if (s->retry_hedge > 0 && s->retry_hedge >= ric_min(s->per_try_timeout, s->retry_timeout)) {
        return ric_conf_reason(cf, "%s:%d: retry_hedge (%lldms) is not below per_try_timeout "
                               "(%lldms) and retry_timeout (%lldms): the hedge would never be sent",
                               file, line, (long long) s->retry_hedge,
                               (long long) s->per_try_timeout, (long long) s->retry_timeout);
    }
    return NULL;
}

/* Resolves an upstream server's host into one entry per address (a name
 * with several addresses becomes several servers, as in nginx). Runs at load
 * time, never in a worker's loop. */
static const char *
resolve_server(ric_conf_parse_t *cf, ric_upstream_conf_t *u, ric_upstream_server_t *s)
{
    struct addrinfo hints, *res, *ai;
    ric_upstream_server_t *last = s, *o, *copy;
    char ip[INET6_ADDRSTRLEN];
    int rc, first = 1;

    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | AI_ADDRCONFIG;
    rc = getaddrinfo(s->host, s->port, &hints, &res);
    if (rc == EAI_NONAME || rc == EAI_ADDRFAMILY) {
        /* AI_ADDRCONFIG hides ::1 on a host without IPv6 routes: try again */
        hints.ai_flags &= ~AI_ADDRCONFIG;
        rc = getaddrinfo(s->host, s->port, &hints, &res);
    }
    if (rc != 0) {
        return ric_conf_reason(cf, "%s:%d: host not found in upstream \"%s\": %s", s->file,
                               s->line, s->text, gai_strerror(rc));
    }
    for (ai = res; ai; ai = ai->ai_next) {
        for (o = s; o != last->next; o = o->next) {
            if (!first && o->addrlen == ai->ai_addrlen
                && memcmp(&o->addr, ai->ai_addr, ai->ai_addrlen) == 0) {
                break;
            }
        }
        if (!first && o != last->next) {
            continue; /* the same address twice */
        }
        if (first) {
            copy = s;
        } else {
            copy = ric_palloc(cf->pool, sizeof(*copy));
            *copy = *s;
            copy->next = last->next;
            last->next = copy;
            last = copy;
            u->nservers++;
        }
        memcpy(&copy->addr, ai->ai_addr, ai->ai_addrlen);
        copy->addrlen = ai->ai_addrlen;
        if (ai->ai_family == AF_INET6) {
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *) ai->ai_addr)->sin6_addr, ip,
                      sizeof(ip));
            copy->addr_text = ric_pstrdup(cf->pool, ric_conf_reason(cf, "[%s]:%s", ip, s->port));
        } else {
            inet_ntop(AF_INET, &((struct sockaddr_in *) ai->ai_addr)->sin_addr, ip, sizeof(ip));
            copy->addr_text = ric_pstrdup(cf->pool, ric_conf_reason(cf, "%s:%s", ip, s->port));
        }
        first = 0;
    }
    freeaddrinfo(res);
    return NULL;
}

/* Points the location at the upstream its proxy_pass names; "host:port"
 * that names no upstream block becomes an upstream of its own. */
static const char *
link_proxy_pass(ric_conf_parse_t *cf, ric_location_conf_t *l)
{
    ric_http_conf_t *http = cf->conf->http;
    ric_upstream_conf_t *u, **tail;
    ric_upstream_server_t *s;
    const char *reason;

    for (u = http->upstreams; u; u = u->next) {
        if (strcmp(u->name, l->proxy_pass) == 0 && (!u->implicit || u->tls == l->proxy_tls)) {
            l->upstream = u; /* a named upstream, or one made earlier for the same address */
            return NULL;
        }
    }
    u = ric_pcalloc(cf->pool, sizeof(*u));
    u->name = l->proxy_pass;
    u->host_header = l->proxy_pass;
    u->implicit = 1;
    u->tls = l->proxy_tls;
    u->keepalive = RIC_CONF_UNSET;
    u->keepalive_timeout = RIC_CONF_UNSET;
    u->file = l->proxy_pass_file;
    u->line = l->proxy_pass_line;
    s = ric_pcalloc(cf->pool, sizeof(*s));
    cf->file = l->proxy_pass_file;
    cf->directive_line = l->proxy_pass_line;
    reason = split_host_port(cf, l->proxy_pass, l->proxy_tls ? "443" : "80", &s->host, &s->port);
    if (reason != NULL) {
        return ric_conf_reason(cf, "%s:%d: %s", l->proxy_pass_file, l->proxy_pass_line,
                               ric_pstrdup(cf->pool, reason));
    }
    if (s->host == NULL) {
        return ric_conf_reason(cf, "%s:%d: invalid URL \"%s%s\" in \"proxy_pass\"",
                               l->proxy_pass_file, l->proxy_pass_line,
                               l->proxy_tls ? "https://" : "http://", l->proxy_pass);
    }
    s->text = l->proxy_pass;
    s->weight = 1;
    s->max_fails = 1;
    s->fail_timeout = 10000;
    s->file = l->proxy_pass_file;
    s->line = l->proxy_pass_line;
    u->servers = s;
    u->nservers = 1;
    if (ric_conf_apply_defaults(cf, RIC_CONF_UPS, u) != RIC_OK) {
        return ric_conf_reported;
    }
    for (tail = &http->upstreams; *tail; tail = &(*tail)->next) {
    }
    *tail = u;
    l->upstream = u;
    return NULL;
}

/* Where a budget rule came from, for messages: its directive, or the
 * location that inherited the default. */
static void
budget_origin(const ric_budget_conf_t *b, const ric_location_conf_t *l, const char **file,
              int *line)
{
    *file = b->file ? b->file : l->file;
    *line = b->file ? b->line : l->line;
}

/* A budget has one owner, its upstream: the upstream block's retry_budget,
 * or else the one its locations inherit, which must then be the same rule
 * in every location that proxies to it. A location that sets a rule of its
 * own against the upstream block's, or two locations that disagree, are
 * errors at the line that sets the conflicting rule. */
static const char *
resolve_budgets(ric_conf_parse_t *cf)
{
    ric_http_conf_t *http = cf->conf->http;
    ric_upstream_conf_t *u;
    ric_server_conf_t *s;
    ric_location_conf_t *l, *first;
    const ric_budget_conf_t *b;
    const char *file, *ofile;
    int line, oline;
    char a[64], o[64];

    for (u = http->upstreams; u; u = u->next) {
        u->budget = u->retry_budget;
        first = NULL;
        for (s = http->servers; s; s = s->next) {
            for (l = s->locations; l; l = l->next) {
                if (l->upstream != u) {
                    continue;
                }
                b = l->refs.retry_budget;
                if (u->retry_budget != NULL) {
                    budget_origin(b, l, &file, &line);
                    if (b->ctx != RIC_CONF_HTTP && !ric_budget_same_rule(b, u->retry_budget)) {
                        return ric_conf_reason(cf, "%s:%d: \"retry_budget %s\" conflicts with "
                                               "\"retry_budget %s\" of upstream \"%s\" at %s:%d: "
                                               "a budget belongs to its upstream; set it once",
                                               file, line, ric_budget_rule_text(b, a, sizeof(a)),
                                               ric_budget_rule_text(u->retry_budget, o, sizeof(o)),
                                               u->name, u->retry_budget->file,
                                               u->retry_budget->line);
                    }
                    continue;
                }
                if (first == NULL) {
                    first = l;
                    u->budget = b;
                    continue;
                }
                if (!ric_budget_same_rule(b, u->budget)) {
                    const ric_budget_conf_t *x = b, *y = u->budget;
                    const ric_location_conf_t *lx = l, *ly = first;
                    if (x->ctx == RIC_CONF_HTTP) { /* report the line that departs */
                        x = u->budget, y = b, lx = first, ly = l;
                    }
                    budget_origin(x, lx, &file, &line);
                    budget_origin(y, ly, &ofile, &oline);
                    return ric_conf_reason(cf, "%s:%d: \"retry_budget %s\" for upstream \"%s\" "
                                           "differs from %s\"retry_budget %s\" %s %s:%d: locations "
                                           "that share an upstream share its budget; set "
                                           "retry_budget once, in %s", file, line,
                                           ric_budget_rule_text(x, a, sizeof(a)), u->name,
                                           y->file ? "" : "the default ",
                                           ric_budget_rule_text(y, o, sizeof(o)),
                                           y->file ? "at" : "that the location inherits at",
                                           ofile, oline,
                                           u->implicit ? "an upstream block for that address "
                                                         "(upstream NAME { server ADDRESS; "
                                                         "retry_budget ...; })"
                                                       : "its upstream block");
                }
            }
        }
        if (u->budget == NULL) {
            u->budget = http->refs.retry_budget; /* no location uses it */
        }
    }
    return NULL;
}

static void
free_ssl_ctx(void *ctx)
{
    SSL_CTX_free(ctx);
}

/* The TLS of each upstream reached with https://: one owner, as for the
 * budget (its pooled connections serve every location that proxies to
 * it, so those locations must agree on scheme and proxy_ssl_*), and one
 * SSL_CTX per configuration generation, made now: a CA file that does not
 * load is the config's error. */
static const char *
resolve_tls(ric_conf_parse_t *cf)
{
    ric_server_conf_t *s;
    ric_location_conf_t *l;
    ric_upstream_conf_t *u;
    const ric_location_conf_t *o;
    char err[512];
    const char *ca;

    for (s = cf->conf->http->servers; s; s = s->next) {
        for (l = s->locations; l; l = l->next) {
            if ((u = l->upstream) == NULL) {
                continue;
            }
            if (u->tls_owner == NULL) {
                u->tls_owner = l;
                u->tls = l->proxy_tls;
                continue;
            }
            o = u->tls_owner;
            if (o->proxy_tls != l->proxy_tls) {
                return ric_conf_reason(cf, "%s:%d: upstream \"%s\" is reached with %s here and "
                                       "with %s in %s:%d: its connections are one or the other",
                                       l->proxy_pass_file, l->proxy_pass_line, u->name,
                                       l->proxy_tls ? "https://" : "http://",
                                       o->proxy_tls ? "https://" : "http://", o->proxy_pass_file,
                                       o->proxy_pass_line);
            }
            if (l->proxy_tls
                && (o->settings.proxy_ssl_verify != l->settings.proxy_ssl_verify
                    || o->settings.proxy_ssl_server_name != l->settings.proxy_ssl_server_name
                    || !same_str(o->refs.proxy_ssl_trusted_certificate,
                                 l->refs.proxy_ssl_trusted_certificate)
                    || !same_str(o->refs.proxy_ssl_name, l->refs.proxy_ssl_name))) {
                return ric_conf_reason(cf, "%s:%d: the proxy_ssl_* settings for upstream \"%s\" "
                                       "differ from those of %s:%d: its pooled connections serve "
                                       "both (set them once, where both inherit them)",
                                       l->proxy_pass_file, l->proxy_pass_line, u->name,
                                       o->proxy_pass_file, o->proxy_pass_line);
            }
        }
    }
    for (u = cf->conf->http->upstreams; u; u = u->next) {
        if (!u->tls || u->tls_owner == NULL) {
            continue;
        }
        o = u->tls_owner;
        ca = o->refs.proxy_ssl_trusted_certificate;
        u->ssl_ctx = ric_tls_client_ctx(o->settings.proxy_ssl_verify == 1, ca, err, sizeof(err));
        if (u->ssl_ctx == NULL) {
            return ric_conf_reason(cf, "%s:%d: upstream \"%s\": %s", o->proxy_pass_file,
                                   o->proxy_pass_line, u->name, err);
        }
        ric_pool_cleanup_add(cf->pool, free_ssl_ctx, u->ssl_ctx);
        u->ssl_name = o->refs.proxy_ssl_name != NULL ? o->refs.proxy_ssl_name
                      : u->implicit ? u->servers->host : u->name;
    }
    return NULL;
}

const char *
ric_conf_finish(ric_conf_parse_t *cf)
{
    ric_conf_t *c = cf->conf;
    ric_server_conf_t *s;
    ric_location_conf_t *l;
    ric_upstream_conf_t *u;
    const char *reason;

    if (ric_conf_apply_defaults(cf, RIC_CONF_MAIN, c) != RIC_OK) {
        return ric_conf_reported;
    }
    if (c->pid_path == NULL) {
        c->pid_path = ric_pstrdup(cf->pool, "off");
    }
    if (c->error_log == NULL) {
        c->error_log = ric_pstrdup(cf->pool, "stderr");
        c->error_log_level = RIC_LOG_ERR;
    }
    if (c->http == NULL) {
        return NULL;
    }
    if (ric_conf_apply_defaults(cf, RIC_CONF_HTTP, &c->http->settings) != RIC_OK) {
        return ric_conf_reported;
    }
    for (u = c->http->upstreams; u; u = u->next) {
        if (ric_conf_apply_defaults(cf, RIC_CONF_UPS, u) != RIC_OK) {
            return ric_conf_reported;
        }
        u->host_header = u->name;
    }
    if (c->http->admin != NULL) {
        /* the timeouts and limits of the http level, a head within 10 s at
         * most (a probe that stalls must not hold a connection for long);
         * no access log */
        settings_merge(&c->http->admin->settings, &c->http->settings);
        c->http->admin->settings.client_header_timeout =
            ric_min(c->http->admin->settings.client_header_timeout, (int64_t) ADMIN_HEAD_MS);
    }
    for (s = c->http->servers; s; s = s->next) {
        settings_merge(&s->settings, &c->http->settings);
        refs_merge(&s->refs, &c->http->refs);
        if ((reason = check_retry_settings(cf, &s->settings, s->file, s->line)) != NULL) {
            snprintf(cf->err, cf->errlen, "%s", reason);
            return ric_conf_reported;
        }
        for (l = s->locations; l; l = l->next) {
            settings_merge(&l->settings, &s->settings);
            refs_merge(&l->refs, &s->refs);
            if ((reason = check_retry_settings(cf, &l->settings, l->file, l->line)) != NULL) {
                snprintf(cf->err, cf->errlen, "%s", reason);
                return ric_conf_reported;
            }
            warn_body_max(l);
            if (l->proxy_pass != NULL && (reason = link_proxy_pass(cf, l)) != NULL) {
                if (reason != ric_conf_reported) {
                    snprintf(cf->err, cf->errlen, "%s", reason);
                }
                return ric_conf_reported;
            }
        }
    }
    /* the bounds of every hook call from here on (a main chunk ran under
     * the defaults: the directives may come after the scripts) */
    ric_script_limits(c);
    /* the dictionaries main chunks named, declared anywhere in the block */
    if (ric_shared_dict_resolve(cf->err, cf->errlen) != RIC_OK) {
        return ric_conf_reported;
    }
    if ((reason = check_idem_stores(cf)) != NULL) {
        snprintf(cf->err, cf->errlen, "%s", reason);
        return ric_conf_reported;
    }
    if ((reason = resolve_budgets(cf)) != NULL) {
        snprintf(cf->err, cf->errlen, "%s", reason);
        return ric_conf_reported;
    }
    if ((reason = resolve_tls(cf)) != NULL) {
        snprintf(cf->err, cf->errlen, "%s", reason);
        return ric_conf_reported;
    }
    for (u = c->http->upstreams; u; u = u->next) {
        ric_upstream_server_t *us, *next;
        u->index = c->http->nupstreams++;
        for (us = u->servers; us; us = next) {
            next = us->next; /* resolving may insert entries after us */
            reason = resolve_server(cf, u, us);
            if (reason != NULL) {
                snprintf(cf->err, cf->errlen, "%s", reason);
                return ric_conf_reported;
            }
        }
    }
    reason = build_listeners(cf);
    if (reason != NULL) {
        snprintf(cf->err, cf->errlen, "%s", reason);
        return ric_conf_reported;
    }
    ric_idem_route_names(c->http, cf->pool);
    if (ric_tls_server_setup(c, cf->pool, cf->err, cf->errlen) != RIC_OK) {
        return ric_conf_reported;
    }
    return NULL;
}

/* Lists the table for `ricochet --directives` (and the docs check). */
int ric_conf_print_directives(FILE *out);

int
ric_conf_print_directives(FILE *out)
{
    static const struct { unsigned bit; const char *name; } ctx[] = {
        { RIC_CONF_MAIN, "main" }, { RIC_CONF_HTTP, "http" }, { RIC_CONF_SRV, "server" },
        { RIC_CONF_LOC, "location" }, { RIC_CONF_UPS, "upstream" }
    };
    const ric_conf_cmd_t *cmd;
    size_t i;
    int first;

    for (cmd = ric_conf_commands; cmd->name != NULL; cmd++) {
        fprintf(out, "%s\t", cmd->name);
        first = 1;
        for (i = 0; i < ric_nelems(ctx); i++) {
            if (cmd->contexts == RIC_CONF_ANY) {
                fprintf(out, "any");
                break;
            }
            if (cmd->contexts & ctx[i].bit) {
                fprintf(out, "%s%s", first ? "" : ",", ctx[i].name);
                first = 0;
            }
        }
        fprintf(out, "\t%s\t%s\n", cmd->default_value ? cmd->default_value : "-", cmd->summary);
    }
    return 0;
}
