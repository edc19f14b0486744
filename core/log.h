/* log.h: the error log, with nginx's levels; the level is checked before arguments are evaluated. */
#ifndef RIC_LOG_H
#define RIC_LOG_H

#include "ric_core.h"

#include <stdarg.h>

enum {
    RIC_LOG_EMERG = 0,
    RIC_LOG_ALERT,
    RIC_LOG_CRIT,
    RIC_LOG_ERR,
    RIC_LOG_WARN,
    RIC_LOG_NOTICE,
    RIC_LOG_INFO,
    RIC_LOG_DEBUG
};

struct ric_log_s {
    int fd;      /* where lines go; 2 for stderr */
    int level;   /* lines above this level are dropped */
    char *path;  /* resolved file path, NULL for stderr; owned */
};

/* The process-wide log every module writes to. */
extern ric_log_t *ric_log;

/* While set (during start-up), lines at "error" and worse also go to
 * stderr when the log is a file, so a failed start says why on the
 * terminal, as nginx does. */
extern int ric_log_stderr_too;

#define ric_log_error(lvl, err, ...)                                        \
    do {                                                                   \
        if ((lvl) <= ric_log->level) {                                     \
            ric_log_write((lvl), (err), __VA_ARGS__);                      \
        }                                                                  \
    } while (0)

#ifdef RIC_DEBUG
#define ric_log_debug(...) ric_log_error(RIC_LOG_DEBUG, 0, __VA_ARGS__)
#else
#define ric_log_debug(...) ((void) 0)
#endif

/* The longest line, its newline included: PIPE_BUF, so a line is one
 * atomic write on a pipe (stderr) as on a file. */
#define RIC_LOG_LINE_MAX 4096

/* Writes one line "TIME [level] PID: message[ (errno: strerror)]", cut at
 * RIC_LOG_LINE_MAX. The message's newlines, carriage returns and tabs go
 * as \n \r \t, its other control bytes, DEL and backslash as \xNN, so
 * nothing it carries (a script's text, a client's) can start a line of its
 * own or pass for one. err is an errno value or 0. Never fails the
 * caller; a short write is dropped. */
void ric_log_write(int level, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* How many bytes of s (len bytes) fit in width characters of a line once
 * escaped as ric_log_write escapes them: a caller cuts a part of its
 * message there to keep room for what follows. */
size_t ric_log_fit(const char *s, size_t len, size_t width);

/* Level name → number, -1 if unknown. */
int ric_log_level_parse(const char *name);
const char *ric_log_level_name(int level);

/* Opens path for appending ("stderr" means fd 2) into log. Returns RIC_OK, or
 * RIC_ERROR with errno set and log unchanged. */
int ric_log_open(ric_log_t *log, const char *path, int level);

/* Makes the process log point at `log` (its fd and path are taken over). */
void ric_log_use(ric_log_t *log);

/* Reopens the current log file (SIGUSR1 / -s reopen); keeps the old fd on error. */
int ric_log_reopen(void);

#endif /* RIC_LOG_H */
