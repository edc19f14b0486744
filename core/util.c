/* util.c: allocation wrappers, assertion failure and small string helpers. */
#include "ric_core.h"

#include <stdio.h>
#include <time.h>

int64_t
ric_now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t
ric_now_ms(void)
{
    return ric_now_us() / 1000;
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
ric_str_eq_lower(ric_str_t s, const char *lower)
{
    size_t i;

    for (i = 0; i < s.len; i++) {
        u_char c = s.data[i];
        if (lower[i] == '\0') {
            return 0;
        }
        if (c >= 'A' && c <= 'Z') {
            c |= 0x20;
        }
        if (c != (u_char) lower[i]) {
            return 0;
        }
    }
    return lower[i] == '\0';
}
