/* ric_core.h: shared types, return codes and forward declarations for the core. */
#ifndef RIC_CORE_H
#define RIC_CORE_H

#include "list.h"
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <sys/types.h>

#define RIC_VERSION "0.1.0"

/* Integer results used across the core (nginx's convention). */
#define RIC_OK 0
#define RIC_ERROR -1
#define RIC_AGAIN -2
#define RIC_DONE -4
#define RIC_DECLINED -5

typedef unsigned char u_char;

/* A borrowed byte span: never owns its data. */
typedef struct {
    const u_char *data;
    size_t len;
} ric_str_t;

#define ric_string(s) { (const u_char *) (s), sizeof(s) - 1 }
#define ric_null_string { NULL, 0 }

typedef struct ric_log_s ric_log_t;
typedef struct ric_conf_s ric_conf_t;
typedef struct ric_http_conf_s ric_http_conf_t;
typedef struct ric_server_conf_s ric_server_conf_t;
typedef struct ric_location_conf_s ric_location_conf_t;
typedef struct ric_upstream_conf_s ric_upstream_conf_t;
typedef struct ric_listen_s ric_listen_t;
typedef struct ric_http_msg_s ric_http_msg_t;
typedef struct ric_http_chunked_s ric_http_chunked_t;
typedef struct ric_conn_s ric_conn_t;
typedef struct ric_buf_s ric_buf_t;
typedef struct ric_worker_s ric_worker_t;
typedef struct ric_request_s ric_request_t;
typedef struct ric_attempt_s ric_attempt_t;
typedef struct ric_http1_s ric_http1_t;
typedef struct ric_upload_s ric_upload_t;
typedef struct ric_route_metrics_s ric_route_metrics_t;       /* metrics.h */
typedef struct ric_upstream_metrics_s ric_upstream_metrics_t;

/* A pending asynchronous operation of a request (a timer, a store's
 * lookup...): the request's finalize cancels every one still pending, so
 * a late callback never touches a freed request (request.h). */
typedef struct ric_async_s ric_async_t;
struct ric_async_s {
    void (*cancel)(ric_async_t *a);
    void *data;
    ric_link_t link; /* in the request's list while pending */
    int pending;
};

/* Checks our own invariants only; never input from a peer, config or script. */
#define ric_assert(expr)                                                   \
    do {                                                                   \
        if (!(expr)) {                                                     \
            ric_assert_fail(#expr, __FILE__, __LINE__);                    \
        }                                                                  \
    } while (0)

void ric_assert_fail(const char *expr, const char *file, int line)
    __attribute__((noreturn));

/* Small fixed allocations: abort on out-of-memory (STYLE.md, Errors). */
void *ric_xmalloc(size_t n);
void *ric_xcalloc(size_t count, size_t n);
void *ric_xrealloc(void *p, size_t n);
char *ric_xstrdup(const char *s);

#define ric_nelems(a) (sizeof(a) / sizeof((a)[0]))
#define ric_min(a, b) ((a) < (b) ? (a) : (b))
#define ric_max(a, b) ((a) > (b) ? (a) : (b))

/* The one monotonic clock: every deadline and duration is read from it
 * (clock.c). Within a turn of ric_clock_dispatch's loop, ric_now_* is the
 * turn's moment, read once; elsewhere, and ric_now_exact_us always, the
 * clock itself. */
struct event_base;
int64_t ric_now_ms(void);
int64_t ric_now_us(void);
int64_t ric_now_exact_us(void);
int ric_clock_dispatch(struct event_base *base); /* event_base_dispatch, a turn at a time */
void ric_clock_update(void); /* after a long callback: the moment read again */
/* Each turn's moment is stored at *where (relaxed, once a turn, at the
 * turn's first ric_now_*; where is the worker's watchdog slot); NULL: no
 * more. */
void ric_clock_publish(int64_t *where);
int64_t ric_wall_ms(void); /* the wall clock, for what is shown to people */

/* Opens a log file for appending (created 0644). A FIFO nobody reads
 * fails at once (ENXIO) instead of blocking; writes then block as to a
 * file. -1 with errno. */
int ric_open_append(const char *path);

/* The wall clock as an HTTP Date value (IMF-fixdate), made once a second. */
const char *ric_date_now(void);

/* A libevent timeout of ms milliseconds (negative: 0). */
struct timeval ric_ms_to_tv(int64_t ms);

/* A growable byte buffer (heads being built); owns data. */
struct ric_buf_s {
    u_char *data;
    size_t len;
    size_t size;
};

/* Makes room for n more bytes (aborts on out-of-memory). */
void ric_buf_grow(ric_buf_t *b, size_t n);

/* Appends n bytes (growing the buffer when it must). Inline: heads are
 * built of many short pieces. */
static inline void
ric_buf_put(ric_buf_t *b, const void *p, size_t n)
{
    if (b->len + n > b->size) {
        ric_buf_grow(b, n);
    }
    if (n > 0) {
        memcpy(b->data + b->len, p, n);
    }
    b->len += n;
}

/* Appends a NUL-terminated string (a literal's length is known when compiled). */
static inline void
ric_buf_puts(ric_buf_t *b, const char *s)
{
    ric_buf_put(b, s, strlen(s));
}

/* Writes v in decimal at out (20 bytes at most, no NUL); returns the length. */
size_t ric_u64_to_dec(uint64_t v, u_char *out);

/* Appends v in decimal. */
void ric_buf_put_u64(ric_buf_t *b, uint64_t v);
/* Appends printf's output, however long. */
void ric_buf_printf(ric_buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void ric_buf_vprintf(ric_buf_t *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
void ric_buf_free(ric_buf_t *b);

/* A random (version 4) UUID, lowercase, NUL-terminated in out[37]. */
void ric_uuid_v4(char *out);

/* The bytes of s, lowercased, equal lower's (n of them). */
int ric_str_eq_lower_n(ric_str_t s, const char *lower, size_t n);

/* Case-insensitive comparison of a span with a NUL-terminated lowercase
 * literal. Inline, so that a literal's length is known when compiled and
 * a span of another length costs one comparison. */
static inline int
ric_str_eq_lower(ric_str_t s, const char *lower)
{
    size_t n = strlen(lower);

    return s.len == n && ric_str_eq_lower_n(s, lower, n);
}

/* Whether freed objects of the hot path (request pools, attempts, I/O
 * buffers) are kept for the next request. Not under AddressSanitizer,
 * which then catches a use after free at once. */
#if defined(__SANITIZE_ADDRESS__)
#define RIC_RECYCLE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RIC_RECYCLE 0
#endif
#endif
#ifndef RIC_RECYCLE
#define RIC_RECYCLE 1
#endif

/* Freed objects of one kind kept for the next (a worker's attempts,
 * connections, response and head buffers, pipes): a stack linked through
 * the first bytes of each kept object, at most max long, always empty
 * when RIC_RECYCLE is 0. */
typedef struct {
    void *top;
    int n;
    int max;
} ric_keep_t;

#define RIC_KEEP(max) { NULL, 0, (max) }

/* A kept object (its first pointer's worth of bytes overwritten), or NULL. */
void *ric_keep_take(ric_keep_t *k);

/* Keeps obj: 1; 0 when the stack is full (or recycling is off): the
 * caller frees it. */
int ric_keep_give(ric_keep_t *k, void *obj);

#endif /* RIC_CORE_H */
