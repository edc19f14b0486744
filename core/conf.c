/* conf.c: the nginx config grammar: tokens, statements, blocks, include, and value syntax. */
#include "conf_parse.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

const char ric_conf_reported[] = "(reported)";

#define CONF_MAX_FILE (16 * 1024 * 1024)
#define CONF_MAX_INCLUDE_DEPTH 16

/* What ended a statement. */
enum { TOK_SEMICOLON, TOK_BLOCK_START, TOK_BLOCK_END, TOK_EOF, TOK_ERROR };

const char *
ric_conf_reason(ric_conf_parse_t *cf, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(cf->reason, sizeof(cf->reason), fmt, ap);
    va_end(ap);
    return cf->reason;
}

static void
report(ric_conf_parse_t *cf, int line, const char *reason)
{
    if (reason == ric_conf_reported) {
        return;
    }
    snprintf(cf->err, cf->errlen, "%s:%d: %s", cf->file, line, reason);
}

/* The line to blame at the end of the text: the last line, not the empty
 * one after its newline. */
static int
eof_line(ric_conf_parse_t *cf)
{
    return cf->line > 1 && cf->pos > cf->start && cf->pos[-1] == '\n' ? cf->line - 1 : cf->line;
}

static int
is_space(int c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

static int
is_special(int c)
{
    return c == ';' || c == '{' || c == '}';
}

/* Reads one word at cf->pos (which is not at a space). Escapes: \" \' \\ \n
 * \r \t; any other escaped character stands for itself. */
static const char *
read_word(ric_conf_parse_t *cf, char **out)
{
    char quote = 0;
    char *w, *o;
    const char *p = cf->pos;

    if (*p == '"' || *p == '\'') {
        quote = *p++;
    }
    /* a word is never longer than the rest of the file */
    w = o = ric_palloc(cf->pool, (size_t) (cf->end - p) + 1);

    for (;;) {
        if (p == cf->end) {
            if (quote) {
                return ric_conf_reason(cf, "unexpected end of file, expecting \"%c\"", quote);
            }
            break;
        }
        if (quote && *p == quote) {
            p++;
            if (p < cf->end && !is_space(*p) && !is_special(*p)) {
                return ric_conf_reason(cf, "unexpected \"%c\" after a quoted string", *p);
            }
            break;
        }
        if (!quote && (is_space(*p) || is_special(*p))) {
            break;
        }
        if (*p == '\\' && p + 1 < cf->end) {
            p++;
            switch (*p) {
            case 'n': *o++ = '\n'; break;
            case 'r': *o++ = '\r'; break;
            case 't': *o++ = '\t'; break;
            default: *o++ = *p; break;
            }
            if (*p == '\n') {
                cf->line++;
            }
            p++;
            continue;
        }
        if (*p == '\0') {
            return "unexpected NUL byte";
        }
        if (*p == '\n') {
            cf->line++;
        }
        *o++ = *p++;
    }
    *o = '\0';
    cf->pos = p;
    *out = w;
    return NULL;
}

/* Reads the next statement's words into cf->args; returns what ended it. */
static int
read_statement(ric_conf_parse_t *cf)
{
    const char *reason;

    cf->nargs = 0;
    cf->directive_line = cf->line;

    for (;;) {
        while (cf->pos < cf->end && is_space(*cf->pos)) {
            if (*cf->pos == '\n') {
                cf->line++;
            }
            cf->pos++;
        }
        if (cf->pos == cf->end) {
            if (cf->nargs > 0) {
                report(cf, eof_line(cf), "unexpected end of file, expecting \";\" or \"}\"");
                return TOK_ERROR;
            }
            return TOK_EOF;
        }
        if (cf->nargs == 0) {
            cf->directive_line = cf->line;
        }
        switch (*cf->pos) {
        case '#':
            while (cf->pos < cf->end && *cf->pos != '\n') {
                cf->pos++;
            }
            continue;
        case ';':
            cf->pos++;
            if (cf->nargs == 0) {
                report(cf, cf->line, "unexpected \";\"");
                return TOK_ERROR;
            }
            return TOK_SEMICOLON;
        case '{':
            cf->pos++;
            if (cf->nargs == 0) {
                report(cf, cf->line, "unexpected \"{\"");
                return TOK_ERROR;
            }
            return TOK_BLOCK_START;
        case '}':
            cf->pos++;
            if (cf->nargs > 0) {
                report(cf, cf->line, "unexpected \"}\"");
                return TOK_ERROR;
            }
            return TOK_BLOCK_END;
        }
        if (cf->nargs == RIC_CONF_MAX_ARGS) {
            report(cf, cf->line, "too many arguments");
            return TOK_ERROR;
        }
        reason = read_word(cf, &cf->args[cf->nargs]);
        if (reason != NULL) {
            report(cf, cf->line, reason);
            return TOK_ERROR;
        }
        cf->nargs++;
    }
}

static const unsigned arity_bits[] = {
    RIC_CONF_NOARGS, RIC_CONF_TAKE1, RIC_CONF_TAKE2, RIC_CONF_TAKE3, RIC_CONF_TAKE4
};

static void *
context_conf(ric_conf_parse_t *cf)
{
    switch (cf->ctx) {
    case RIC_CONF_MAIN: return cf->conf;
    case RIC_CONF_HTTP: return &cf->conf->http->settings;
    case RIC_CONF_SRV: return &cf->server->settings;
    case RIC_CONF_LOC: return &cf->location->settings;
    case RIC_CONF_UPS: return cf->upstream;
    }
    return NULL;
}

/* nginx directives people paste that this gateway does not have, and
 * what to do instead. */
static const struct {
    const char *name;
    const char *hint;
} not_here[] = {
    { "ssl", "TLS is a parameter of listen: \"listen ADDRESS:PORT ssl;\"" },
    { "http2", "the gateway speaks HTTP/1.1 (ALPN offers http/1.1): remove it" },
    { "ssl_prefer_server_ciphers",
      "clients choose among ssl_ciphers, which are all forward-secret AEAD: remove it" },
    { "ssl_dhparam", "the default ssl_ciphers use ECDHE only, which needs no DH parameters: "
                     "remove it" },
    { "ssl_ecdh_curve", "OpenSSL's default groups (X25519, P-256, ...) are used: remove it" },
    { "ssl_stapling", "OCSP stapling is not supported yet: remove it" },
    { "ssl_stapling_verify", "OCSP stapling is not supported yet: remove it" },
    { "ssl_trusted_certificate", "OCSP stapling is not supported yet: remove it" },
    { "ssl_session_ticket_key", "ticket keys are made when the configuration loads and shared "
                                "by every worker: remove it" },
    { "ssl_password_file", "keys are read unencrypted: decrypt it (openssl pkey -in KEY "
                           "-out PLAIN.key) and remove this" },
    { "proxy_ssl_session_reuse", "sessions to https upstreams are always reused: remove it" },
    { "proxy_http_version", "the gateway always speaks HTTP/1.1 to upstreams: remove it" },
};

static const char *
dispatch(ric_conf_parse_t *cf, int ended_by)
{
    size_t i;
    const ric_conf_cmd_t *cmd;
    int known = 0, argc = cf->nargs - 1;
    unsigned ok;

    for (cmd = ric_conf_commands; cmd->name != NULL; cmd++) {
        if (strcmp(cmd->name, cf->args[0]) != 0) {
            continue;
        }
        known = 1;
        if (!(cmd->contexts & cf->ctx)) {
            continue;
        }
        if ((cmd->arity & RIC_CONF_BLOCK) && ended_by != TOK_BLOCK_START) {
            return ric_conf_reason(cf, "directive \"%s\" has no opening \"{\"", cmd->name);
        }
        if (!(cmd->arity & RIC_CONF_BLOCK) && ended_by != TOK_SEMICOLON) {
            return ric_conf_reason(cf, "directive \"%s\" is not terminated by \";\"",
                                   cmd->name);
        }
        ok = (cmd->arity & RIC_CONF_1MORE) ? argc >= 1
             : argc < (int) ric_nelems(arity_bits) && (cmd->arity & arity_bits[argc]);
        if (!ok) {
            return ric_conf_reason(cf, "invalid number of arguments in \"%s\" directive",
                                   cmd->name);
        }
        return cmd->set(cf, cmd, context_conf(cf));
    }
    if (known) {
        return ric_conf_reason(cf, "\"%s\" directive is not allowed here", cf->args[0]);
    }
    for (i = 0; i < ric_nelems(not_here); i++) {
        if (strcmp(not_here[i].name, cf->args[0]) == 0) {
            return ric_conf_reason(cf, "unknown directive \"%s\": %s", cf->args[0],
                                   not_here[i].hint);
        }
    }
    return ric_conf_reason(cf, "unknown directive \"%s\"", cf->args[0]);
}

/* Parses statements until "}" (in_block) or the end of the current text. */
static int
parse_statements(ric_conf_parse_t *cf, int in_block)
{
    const char *reason;
    int tok;

    for (;;) {
        tok = read_statement(cf);
        switch (tok) {
        case TOK_ERROR:
            return RIC_ERROR;
        case TOK_EOF:
            if (in_block) {
                report(cf, eof_line(cf), "unexpected end of file, expecting \"}\"");
                return RIC_ERROR;
            }
            return RIC_OK;
        case TOK_BLOCK_END:
            if (!in_block) {
                report(cf, cf->line, "unexpected \"}\"");
                return RIC_ERROR;
            }
            return RIC_OK;
        default:
            reason = dispatch(cf, tok);
            if (reason != NULL) {
                report(cf, cf->directive_line, reason);
                return RIC_ERROR;
            }
        }
    }
}

int
ric_conf_parse_block(ric_conf_parse_t *cf)
{
    return parse_statements(cf, 1);
}

static int
parse_text(ric_conf_parse_t *cf, const char *file, const char *text, size_t len)
{
    const char *saved_file = cf->file, *saved_pos = cf->pos, *saved_end = cf->end;
    const char *saved_start = cf->start;
    int saved_line = cf->line, rc;

    cf->file = file;
    if (len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0) {
        text += 3; /* a UTF-8 byte order mark some editors write */
        len -= 3;
    }
    cf->pos = cf->start = text;
    cf->end = text + len;
    cf->line = 1;
    rc = parse_statements(cf, 0);
    cf->file = saved_file;
    cf->pos = saved_pos;
    cf->end = saved_end;
    cf->start = saved_start;
    cf->line = saved_line;
    return rc;
}

int
ric_conf_parse_file(ric_conf_parse_t *cf, const char *path)
{
    struct stat st;
    char *text;
    ssize_t n;
    size_t got = 0;
    int fd, rc;

    if (cf->include_depth >= CONF_MAX_INCLUDE_DEPTH) {
        report(cf, cf->directive_line, ric_conf_reason(cf, "includes nested too deeply at \"%s\"", path));
        return RIC_ERROR;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd == -1 || fstat(fd, &st) == -1) {
        const char *why = strerror(errno);
        if (fd != -1) {
            close(fd);
        }
        if (cf->file != NULL) {
            report(cf, cf->directive_line,
                   ric_conf_reason(cf, "cannot open \"%s\": %s", path, why));
        } else {
            snprintf(cf->err, cf->errlen, "%s: cannot open: %s", path, why);
        }
        return RIC_ERROR;
    }
    if (!S_ISREG(st.st_mode) || st.st_size > CONF_MAX_FILE) {
        close(fd);
        snprintf(cf->err, cf->errlen, "%s: not a regular file of at most 16m", path);
        return RIC_ERROR;
    }
    text = ric_palloc(cf->pool, (size_t) st.st_size + 1);
    while (got < (size_t) st.st_size) {
        n = read(fd, text + got, (size_t) st.st_size - got);
        if (n <= 0) {
            break;
        }
        got += (size_t) n;
    }
    close(fd);

    cf->include_depth++;
    rc = parse_text(cf, ric_pstrdup(cf->pool, path), text, got);
    cf->include_depth--;
    return rc;
}

char *
ric_conf_full_path(ric_pool_t *pool, const char *prefix, const char *path)
{
    size_t pl, l;
    char *full;

    if (path[0] == '/' || prefix == NULL || prefix[0] == '\0') {
        return ric_pstrdup(pool, path);
    }
    pl = strlen(prefix);
    l = strlen(path);
    full = ric_palloc(pool, pl + l + 2);
    memcpy(full, prefix, pl);
    if (prefix[pl - 1] != '/') {
        full[pl++] = '/';
    }
    memcpy(full + pl, path, l + 1);
    return full;
}

ric_conf_t *
ric_conf_load(const char *prefix, const char *path, char *err, size_t errlen)
{
    ric_pool_t *pool = ric_pool_create(16384);
    ric_conf_t *conf = ric_pcalloc(pool, sizeof(*conf));
    ric_conf_parse_t cf;
    const char *reason;
    char cwd[4096];
    int rc;

    conf->pool = pool;
    conf->worker_processes = RIC_CONF_UNSET;
    conf->worker_shutdown_timeout = RIC_CONF_UNSET;
    conf->worker_watchdog = RIC_CONF_UNSET;
    conf->worker_connections = RIC_CONF_UNSET;
    conf->daemon = RIC_CONF_UNSET;
    conf->error_log_level = RIC_CONF_UNSET;

    if (prefix == NULL || prefix[0] == '\0') {
        if (getcwd(cwd, sizeof(cwd)) == NULL) {
            snprintf(err, errlen, "cannot determine the current directory: %s", strerror(errno));
            ric_pool_destroy(pool);
            return NULL;
        }
        prefix = cwd;
    }
    conf->prefix = ric_palloc(pool, strlen(prefix) + 2);
    strcpy(conf->prefix, prefix);
    if (conf->prefix[strlen(prefix) - 1] != '/') {
        strcat(conf->prefix, "/");
    }

    memset(&cf, 0, sizeof(cf));
    cf.conf = conf;
    cf.pool = pool;
    cf.ctx = RIC_CONF_MAIN;
    cf.err = err;
    cf.errlen = errlen;
    err[0] = '\0';

    if (path == NULL) {
        struct stat st;
        char *def = ric_conf_full_path(pool, conf->prefix, "conf/ricochet.conf");
        if (stat(def, &st) == 0) {
            path = def;
        }
    }
    if (path == NULL) {
        conf->file = "(embedded default)";
        rc = parse_text(&cf, conf->file, ric_default_conf, strlen(ric_default_conf));
    } else {
        conf->file = ric_conf_full_path(pool, conf->prefix, path);
        rc = ric_conf_parse_file(&cf, conf->file);
    }
    if (rc != RIC_OK) {
        goto failed;
    }
    cf.file = conf->file;
    cf.line = 0;
    reason = ric_conf_finish(&cf);
    if (reason != NULL) {
        if (reason != ric_conf_reported) {
            snprintf(err, errlen, "%s: %s", conf->file, reason);
        }
        goto failed;
    }
    return conf;

failed:
    ric_pool_destroy(pool);
    return NULL;
}

void
ric_conf_free(ric_conf_t *conf)
{
    if (conf != NULL) {
        ric_pool_destroy(conf->pool);
    }
}

int
ric_conf_parse_number(const char *s, int64_t *out)
{
    int64_t v = 0;

    if (*s == '\0') {
        return RIC_ERROR;
    }
    for (; *s; s++) {
        if (*s < '0' || *s > '9' || v > (INT64_MAX - (*s - '0')) / 10) {
            return RIC_ERROR;
        }
        v = v * 10 + (*s - '0');
    }
    *out = v;
    return RIC_OK;
}

int
ric_conf_parse_size(const char *s, int64_t *out)
{
    char digits[32];
    size_t len = strlen(s);
    int64_t v, scale = 1;

    if (len == 0 || len >= sizeof(digits)) {
        return RIC_ERROR;
    }
    switch (s[len - 1]) {
    case 'k': case 'K': scale = 1024; len--; break;
    case 'm': case 'M': scale = 1024 * 1024; len--; break;
    case 'g': case 'G': scale = 1024 * 1024 * 1024; len--; break;
    }
    memcpy(digits, s, len);
    digits[len] = '\0';
    if (ric_conf_parse_number(digits, &v) != RIC_OK || v > INT64_MAX / scale) {
        return RIC_ERROR;
    }
    *out = v * scale;
    return RIC_OK;
}

int
ric_conf_parse_time(const char *s, int64_t *out_ms)
{
    int64_t total = 0, v, unit;
    int last_unit = 0; /* units must go from larger to smaller: 1h30m, not 30m1h */
    int rank;

    if (*s == '\0') {
        return RIC_ERROR;
    }
    while (*s) {
        if (*s < '0' || *s > '9') {
            return RIC_ERROR;
        }
        v = 0;
        while (*s >= '0' && *s <= '9') {
            if (v > (INT64_MAX - (*s - '0')) / 10) {
                return RIC_ERROR;
            }
            v = v * 10 + (*s++ - '0');
        }
        if (s[0] == 'm' && s[1] == 's') {
            unit = 1, rank = 6, s += 2;
        } else if (*s == 's' || *s == '\0') {
            unit = 1000, rank = 5, s += (*s != '\0');
        } else if (*s == 'm') {
            unit = 60 * 1000, rank = 4, s++;
        } else if (*s == 'h') {
            unit = 3600 * 1000, rank = 3, s++;
        } else if (*s == 'd') {
            unit = 86400 * 1000, rank = 2, s++;
        } else if (*s == 'w') {
            unit = 7 * 86400 * 1000LL, rank = 1, s++;
        } else {
            return RIC_ERROR;
        }
        if (rank <= last_unit) {
            return RIC_ERROR;
        }
        last_unit = rank;
        if (v > (INT64_MAX - total) / unit) {
            return RIC_ERROR;
        }
        total += v * unit;
    }
    *out_ms = total;
    return RIC_OK;
}
