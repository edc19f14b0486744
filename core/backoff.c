/* backoff.c: jittered exponential backoff windows and the process's default random source. */
#include "backoff.h"

#include <math.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

int64_t
ric_backoff_window(const ric_backoff_t *b, int n)
{
    double w;

    if (b->max_ms <= 0) {
        return 0;
    }
    if (n <= 1 || !(b->factor > 1.0) || b->initial_ms >= b->max_ms) {
        return ric_max(ric_min(b->initial_ms, b->max_ms), 0);
    }

    /* In double, where a huge n or factor gives inf rather than UB; pow
     * keeps it O(1) even for a factor just above 1 and n in the billions.
     * The comparison is written so that inf (and NaN) select max. */
    w = (double) b->initial_ms * pow(b->factor, (double) n - 1.0);
    if (!(w < (double) b->max_ms)) {
        return b->max_ms;
    }
    /* w < max_ms <= INT64_MAX, so the conversion is defined; fractions of a
     * millisecond are dropped (250 * 1.5^2 = 562.5 -> 562). */
    return ric_max(ric_min((int64_t) w, b->max_ms), 0);
}

void
ric_backoff_range(const ric_backoff_t *b, int n, int64_t *lo, int64_t *hi)
{
    int64_t w = ric_backoff_window(b, n);

    switch (b->jitter) {
    case RIC_JITTER_EQUAL:
        *lo = w / 2;
        *hi = w;
        break;
    case RIC_JITTER_NONE:
        *lo = w;
        *hi = w;
        break;
    case RIC_JITTER_FULL:
    default:
        *lo = 0;
        *hi = w;
        break;
    }
}

/* rnd is called at most once, and not at all when the range is a single
 * value (jitter=none, or a zero window), so a test's fixed sequence of draws
 * maps to the waits that needed one. A NULL rnd means ric_backoff_rand. */
int64_t
ric_backoff_wait(const ric_backoff_t *b, int n, ric_rand_pt rnd, void *ctx)
{
    int64_t lo, hi;
    uint64_t r;

    ric_backoff_range(b, n, &lo, &hi);
    if (hi <= lo) {
        return lo;
    }
    r = (rnd ? rnd : ric_backoff_rand)(ctx);
    /* The modulo bias is below span / 2^64: irrelevant for waits in ms. */
    return lo + (int64_t) (r % (uint64_t) (hi - lo));
}

/* splitmix64 (Steele, Lea, Flood 2014): fast, passes BigCrush, and every
 * state (even 0) is fine, so any seed will do. */
static uint64_t rand_state;
static pid_t rand_pid; /* the process that seeded rand_state; 0 = unseeded */

static uint64_t
splitmix64_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void
seed_rand(pid_t pid)
{
    uint64_t seed;
    struct timespec ts;

    /* GRND_NONBLOCK: a worker never blocks, even on an unready entropy pool
     * at early boot; the fallback is plenty for jitter. */
    if (getrandom(&seed, sizeof(seed), GRND_NONBLOCK) != (ssize_t) sizeof(seed)) {
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = ((uint64_t) ts.tv_sec * 1000000000ULL + (uint64_t) ts.tv_nsec)
               ^ ((uint64_t) pid << 32) ^ (uint64_t) (uintptr_t) &ts;
    }
    rand_state = seed;
    rand_pid = pid;
}

uint64_t
ric_backoff_rand(void *ctx)
{
    pid_t pid = getpid();

    (void) ctx;
    /* Workers are forked from the master: a changed pid means a new process
     * that would otherwise replay its siblings' jitter in lockstep. */
    if (pid != rand_pid) {
        seed_rand(pid);
    }
    return splitmix64_next(&rand_state);
}

static const char *const jitter_names[] = {
    [RIC_JITTER_FULL] = "full",
    [RIC_JITTER_EQUAL] = "equal",
    [RIC_JITTER_NONE] = "none",
};

int
ric_backoff_parse_jitter(const char *s, ric_jitter_t *out)
{
    static const char prefix[] = "jitter=";
    size_t i;

    if (s == NULL || strncmp(s, prefix, sizeof(prefix) - 1) != 0) {
        return RIC_ERROR;
    }
    s += sizeof(prefix) - 1;
    for (i = 0; i < ric_nelems(jitter_names); i++) {
        if (strcmp(s, jitter_names[i]) == 0) {
            *out = (ric_jitter_t) i;
            return RIC_OK;
        }
    }
    return RIC_ERROR;
}

const char *
ric_backoff_jitter_name(ric_jitter_t j)
{
    if ((unsigned) j < ric_nelems(jitter_names)) {
        return jitter_names[j];
    }
    return "unknown";
}
