/* log.c: the error log: formatting, levels, opening and reopening the file. */
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static ric_log_t default_log = { 2, RIC_LOG_NOTICE, NULL };
ric_log_t *ric_log = &default_log;
int ric_log_stderr_too = 1;

static const char *level_names[] = {
    "emerg", "alert", "crit", "error", "warn", "notice", "info", "debug"
};

int
ric_log_level_parse(const char *name)
{
    size_t i;

    for (i = 0; i < ric_nelems(level_names); i++) {
        if (strcmp(name, level_names[i]) == 0) {
            return (int) i;
        }
    }
    return -1;
}

const char *
ric_log_level_name(int level)
{
    if (level < 0 || level >= (int) ric_nelems(level_names)) {
        return "unknown";
    }
    return level_names[level];
}

/* The width of a byte in a line: itself, or its escape. */
static size_t
escape_width(unsigned char c)
{
    if (c == '\n' || c == '\r' || c == '\t') {
        return 2;
    }
    return c < 0x20 || c == 0x7f || c == '\\' ? 4 : 1;
}

size_t
ric_log_fit(const char *s, size_t len, size_t width)
{
    size_t i, w = 0;

    for (i = 0; i < len && w + escape_width((unsigned char) s[i]) <= width; i++) {
        w += escape_width((unsigned char) s[i]);
    }
    return i;
}

/* src escaped into dst, as much as fits in room; the bytes written. */
static size_t
escape(char *dst, size_t room, const char *src, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    size_t i, n = 0, w;
    unsigned char c;

    for (i = 0; i < len; i++) {
        c = (unsigned char) src[i];
        w = escape_width(c);
        if (n + w > room) {
            break;
        }
        if (w == 1) {
            dst[n] = (char) c;
        } else if (w == 2) {
            dst[n] = '\\';
            dst[n + 1] = c == '\n' ? 'n' : c == '\r' ? 'r' : 't';
        } else {
            dst[n] = '\\';
            dst[n + 1] = 'x';
            dst[n + 2] = hex[c >> 4];
            dst[n + 3] = hex[c & 0xf];
        }
        n += w;
    }
    return n;
}

void
ric_log_write(int level, int err, const char *fmt, ...)
{
    char line[RIC_LOG_LINE_MAX], msg[RIC_LOG_LINE_MAX];
    size_t n, room = sizeof(line) - 1; /* the last byte is the newline's */
    int rc;
    va_list ap;
    struct timespec ts;
    struct tm tm;
    ssize_t wr;

    clock_gettime(CLOCK_REALTIME, &ts);
    localtime_r(&ts.tv_sec, &tm);
    n = strftime(line, sizeof(line), "%Y/%m/%d %H:%M:%S", &tm);
    rc = snprintf(line + n, sizeof(line) - n, " [%s] %d: ", ric_log_level_name(level),
                  (int) getpid());
    n += rc > 0 ? (size_t) rc : 0;

    /* what the message carries (a script's text, a client's) cannot start
     * a line of its own: its control bytes go escaped */
    va_start(ap, fmt);
    rc = vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (rc > 0) {
        n += escape(line + n, room - n, msg, ric_min((size_t) rc, sizeof(msg) - 1));
    }

    if (err != 0 && n < room) {
        rc = snprintf(line + n, room + 1 - n, " (%d: %s)", err, strerror(err));
        if (rc > 0) {
            n = ric_min(n + (size_t) rc, room);
        }
    }
    line[n++] = '\n';

    /* one write(2) per line so lines from several workers never interleave */
    wr = write(ric_log->fd, line, n);
    if (ric_log_stderr_too && ric_log->fd != 2 && level <= RIC_LOG_ERR) {
        wr = write(2, line, n);
    }
    (void) wr;
}

int
ric_log_open(ric_log_t *log, const char *path, int level)
{
    int fd;

    if (strcmp(path, "stderr") == 0) {
        log->fd = 2;
        log->path = NULL;
        log->level = level;
        return RIC_OK;
    }
    fd = ric_open_append(path);
    if (fd == -1) {
        return RIC_ERROR;
    }
    log->fd = fd;
    log->path = ric_xstrdup(path);
    log->level = level;
    return RIC_OK;
}

void
ric_log_use(ric_log_t *log)
{
    static ric_log_t current;

    if (ric_log != &default_log && ric_log != log && ric_log->fd > 2
        && ric_log->fd != log->fd) {
        close(ric_log->fd);
        free(ric_log->path);
    }
    current = *log;
    ric_log = &current;
}

int
ric_log_reopen(void)
{
    int fd;

    if (ric_log->path == NULL) {
        return RIC_OK;
    }
    fd = ric_open_append(ric_log->path);
    if (fd == -1) {
        ric_log_error(RIC_LOG_ALERT, errno, "could not reopen \"%s\"", ric_log->path);
        return RIC_ERROR;
    }
    if (dup2(fd, ric_log->fd) == -1) {
        close(fd);
        return RIC_ERROR;
    }
    close(fd);
    return RIC_OK;
}
