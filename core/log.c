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

void
ric_log_write(int level, int err, const char *fmt, ...)
{
    char line[2048];
    size_t n;
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

    va_start(ap, fmt);
    rc = vsnprintf(line + n, sizeof(line) - n, fmt, ap);
    va_end(ap);
    if (rc > 0) {
        n = ric_min(n + (size_t) rc, sizeof(line) - 1);
    }

    if (err != 0 && n < sizeof(line) - 1) {
        rc = snprintf(line + n, sizeof(line) - n, " (%d: %s)", err, strerror(err));
        if (rc > 0) {
            n = ric_min(n + (size_t) rc, sizeof(line) - 1);
        }
    }
    if (n >= sizeof(line) - 1) {
        n = sizeof(line) - 2;
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
