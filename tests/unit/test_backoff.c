/* test_backoff.c: backoff windows, jitter ranges, injected random draws and jitter parsing. */
#include "../../core/backoff.c"
#include "unit.h"

#include <limits.h>
#include <sys/wait.h>

/* A fixed sequence of draws, counting how many were taken. */
typedef struct {
    const uint64_t *values;
    size_t n;
    size_t next;
} seq_t;

static uint64_t
seq_rand(void *ctx)
{
    seq_t *s = ctx;
    uint64_t v = s->values[s->next % s->n];

    s->next++;
    return v;
}

/* A deterministic PRNG for the spread test: splitmix64 from a fixed seed. */
static uint64_t
fixed_rand(void *ctx)
{
    return splitmix64_next(ctx);
}

static ric_backoff_t
policy(int64_t initial, int64_t max, double factor, ric_jitter_t jitter)
{
    ric_backoff_t b = { initial, max, factor, jitter };
    return b;
}

static void
test_windows(void)
{
    static const int64_t want[] = { 250, 500, 1000, 2000, 4000, 5000, 5000, 5000 };
    ric_backoff_t b = policy(250, 5000, 2, RIC_JITTER_FULL);
    ric_backoff_t huge = policy(INT64_MAX / 2, INT64_MAX, 10, RIC_JITTER_FULL);
    ric_backoff_t tiny = policy(1, INT64_MAX, 1.0000001, RIC_JITTER_FULL);
    size_t i;

    UNIT_CASE("the DESIGN default: 250ms 5s 2");
    for (i = 0; i < ric_nelems(want); i++) {
        UNIT_CHECK_INT(ric_backoff_window(&b, (int) i + 1), want[i]);
    }
    UNIT_CHECK_INT(ric_backoff_window(&b, 100), 5000);
    UNIT_CHECK_INT(ric_backoff_window(&b, INT_MAX), 5000);

    UNIT_CASE("n <= 0 is treated as 1");
    UNIT_CHECK_INT(ric_backoff_window(&b, 0), 250);
    UNIT_CHECK_INT(ric_backoff_window(&b, -1), 250);
    UNIT_CHECK_INT(ric_backoff_window(&b, INT_MIN), 250);

    UNIT_CASE("factor 1: constant");
    b = policy(300, 5000, 1, RIC_JITTER_FULL);
    UNIT_CHECK_INT(ric_backoff_window(&b, 1), 300);
    UNIT_CHECK_INT(ric_backoff_window(&b, 2), 300);
    UNIT_CHECK_INT(ric_backoff_window(&b, 1000), 300);
    UNIT_CHECK_INT(ric_backoff_window(&b, INT_MAX), 300);

    UNIT_CASE("factor 1.5: fractions of a ms are dropped");
    b = policy(250, 5000, 1.5, RIC_JITTER_FULL);
    UNIT_CHECK_INT(ric_backoff_window(&b, 1), 250);
    UNIT_CHECK_INT(ric_backoff_window(&b, 2), 375);
    UNIT_CHECK_INT(ric_backoff_window(&b, 3), 562);
    UNIT_CHECK_INT(ric_backoff_window(&b, 4), 843);
    UNIT_CHECK_INT(ric_backoff_window(&b, 5), 1265);
    UNIT_CHECK_INT(ric_backoff_window(&b, 9), 5000); /* 6407.2 */
    UNIT_CHECK_INT(ric_backoff_window(&b, 8), 4271);

    UNIT_CASE("factor 10: capped at max, never overflowing");
    b = policy(100, 60000, 10, RIC_JITTER_FULL);
    UNIT_CHECK_INT(ric_backoff_window(&b, 0), 100);
    UNIT_CHECK_INT(ric_backoff_window(&b, 1), 100);
    UNIT_CHECK_INT(ric_backoff_window(&b, 3), 10000);
    UNIT_CHECK_INT(ric_backoff_window(&b, 4), 60000);
    UNIT_CHECK_INT(ric_backoff_window(&b, 64), 60000);
    UNIT_CHECK_INT(ric_backoff_window(&b, 1000), 60000);
    UNIT_CHECK_INT(ric_backoff_window(&b, 1000000000), 60000);
    UNIT_CHECK_INT(ric_backoff_window(&b, INT_MAX), 60000);

    UNIT_CASE("a huge initial and max: no overflow near INT64_MAX");
    UNIT_CHECK_INT(ric_backoff_window(&huge, 1), INT64_MAX / 2);
    UNIT_CHECK_INT(ric_backoff_window(&huge, 2), INT64_MAX);
    UNIT_CHECK_INT(ric_backoff_window(&huge, 64), INT64_MAX);
    UNIT_CHECK_INT(ric_backoff_window(&huge, 1000000000), INT64_MAX);
    UNIT_CHECK_INT(ric_backoff_window(&huge, INT_MAX), INT64_MAX);

    UNIT_CASE("a factor just above 1 and n in the billions: O(1), capped");
    UNIT_CHECK_INT(ric_backoff_window(&tiny, 2), 1);
    UNIT_CHECK_INT(ric_backoff_window(&tiny, INT_MAX), INT64_MAX);

    UNIT_CASE("initial == max");
    b = policy(700, 700, 3, RIC_JITTER_FULL);
    UNIT_CHECK_INT(ric_backoff_window(&b, 1), 700);
    UNIT_CHECK_INT(ric_backoff_window(&b, 50), 700);
}

static void
test_ranges(void)
{
    ric_backoff_t b = policy(250, 5000, 2, RIC_JITTER_FULL);
    int64_t lo = -1, hi = -1;

    UNIT_CASE("full jitter: [0, w)");
    ric_backoff_range(&b, 1, &lo, &hi);
    UNIT_CHECK_INT(lo, 0);
    UNIT_CHECK_INT(hi, 250);
    ric_backoff_range(&b, 10, &lo, &hi);
    UNIT_CHECK_INT(lo, 0);
    UNIT_CHECK_INT(hi, 5000);

    UNIT_CASE("equal jitter: [w/2, w)");
    b.jitter = RIC_JITTER_EQUAL;
    ric_backoff_range(&b, 1, &lo, &hi);
    UNIT_CHECK_INT(lo, 125);
    UNIT_CHECK_INT(hi, 250);
    ric_backoff_range(&b, 3, &lo, &hi);
    UNIT_CHECK_INT(lo, 500);
    UNIT_CHECK_INT(hi, 1000);
    b = policy(3, 5000, 1, RIC_JITTER_EQUAL);
    ric_backoff_range(&b, 1, &lo, &hi);
    UNIT_CHECK_INT(lo, 1);
    UNIT_CHECK_INT(hi, 3);

    UNIT_CASE("no jitter: [w, w]");
    b = policy(250, 5000, 2, RIC_JITTER_NONE);
    ric_backoff_range(&b, 2, &lo, &hi);
    UNIT_CHECK_INT(lo, 500);
    UNIT_CHECK_INT(hi, 500);
    ric_backoff_range(&b, 99, &lo, &hi);
    UNIT_CHECK_INT(lo, 5000);
    UNIT_CHECK_INT(hi, 5000);
}

static void
test_wait_exact(void)
{
    static const uint64_t draws[] = { 0, UINT64_MAX, 1000, 1023, 1024, 249, 250, 251 };
    ric_backoff_t b = policy(1024, 65536, 2, RIC_JITTER_FULL);
    seq_t s = { draws, ric_nelems(draws), 0 };

    UNIT_CASE("full jitter, w = 1024: lo + r mod (hi - lo)");
    UNIT_CHECK_INT(ric_backoff_wait(&b, 1, seq_rand, &s), 0);
    UNIT_CHECK_INT(ric_backoff_wait(&b, 1, seq_rand, &s), 1023);
    UNIT_CHECK_INT(ric_backoff_wait(&b, 1, seq_rand, &s), 1000);
    UNIT_CHECK_INT(ric_backoff_wait(&b, 1, seq_rand, &s), 1023);
    UNIT_CHECK_INT(ric_backoff_wait(&b, 1, seq_rand, &s), 0);
    UNIT_CHECK_INT(s.next, 5);

    UNIT_CASE("equal jitter, w = 2048: [1024, 2048)");
    b.jitter = RIC_JITTER_EQUAL;
    s.next = 0;
    UNIT_CHECK_INT(ric_backoff_wait(&b, 2, seq_rand, &s), 1024);
    UNIT_CHECK_INT(ric_backoff_wait(&b, 2, seq_rand, &s), 2047);
    UNIT_CHECK_INT(ric_backoff_wait(&b, 2, seq_rand, &s), 1024 + 1000);
    UNIT_CHECK_INT(s.next, 3);

    UNIT_CASE("the default 250ms: r mod 250, including UINT64_MAX");
    b = policy(250, 5000, 2, RIC_JITTER_FULL);
    s.next = 0;
    UNIT_CHECK_INT(ric_backoff_wait(&b, 1, seq_rand, &s), 0);
    UNIT_CHECK_INT(ric_backoff_wait(&b, 1, seq_rand, &s), (int64_t) (UINT64_MAX % 250));
    UNIT_CHECK_INT(ric_backoff_wait(&b, 1, seq_rand, &s), 0);   /* 1000 */
    UNIT_CHECK_INT(ric_backoff_wait(&b, 1, seq_rand, &s), 23);  /* 1023 */
    UNIT_CHECK_INT(ric_backoff_wait(&b, 1, seq_rand, &s), 24);  /* 1024 */
    UNIT_CHECK_INT(ric_backoff_wait(&b, 1, seq_rand, &s), 249); /* hi - 1 */
    UNIT_CHECK_INT(ric_backoff_wait(&b, 1, seq_rand, &s), 0);   /* 250 */
    UNIT_CHECK_INT(ric_backoff_wait(&b, 1, seq_rand, &s), 1);   /* 251 */
    UNIT_CHECK_INT(s.next, 8);

    UNIT_CASE("the default at the cap: [0, 5000)");
    s.next = 0;
    UNIT_CHECK_INT(ric_backoff_wait(&b, 7, seq_rand, &s), 0);
    UNIT_CHECK_INT(ric_backoff_wait(&b, 7, seq_rand, &s), (int64_t) (UINT64_MAX % 5000));

    UNIT_CASE("no jitter: the window itself, no draw taken");
    b.jitter = RIC_JITTER_NONE;
    s.next = 0;
    UNIT_CHECK_INT(ric_backoff_wait(&b, 1, seq_rand, &s), 250);
    UNIT_CHECK_INT(ric_backoff_wait(&b, 3, seq_rand, &s), 1000);
    UNIT_CHECK_INT(ric_backoff_wait(&b, INT_MAX, seq_rand, &s), 5000);
    UNIT_CHECK_INT(s.next, 0);

    UNIT_CASE("a one-value range with jitter: lo, no draw taken");
    b = policy(1, 1, 1, RIC_JITTER_EQUAL); /* [0, 1) */
    s.next = 1;                            /* next draw: UINT64_MAX */
    UNIT_CHECK_INT(ric_backoff_wait(&b, 1, seq_rand, &s), 0);
    UNIT_CHECK_INT(s.next, 2);
}

static void
test_spread(void)
{
    ric_backoff_t b = policy(250, 5000, 2, RIC_JITTER_FULL);
    uint64_t state = 42;
    int64_t lo, hi, w, sum;
    int bins[10], i, j, all_in, all_bins;
    ric_jitter_t modes[] = { RIC_JITTER_FULL, RIC_JITTER_EQUAL };
    double mean, mid;
    size_t m;

    for (m = 0; m < ric_nelems(modes); m++) {
        b.jitter = modes[m];
        UNIT_CASE(modes[m] == RIC_JITTER_FULL ? "spread: full jitter, 10000 draws"
                                              : "spread: equal jitter, 10000 draws");
        ric_backoff_range(&b, 4, &lo, &hi);
        memset(bins, 0, sizeof(bins));
        sum = 0;
        all_in = 1;
        for (i = 0; i < 10000; i++) {
            w = ric_backoff_wait(&b, 4, fixed_rand, &state);
            if (w < lo || w >= hi) {
                all_in = 0;
                continue;
            }
            sum += w;
            bins[(w - lo) * 10 / (hi - lo)]++;
        }
        mean = (double) sum / 10000;
        mid = (double) (lo + hi) / 2;
        all_bins = 1;
        for (j = 0; j < 10; j++) {
            all_bins &= bins[j] > 0;
        }
        UNIT_CHECK(all_in);
        UNIT_CHECK(mean > mid * 0.95 && mean < mid * 1.05);
        UNIT_CHECK(all_bins);
    }
}

static void
test_default_rand(void)
{
    uint64_t a, c, parent[4], child[4];
    int fds[2], status, i, differ = 0;
    pid_t pid;

    UNIT_CASE("the default source: varies, and a forked child reseeds");
    a = ric_backoff_rand(NULL);
    c = ric_backoff_rand(NULL);
    UNIT_CHECK(a != c);
    UNIT_CHECK(rand_pid == getpid());

    if (pipe(fds) != 0) {
        UNIT_CHECK(0);
        return;
    }
    pid = fork();
    if (pid == 0) {
        for (i = 0; i < 4; i++) {
            child[i] = ric_backoff_rand(NULL);
        }
        _exit(write(fds[1], child, sizeof(child)) == (ssize_t) sizeof(child) ? 0 : 1);
    }
    UNIT_CHECK(pid > 0);
    for (i = 0; i < 4; i++) {
        parent[i] = ric_backoff_rand(NULL);
    }
    close(fds[1]);
    UNIT_CHECK(read(fds[0], child, sizeof(child)) == (ssize_t) sizeof(child));
    close(fds[0]);
    waitpid(pid, &status, 0);
    UNIT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    for (i = 0; i < 4; i++) {
        differ |= parent[i] != child[i];
    }
    UNIT_CHECK(differ);

    UNIT_CASE("a NULL source means the default one");
    {
        ric_backoff_t b = policy(1000, 1000, 1, RIC_JITTER_FULL);
        int64_t w = ric_backoff_wait(&b, 1, NULL, NULL);
        UNIT_CHECK(w >= 0 && w < 1000);
    }
}

static void
test_jitter_names(void)
{
    static const char *const bad[] = {
        "", "full", "jitter=", "jitter=Full", "jitter=fullx", "jitter=ful",
        "jitter =full", "Jitter=full", "jitter=full ", " jitter=full", "jitter:full",
        "jitter=random",
    };
    ric_jitter_t j = RIC_JITTER_NONE;
    size_t i;

    UNIT_CASE("parse_jitter: the three modes");
    UNIT_CHECK_INT(ric_backoff_parse_jitter("jitter=full", &j), RIC_OK);
    UNIT_CHECK_INT(j, RIC_JITTER_FULL);
    UNIT_CHECK_INT(ric_backoff_parse_jitter("jitter=equal", &j), RIC_OK);
    UNIT_CHECK_INT(j, RIC_JITTER_EQUAL);
    UNIT_CHECK_INT(ric_backoff_parse_jitter("jitter=none", &j), RIC_OK);
    UNIT_CHECK_INT(j, RIC_JITTER_NONE);

    UNIT_CASE("parse_jitter: anything else, output untouched");
    j = RIC_JITTER_EQUAL;
    for (i = 0; i < ric_nelems(bad); i++) {
        UNIT_CHECK_INT(ric_backoff_parse_jitter(bad[i], &j), RIC_ERROR);
    }
    UNIT_CHECK_INT(ric_backoff_parse_jitter(NULL, &j), RIC_ERROR);
    UNIT_CHECK_INT(j, RIC_JITTER_EQUAL);

    UNIT_CASE("jitter_name");
    UNIT_CHECK_STR(ric_backoff_jitter_name(RIC_JITTER_FULL), "full");
    UNIT_CHECK_STR(ric_backoff_jitter_name(RIC_JITTER_EQUAL), "equal");
    UNIT_CHECK_STR(ric_backoff_jitter_name(RIC_JITTER_NONE), "none");
    UNIT_CHECK_STR(ric_backoff_jitter_name((ric_jitter_t) 7), "unknown");
}

int
main(void)
{
    test_windows();
    test_ranges();
    test_wait_exact();
    test_spread();
    test_default_rand();
    test_jitter_names();
    return UNIT_DONE("backoff");
}
