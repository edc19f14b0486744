/* clock.c: the monotonic clock, read once per turn of a worker's event
 * loop; the wall clock and the HTTP Date.
 *
 * A worker's callbacks read "now" a dozen times a request (deadlines,
 * durations, a peer's idle time), and each clock_gettime costs about
 * 45 ns. As nginx's cached time, a worker reads the clock once a turn of
 * its loop: ric_clock_dispatch runs the loop one turn (one wait and the
 * callbacks it wakes) at a time and forgets the moment between turns;
 * the turn's first ric_now_* reads the clock, the others get that
 * moment. Libevent arms its timers from its own moment of the same turn,
 * so a deadline and the timer that enforces it agree. Outside the loop
 * (startup, the master, a unit test, a store's last writes at exit)
 * every call reads the clock. What must be exact within a turn (a script
 * hook's 50 ms bound, a seed) reads ric_now_exact_us(). The turn's
 * moment is also published once a turn, where the watchdog looks
 * (ric_clock_publish): a store, no clock read of its own. */
#include "ric_core.h"

#include <event2/event.h>
#include <time.h>

static struct event_base *turning; /* the loop ric_clock_dispatch runs */
static int64_t turn_us = -1;       /* this turn's moment; -1 not read yet */
static int64_t *published;         /* where each turn's moment goes; NULL: nowhere */
static int publish_due;            /* this turn's moment is not published yet */

int64_t
ric_now_exact_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int
ric_clock_dispatch(struct event_base *base)
{
    int rc;

    turning = base;
    do {
        turn_us = -1;
        publish_due = 1;
        rc = event_base_loop(base, EVLOOP_ONCE);
    } while (rc == 0 && !event_base_got_break(base) && !event_base_got_exit(base));
    turning = NULL;
    return rc;
}

void
ric_clock_update(void)
{
    if (turning != NULL) {
        event_base_update_cache_time(turning); /* libevent's timers too */
        turn_us = -1;
    }
}

int64_t
ric_now_us(void)
{
    if (turning == NULL) {
        return ric_now_exact_us();
    }
    if (turn_us < 0) {
        turn_us = ric_now_exact_us();
        if (publish_due && published != NULL) {
            /* once a turn: a moment re-read after a long call is not a new turn */
            __atomic_store_n(published, turn_us, __ATOMIC_RELAXED);
            publish_due = 0;
        }
    }
    return turn_us;
}

void
ric_clock_publish(int64_t *where)
{
    published = where;
}

int64_t
ric_now_ms(void)
{
    return ric_now_us() / 1000;
}

int64_t
ric_wall_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

const char *
ric_date_now(void)
{
    static char date[40];
    static time_t date_sec = -1;
    struct tm tm;
    time_t now = time(NULL); /* the vDSO's: no system call */

    if (now != date_sec) {
        date_sec = now;
        gmtime_r(&now, &tm);
        strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    }
    return date;
}
