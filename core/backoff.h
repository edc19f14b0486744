/* backoff.h: jittered exponential backoff as pure functions, with an injectable random source. */
#ifndef RIC_BACKOFF_H
#define RIC_BACKOFF_H

#include "ric_core.h"

typedef enum {
    RIC_JITTER_FULL = 0, /* rand[0, w) — the default (AWS "full jitter") */
    RIC_JITTER_EQUAL,    /* w/2 + rand[0, w/2) */
    RIC_JITTER_NONE      /* w */
} ric_jitter_t;

typedef struct {
    int64_t initial_ms; /* > 0 */
    int64_t max_ms;     /* >= initial_ms */
    double factor;      /* >= 1 */
    ric_jitter_t jitter;
} ric_backoff_t;

/* A source of uniformly distributed 64-bit values; tests inject their own. */
typedef uint64_t (*ric_rand_pt)(void *ctx);

/* The window before retry n (n = 1 is the wait before the second attempt):
 * min(max, initial * factor^(n-1)) in ms. Never overflows, whatever n
 * (n <= 0 is treated as 1). */
int64_t ric_backoff_window(const ric_backoff_t *b, int n);

/* The bounds [lo, hi) of the wait before retry n for b's jitter, in ms:
 * full [0, w), equal [w/2, w), none [w, w] (lo == hi == w). */
void ric_backoff_range(const ric_backoff_t *b, int n, int64_t *lo, int64_t *hi);

/* A wait before retry n drawn from ric_backoff_range with rnd(ctx), in ms:
 * lo + (r mod (hi - lo)), or lo when hi == lo. */
int64_t ric_backoff_wait(const ric_backoff_t *b, int n, ric_rand_pt rnd, void *ctx);

/* The process's default random source (seeded from the OS once per worker,
 * not cryptographic). */
uint64_t ric_backoff_rand(void *ctx);

/* Parses "jitter=full|equal|none"; RIC_OK or RIC_ERROR. */
int ric_backoff_parse_jitter(const char *s, ric_jitter_t *out);
const char *ric_backoff_jitter_name(ric_jitter_t j);

#endif /* RIC_BACKOFF_H */
