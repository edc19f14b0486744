/* unit.h: a tiny test harness; each suite prints "SUITE: N passed, N failed". */
#ifndef RIC_UNIT_H
#define RIC_UNIT_H

#include <stdio.h>
#include <string.h>

static int unit_passed;
static int unit_failed;
static const char *unit_case = "";

/* Marks the start of a named case; failures print it. */
#define UNIT_CASE(name) (unit_case = (name))

#define UNIT_CHECK(cond)                                                   \
    do {                                                                   \
        if (cond) {                                                        \
            unit_passed++;                                                 \
        } else {                                                           \
            unit_failed++;                                                 \
            fprintf(stderr, "  FAIL %s:%d [%s]: %s\n", __FILE__, __LINE__, \
                    unit_case, #cond);                                     \
        }                                                                  \
    } while (0)

#define UNIT_CHECK_INT(got, want)                                          \
    do {                                                                   \
        long long g_ = (long long) (got), w_ = (long long) (want);         \
        if (g_ == w_) {                                                    \
            unit_passed++;                                                 \
        } else {                                                           \
            unit_failed++;                                                 \
            fprintf(stderr, "  FAIL %s:%d [%s]: %s == %lld, want %lld\n",  \
                    __FILE__, __LINE__, unit_case, #got, g_, w_);          \
        }                                                                  \
    } while (0)

#define UNIT_CHECK_STR(got, want)                                          \
    do {                                                                   \
        const char *g_ = (got), *w_ = (want);                              \
        if (g_ != NULL && w_ != NULL && strcmp(g_, w_) == 0) {             \
            unit_passed++;                                                 \
        } else {                                                           \
            unit_failed++;                                                 \
            fprintf(stderr, "  FAIL %s:%d [%s]: %s == \"%s\", want \"%s\"\n", \
                    __FILE__, __LINE__, unit_case, #got, g_ ? g_ : "(null)", \
                    w_ ? w_ : "(null)");                                   \
        }                                                                  \
    } while (0)

/* Prints the suite's counts (read by tests/run) and returns the exit code. */
#define UNIT_DONE(suite)                                                   \
    (printf("%s: %d passed, %d failed\n", (suite), unit_passed, unit_failed), \
     unit_failed ? 1 : 0)

#ifdef RIC_CONF_H
#include <stdlib.h>
#include <unistd.h>

/* A config read from text, as the gateway reads its file (through a
 * temporary one); a config that does not load ends the suite. */
static inline ric_conf_t *
unit_conf_load(const char *text)
{
    char path[] = "/tmp/ric_unit_conf.XXXXXX", err[512];
    int fd = mkstemp(path);
    ric_conf_t *conf;

    if (fd == -1 || write(fd, text, strlen(text)) != (ssize_t) strlen(text)) {
        perror("mkstemp");
        exit(1);
    }
    close(fd);
    conf = ric_conf_load("/", path, err, sizeof(err));
    unlink(path);
    if (conf == NULL) {
        fprintf(stderr, "%s\n", err);
        exit(1);
    }
    return conf;
}
#endif

#endif /* RIC_UNIT_H */
