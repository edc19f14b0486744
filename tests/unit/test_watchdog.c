/* test_watchdog.c: the master's look at the workers' heartbeats, with the clock handed in: who is judged, when, and what the line says. */
#include "../../core/watchdog.c"
#include "unit.h"

static pid_t killed_pid;
static int killed_n, killed_in_script;
static char killed_what[4400];

static void
on_kill(pid_t pid, const char *what, int in_script, void *ctx)
{
    (void) ctx;
    killed_pid = pid;
    killed_n++;
    killed_in_script = in_script;
    snprintf(killed_what, sizeof(killed_what), "%s", what);
}

#define S 1000000 /* a second, in µs */

int
main(void)
{
    ric_shm_t *zone = ric_shm_create((size_t) 1 << 20);
    char err[256];
    const void *script, *route;
    int created, a, b;

    UNIT_CASE("the table in the zone, found again by name");
    UNIT_CHECK(ric_watchdog_share(zone, err, sizeof(err)) == RIC_OK);
    table->kills = 7;
    UNIT_CHECK(ric_watchdog_share(zone, err, sizeof(err)) == RIC_OK);
    UNIT_CHECK_INT(ric_watchdog_kills(), 7);
    table->kills = 0;
    script = ric_shm_entry(zone, "script:/etc/ricochet/pay.lua", 64, &created);
    route = ric_shm_entry(zone, "metrics:route:api.example /pay/", 64, &created);

    UNIT_CASE("slots claimed before the fork, owned after it, free once reaped");
    a = ric_watchdog_claim();
    b = ric_watchdog_claim();
    UNIT_CHECK_INT(a, 0);
    UNIT_CHECK_INT(b, 1);
    ric_watchdog_started(a, 101);
    ric_watchdog_started(b, 0); /* its fork failed */
    UNIT_CHECK_INT(table->slot[b].pid, 0);
    UNIT_CHECK_INT(ric_watchdog_claim(), 1);
    ric_watchdog_started(1, 102);

    UNIT_CASE("a worker that has not turned yet, and the master's first look, judge no one");
    ric_watchdog_check(100 * S, 1000, on_kill, NULL);
    table->slot[0].turn_us = 90 * S;
    ric_watchdog_check(100 * S + S / 4, 1000, on_kill, NULL); /* 102 not turned: not judged */
    UNIT_CHECK_INT(killed_n, 1);
    UNIT_CHECK_INT(killed_pid, 101);
    killed_n = 0;

    UNIT_CASE("a turn within the watchdog is fine; past it, killed once and counted");
    table->slot[1].turn_us = 100 * S;
    ric_watchdog_check(101 * S, 1000, on_kill, NULL);
    UNIT_CHECK_INT(killed_n, 0); /* 101 is already reported, 102 turned 1.0s ago: not over */
    ric_watchdog_check(101 * S + S / 4, 1000, on_kill, NULL);
    UNIT_CHECK_INT(killed_n, 1);
    UNIT_CHECK_INT(killed_pid, 102);
    UNIT_CHECK_STR(killed_what, "stalled for 1.2s outside any route script");
    UNIT_CHECK_INT(killed_in_script, 0);
    UNIT_CHECK_INT(ric_watchdog_kills(), 2);
    ric_watchdog_check(101 * S + S / 2, 1000, on_kill, NULL);
    UNIT_CHECK_INT(killed_n, 1);
    ric_watchdog_gone(101);
    ric_watchdog_gone(102);
    UNIT_CHECK_INT(table->slot[0].pid, 0);
    UNIT_CHECK_INT(table->slot[1].pid, 0);

    UNIT_CASE("the line names the script, its hook and the route");
    killed_n = 0;
    a = ric_watchdog_claim();
    ric_watchdog_started(a, 201);
    UNIT_CHECK_INT(table->slot[a].killed, 0); /* a reused slot starts clean */
    ric_watchdog_worker_begin(a);             /* as the child does */
    ric_watchdog_enter(script, route, RIC_HOOK_CLASSIFY);
    table->slot[a].turn_us = 100 * S;
    ric_watchdog_check(102 * S, 1000, on_kill, NULL);
    UNIT_CHECK_INT(killed_n, 1);
    UNIT_CHECK_STR(killed_what, "stalled for 2.0s in route script /etc/ricochet/pay.lua classify "
                   "(route \"api.example /pay/\")");
    UNIT_CHECK_INT(killed_in_script, 1);
    ric_watchdog_leave();
    UNIT_CHECK(table->slot[a].script == NULL);
    ric_watchdog_gone(201);

    UNIT_CASE("off judges no one");
    killed_n = 0;
    a = ric_watchdog_claim();
    ric_watchdog_started(a, 301);
    table->slot[a].turn_us = 100 * S;
    ric_watchdog_check(200 * S, 0, on_kill, NULL);
    ric_watchdog_check(200 * S + S / 4, 0, on_kill, NULL);
    UNIT_CHECK_INT(killed_n, 0);

    UNIT_CASE("a look after the master itself was held up judges no one; the next one does");
    ric_watchdog_check(200 * S + S / 2, 1000, on_kill, NULL); /* on again */
    UNIT_CHECK_INT(killed_n, 1);
    killed_n = 0;
    table->slot[a].killed = 0;
    ric_watchdog_check(210 * S, 1000, on_kill, NULL); /* 9.25s since its last look */
    UNIT_CHECK_INT(killed_n, 0);
    ric_watchdog_check(210 * S + S / 4, 1000, on_kill, NULL);
    UNIT_CHECK_INT(killed_n, 1);

    UNIT_CASE("a worker leaving its loop is no longer judged");
    killed_n = 0;
    table->slot[a].killed = 0;
    ric_watchdog_worker_begin(a);
    ric_watchdog_worker_end();
    UNIT_CHECK_INT(table->slot[a].turn_us, 0);
    ric_watchdog_check(210 * S + S / 2, 1000, on_kill, NULL);
    UNIT_CHECK_INT(killed_n, 0);

    ric_shm_destroy(zone);
    return UNIT_DONE("watchdog");
}
