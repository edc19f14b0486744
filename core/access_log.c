/* access_log.c: JSON access log lines: formatting, escaping, opening and reopening files. */
#include "access_log.h"
#include "pool.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define LINE_MAX_BYTES 8192

static int
open_one(ric_access_log_t *a)
{
    if (strcmp(a->path, "off") == 0) {
        a->fd = -1;
    } else if (strcmp(a->path, "stdout") == 0) {
        a->fd = 1;
    } else if (strcmp(a->path, "stderr") == 0) {
        a->fd = 2;
    } else {
        a->fd = ric_open_append(a->path);
        if (a->fd == -1) {
            return RIC_ERROR;
        }
    }
    if (a->fd != -1) {
        struct stat st;
        a->pipe = fstat(a->fd, &st) == 0 && !S_ISREG(st.st_mode);
    }
    return RIC_OK;
}

/* The configuration is freed: its log files close with it (a reload's old
 * generation, in the master). */
static void
close_all(void *data)
{
    ric_access_log_t *a;

    for (a = data; a; a = a->next) {
        if (a->fd > 2) {
            close(a->fd);
        }
        a->fd = -1;
    }
}

int
ric_access_log_open(ric_conf_t *conf, char *err, size_t errlen)
{
    ric_access_log_t *a;

    if (conf->http == NULL) {
        return RIC_OK;
    }
    ric_pool_cleanup_add(conf->pool, close_all, conf->http->access_logs);
    for (a = conf->http->access_logs; a; a = a->next) {
        if (open_one(a) != RIC_OK) {
            snprintf(err, errlen, "cannot open the access log \"%s\": %s%s", a->path,
                     strerror(errno), errno == ENXIO ? " (a FIFO needs its reader first)" : "");
            return RIC_ERROR;
        }
    }
    return RIC_OK;
}

void
ric_access_log_reopen(ric_conf_t *conf)
{
    ric_access_log_t *a;
    int fd;

    if (conf->http == NULL) {
        return;
    }
    ric_access_log_flush_due(conf, 0, 1); /* what was written before goes to the old file */
    for (a = conf->http->access_logs; a; a = a->next) {
        if (a->fd <= 2) {
            continue;
        }
        fd = ric_open_append(a->path);
        if (fd == -1) {
            ric_log_error(RIC_LOG_ALERT, errno, "cannot reopen the access log \"%s\"", a->path);
            continue;
        }
        /* dup2 keeps the descriptor number every process already uses */
        dup2(fd, a->fd);
        close(fd);
    }
}

typedef struct {
    char *p;
    char *end;
} out_t;

static void
put(out_t *o, const char *s, size_t n)
{
    if ((size_t) (o->end - o->p) < n) {
        n = (size_t) (o->end - o->p);
    }
    memcpy(o->p, s, n);
    o->p += n;
}

#define put_lit(o, s) put((o), (s), sizeof(s) - 1)

static void
putf(out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
putf(out_t *o, const char *fmt, ...)
{
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(o->p, (size_t) (o->end - o->p), fmt, ap);
    va_end(ap);
    if (n > 0) {
        o->p += ric_min((size_t) n, (size_t) (o->end - o->p));
    }
}

/* A JSON string: quotes, backslashes and control bytes escaped; bytes above
 * 0x7e escaped too, so a line is valid JSON whatever the client sent. */
static void
put_json(out_t *o, const u_char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    char esc[6];
    size_t i;

    put(o, "\"", 1);
    for (i = 0; i < n; i++) {
        u_char ch = s[i];
        if (ch == '"' || ch == '\\') {
            esc[0] = '\\';
            esc[1] = (char) ch;
            put(o, esc, 2);
        } else if (ch < 0x20 || ch > 0x7e) {
            esc[0] = '\\';
            esc[1] = 'u';
            esc[2] = '0';
            esc[3] = '0';
            esc[4] = hex[ch >> 4];
            esc[5] = hex[ch & 0xf];
            put(o, esc, 6);
        } else {
            put(o, (const char *) &ch, 1);
        }
    }
    put(o, "\"", 1);
}

static void
put_json_cstr(out_t *o, const char *s)
{
    if (s == NULL) {
        put_lit(o, "null");
    } else {
        put_json(o, (const u_char *) s, strlen(s));
    }
}

static void put_line(ric_access_log_t *log, const char *line, size_t n);

void
ric_access_log_write(ric_access_log_t *log, const ric_access_entry_t *e)
{
    static pid_t pid;
    char line[LINE_MAX_BYTES], ts[40];
    out_t o = { line, line + sizeof(line) - 2 };
    struct timeval tv;
    struct tm tm;
    int i;

    if (log == NULL || log->fd == -1) {
        return;
    }
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);

    if (pid == 0) {
        pid = getpid(); /* only workers write lines: the first one is in the worker */
    }
    putf(&o, "{\"time\":\"%s.%03ldZ\",\"pid\":%d,\"id\":\"%s\",\"client\":", ts,
         (long) (tv.tv_usec / 1000), (int) pid, e->id);
    put_json_cstr(&o, e->client);
    put_lit(&o, ",\"method\":");
    put_json(&o, e->method.data, e->method.len);
    put_lit(&o, ",\"path\":");
    put_json(&o, e->path.data, e->path.len);
    put_lit(&o, ",\"host\":");
    if (e->host.data) {
        put_json(&o, e->host.data, e->host.len);
    } else {
        put_lit(&o, "null");
    }
    putf(&o, ",\"status\":%d,\"bytes\":%llu,\"duration\":%.6f,\"upstream\":", e->status,
         (unsigned long long) e->bytes, (double) e->duration_us / 1e6);
    put_json_cstr(&o, e->upstream);
    put_lit(&o, ",\"attempts\":[");
    for (i = 0; i < e->nattempts; i++) {
        const ric_attempt_record_t *a = &e->attempts[i];
        if (i > 0) {
            put_lit(&o, ",");
        }
        put_lit(&o, "{\"server\":");
        put_json_cstr(&o, a->server);
        put_lit(&o, ",\"class\":");
        put_json_cstr(&o, a->class);
        if (a->status) {
            putf(&o, ",\"status\":%d", a->status);
        } else {
            put_lit(&o, ",\"status\":null");
        }
        putf(&o, ",\"duration\":%.6f,\"wait\":%.6f", (double) a->duration_us / 1e6,
             (double) a->wait_us / 1e6);
        if (a->regime != NULL) {
            put_lit(&o, ",\"regime\":");
            put_json_cstr(&o, a->regime);
        }
        if (a->hedge) {
            put_lit(&o, ",\"hedge\":true");
        }
        put_lit(&o, "}");
    }
    put_lit(&o, "]");
    if (e->attempts_total > e->nattempts) {
        putf(&o, ",\"attempts_total\":%d", e->attempts_total);
    }
    if (e->hedge != NULL) {
        put_lit(&o, ",\"hedge\":");
        put_json_cstr(&o, e->hedge);
    }
    if (e->idempotency != NULL) {
        put_lit(&o, ",\"idempotency\":");
        put_json_cstr(&o, e->idempotency);
    }
    if (e->verdict != NULL) {
        put_lit(&o, ",\"verdict\":");
        put_json_cstr(&o, e->verdict);
        put_lit(&o, ",\"reason\":");
        put_json_cstr(&o, e->reason);
    }
    if (e->not_retried != NULL) {
        put_lit(&o, ",\"not_retried\":");
        put_json_cstr(&o, e->not_retried);
    }
    for (i = 0; i < e->nscript; i++) {
        if (i == 0) {
            put_lit(&o, ",\"script\":{");
        } else {
            put_lit(&o, ",");
        }
        put_json_cstr(&o, e->script[i].name);
        put_lit(&o, ":");
        if (e->script[i].quoted) {
            put_json(&o, (const u_char *) e->script[i].text, e->script[i].len);
        } else {
            put(&o, e->script[i].text, e->script[i].len);
        }
    }
    if (e->nscript > 0) {
        put_lit(&o, "}");
    }
    put_lit(&o, "}");
    if (o.p >= o.end) {
        /* cut short: still one line, and the reader sees it is not JSON */
        o.p = o.end;
    }
    *o.p++ = '\n';
    put_line(log, line, (size_t) (o.p - line));
}

/* Writes what log has gathered. A pipe or a socket (stdout under a
 * supervisor) takes a write whole only up to PIPE_BUF: there the lines go
 * in pieces of that much, each ending with a line's end, so the workers'
 * lines never interleave mid-line. */
static void
flush(ric_access_log_t *log)
{
    size_t off = 0, n;
    ssize_t wr;
    u_char *nl;

    while (off < log->len) {
        n = log->len - off;
        if (log->pipe && n > PIPE_BUF) {
            nl = memrchr(log->buf + off, '\n', PIPE_BUF);
            if (nl == NULL) { /* a line longer than PIPE_BUF: alone */
                nl = memchr(log->buf + off + PIPE_BUF, '\n', n - PIPE_BUF);
            }
            n = nl != NULL ? (size_t) (nl - (log->buf + off)) + 1 : n;
        }
        wr = write(log->fd, log->buf + off, n);
        if (wr <= 0) {
            break; /* the rest of the buffer is lost, as an unbuffered line would be */
        }
        off += (size_t) wr;
    }
    log->len = 0;
}

/* A line goes out at once, or (buffer=) joins the buffer, which goes out
 * when the next line would not fit or its oldest line is flush= old. */
static void
put_line(ric_access_log_t *log, const char *line, size_t n)
{
    int64_t now;
    ssize_t wr;

    if (log->buffer == 0 || n > (size_t) log->buffer) {
        flush(log);
        wr = write(log->fd, line, n);
        (void) wr;
        return;
    }
    if (log->buf == NULL) {
        log->buf = ric_xmalloc((size_t) log->buffer);
    }
    if (log->len + n > (size_t) log->buffer) {
        flush(log);
    }
    now = ric_now_ms();
    if (log->len == 0) {
        log->first_ms = now;
    }
    memcpy(log->buf + log->len, line, n);
    log->len += n;
    if (now - log->first_ms >= log->flush_ms) {
        flush(log);
    }
}

int64_t
ric_access_log_flush_due(ric_conf_t *conf, int64_t now, int all)
{
    ric_access_log_t *a;
    int64_t next = -1, due;

    for (a = conf->http ? conf->http->access_logs : NULL; a; a = a->next) {
        if (a->len == 0) {
            continue;
        }
        due = a->first_ms + a->flush_ms;
        if (all || due <= now) {
            flush(a);
        } else if (next < 0 || due < next) {
            next = due;
        }
    }
    return next;
}

void
ric_access_log_free_buffers(ric_conf_t *conf)
{
    ric_access_log_t *a;

    ric_access_log_flush_due(conf, 0, 1);
    for (a = conf->http ? conf->http->access_logs : NULL; a; a = a->next) {
        free(a->buf);
        a->buf = NULL;
    }
}
