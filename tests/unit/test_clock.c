/* test_clock.c: the clock read once a turn of the loop, exact outside it
 * and when asked, read again after a long call. No timing assertion: a
 * callback waits until the exact clock has moved on, then checks what
 * the turn's clock says. */
#include "../../core/clock.c"
#include "unit.h"

#include <event2/event.h>

/* Waits until the exact clock is past t (it moves: no bound needed
 * beyond its own advance, and one microsecond comes quickly). */
static int64_t
wait_past(int64_t t)
{
    int64_t now;

    while ((now = ric_now_exact_us()) <= t) {
    }
    return now;
}

typedef struct {
    struct event_base *base;
    struct event *first, *second;
    int64_t turn_start, later_exact, second_turn;
    int turns;
} clock_case_t;

static void
on_second(evutil_socket_t fd, short what, void *arg)
{
    clock_case_t *c = arg;

    (void) fd;
    (void) what;
    c->turns++;
    c->second_turn = ric_now_us();
}

static void
on_first(evutil_socket_t fd, short what, void *arg)
{
    clock_case_t *c = arg;
    struct timeval zero = { 0, 0 };

    (void) fd;
    (void) what;
    c->turns++;
    UNIT_CASE("within a turn");
    c->turn_start = ric_now_us();
    c->later_exact = wait_past(c->turn_start + 1000);
    UNIT_CHECK_INT(ric_now_us(), c->turn_start); /* the turn's moment stands */
    UNIT_CHECK_INT(ric_now_ms(), c->turn_start / 1000);
    UNIT_CHECK(ric_now_exact_us() >= c->later_exact); /* the exact one moves */

    UNIT_CASE("read again after a long call");
    ric_clock_update();
    UNIT_CHECK(ric_now_us() >= c->later_exact);
    c->later_exact = wait_past(ric_now_us());
    event_add(c->second, &zero); /* the next turn */
}

static void
test_turns(void)
{
    clock_case_t c = { 0 };
    struct timeval zero = { 0, 0 };
    int64_t a, b;

    UNIT_CASE("outside a loop every read is the clock's");
    a = ric_now_us();
    b = wait_past(a);
    UNIT_CHECK(ric_now_us() >= b);
    UNIT_CHECK(ric_now_us() > a);

    c.base = event_base_new();
    c.first = evtimer_new(c.base, on_first, &c);
    c.second = evtimer_new(c.base, on_second, &c);
    event_add(c.first, &zero);
    UNIT_CHECK_INT(ric_clock_dispatch(c.base), 1); /* no events left: as event_base_dispatch */
    UNIT_CASE("the next turn reads the clock again");
    UNIT_CHECK_INT(c.turns, 2);
    UNIT_CHECK(c.second_turn >= c.later_exact);

    UNIT_CASE("after the loop, reads are the clock's again");
    a = ric_now_us();
    b = wait_past(a);
    UNIT_CHECK(ric_now_us() >= b);
    event_free(c.first);
    event_free(c.second);
    event_base_free(c.base);
}

static void
on_break(evutil_socket_t fd, short what, void *arg)
{
    (void) fd;
    (void) what;
    event_base_loopbreak(arg);
}

static void
test_break(void)
{
    struct event_base *base = event_base_new();
    struct event *persist = event_new(base, -1, EV_PERSIST, on_break, base);
    struct timeval tick = { 0, 1000 };

    UNIT_CASE("a loopbreak ends the loop, events still pending");
    event_add(persist, &tick);
    UNIT_CHECK_INT(ric_clock_dispatch(base), 0);
    UNIT_CHECK(event_pending(persist, EV_TIMEOUT, NULL));
    event_free(persist);
    event_base_free(base);
}

int
main(void)
{
    test_turns();
    test_break();
    return UNIT_DONE("clock");
}
