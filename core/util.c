/* util.c: allocation wrappers, assertion failure and small string helpers. */
#include "ric_core.h"

#include <openssl/rand.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

int
ric_open_append(const char *path)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0644);

    if (fd != -1) {
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    }
    return fd;
}

struct timeval
ric_ms_to_tv(int64_t ms)
{
    struct timeval tv;

    if (ms < 0) {
        ms = 0;
    }
    tv.tv_sec = (time_t) (ms / 1000);
    tv.tv_usec = (suseconds_t) (ms % 1000) * 1000;
    return tv;
}

void
ric_assert_fail(const char *expr, const char *file, int line)
{
    fprintf(stderr, "ricochet: assertion \"%s\" failed at %s:%d\n", expr, file, line);
    abort();
}

void *
ric_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "ricochet: out of memory allocating %zu bytes\n", n);
        abort();
    }
    return p;
}

void *
ric_xcalloc(size_t count, size_t n)
{
    void *p = calloc(count ? count : 1, n ? n : 1);
    if (p == NULL) {
        fprintf(stderr, "ricochet: out of memory allocating %zu bytes\n", count * n);
        abort();
    }
    return p;
}

void *
ric_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (q == NULL) {
        fprintf(stderr, "ricochet: out of memory allocating %zu bytes\n", n);
        abort();
    }
    return q;
}

char *
ric_xstrdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = ric_xmalloc(n);
    memcpy(p, s, n);
    return p;
}

int
ric_str_eq_lower_n(ric_str_t s, const char *lower, size_t n)
{
    size_t i;
    u_char c;

    for (i = 0; i < n; i++) {
        c = s.data[i];
        if (c >= 'A' && c <= 'Z') {
            c |= 0x20;
        }
        if (c != (u_char) lower[i]) {
            return 0;
        }
    }
    return 1;
}

void *
ric_keep_take(ric_keep_t *k)
{
    void *obj = k->top;

    if (obj != NULL) {
        memcpy(&k->top, obj, sizeof(void *));
        k->n--;
    }
    return obj;
}

int
ric_keep_give(ric_keep_t *k, void *obj)
{
    if (!RIC_RECYCLE || k->n >= k->max) {
        return 0;
    }
    memcpy(obj, &k->top, sizeof(void *));
    k->top = obj;
    k->n++;
    return 1;
}

void
ric_buf_grow(ric_buf_t *b, size_t n)
{
    b->size = ric_max(b->size * 2, b->len + n + 256);
    b->data = ric_xrealloc(b->data, b->size);
}

size_t
ric_u64_to_dec(uint64_t v, u_char *out)
{
    u_char tmp[20];
    size_t n = 0, i;

    do {
        tmp[n++] = (u_char) ('0' + v % 10);
        v /= 10;
    } while (v > 0);
    for (i = 0; i < n; i++) {
        out[i] = tmp[n - 1 - i];
    }
    return n;
}

void
ric_buf_put_u64(ric_buf_t *b, uint64_t v)
{
    if (b->len + 20 > b->size) {
        ric_buf_grow(b, 20);
    }
    b->len += ric_u64_to_dec(v, b->data + b->len);
}

void
ric_buf_vprintf(ric_buf_t *b, const char *fmt, va_list ap)
{
    va_list again;
    int n;

    va_copy(again, ap);
    n = vsnprintf(NULL, 0, fmt, ap);
    if (n > 0) {
        if (b->len + (size_t) n + 1 > b->size) {
            b->size = ric_max(b->size * 2, b->len + (size_t) n + 256);
            b->data = ric_xrealloc(b->data, b->size);
        }
        vsnprintf((char *) b->data + b->len, (size_t) n + 1, fmt, again);
        b->len += (size_t) n;
    }
    va_end(again);
}

void
ric_buf_printf(ric_buf_t *b, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    ric_buf_vprintf(b, fmt, ap);
    va_end(ap);
}

void
ric_buf_free(ric_buf_t *b)
{
    free(b->data);
    b->data = NULL;
    b->len = b->size = 0;
}

void
ric_uuid_v4(char *out)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char b[16];
    int i, o = 0;

    if (RAND_bytes(b, sizeof(b)) != 1) {
        /* OpenSSL's generator failed: the time and the pid still make a
         * key that is unique enough to dedupe on, never a crash */
        int64_t t = ric_now_exact_us();
        pid_t pid = getpid();
        memset(b, 0, sizeof(b));
        memcpy(b, &t, sizeof(t));
        memcpy(b + 8, &pid, sizeof(pid));
    }
    b[6] = (unsigned char) ((b[6] & 0x0f) | 0x40);
    b[8] = (unsigned char) ((b[8] & 0x3f) | 0x80);
    for (i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) {
            out[o++] = '-';
        }
        out[o++] = hex[b[i] >> 4];
        out[o++] = hex[b[i] & 0xf];
    }
    out[o] = '\0';
}
