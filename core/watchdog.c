/* watchdog.c: the worker watchdog: heartbeat slots in the shared zone, a worker's tick, and the master's look for stalled loops. */
#include "watchdog.h"
#include "log.h"
#include "script.h"
#include "shm.h"

#include <event2/event.h>
#include <stdio.h>

ric_watchdog_slot_t *ric_watchdog_slot;

static ric_watchdog_table_t *table; /* the zone's, mapped before the first fork */
static const ric_shm_t *zone_of;    /* to name what a slot points at */
static int used;                    /* slots [0, used) may be taken (master) */
static int64_t last_look_us;        /* the master's last look; 0: none yet */
static struct event *tick;          /* a worker's: its idle loop turns */

/* --- the master ------------------------------------------------------------ */

int
ric_watchdog_share(ric_shm_t *zone, char *err, size_t errlen)
{
    int created;

    table = ric_shm_entry(zone, "watchdog", sizeof(*table), &created);
    if (table == NULL) {
        snprintf(err, errlen, "the shared memory zone has no room for the worker watchdog");
        return RIC_ERROR;
    }
    zone_of = zone;
    return RIC_OK;
}

size_t
ric_watchdog_zone_size(void)
{
    return sizeof(ric_watchdog_table_t) + 1024;
}

int
ric_watchdog_claim(void)
{
    static int warned;
    ric_watchdog_slot_t *s;
    int i;

    for (i = 0; table != NULL && i < RIC_WATCHDOG_SLOTS; i++) {
        s = &table->slot[i];
        if (__atomic_load_n(&s->pid, __ATOMIC_RELAXED) == 0) {
            s->turn_us = 0;
            s->script = NULL;
            s->route = NULL;
            s->killed = 0;
            __atomic_store_n(&s->pid, -1, __ATOMIC_RELAXED);
            used = ric_max(used, i + 1);
            return i;
        }
    }
    if (table != NULL && !warned) {
        warned = 1;
        ric_log_error(RIC_LOG_WARN, 0, "the worker watchdog watches %d workers at most: a worker "
                      "started beyond them runs unwatched", RIC_WATCHDOG_SLOTS);
    }
    return -1;
}

void
ric_watchdog_started(int index, pid_t pid)
{
    if (table != NULL && index >= 0) {
        __atomic_store_n(&table->slot[index].pid, (int64_t) pid, __ATOMIC_RELAXED);
    }
}

void
ric_watchdog_gone(pid_t pid)
{
    int i;

    for (i = 0; table != NULL && i < used; i++) {
        if (__atomic_load_n(&table->slot[i].pid, __ATOMIC_RELAXED) == (int64_t) pid) {
            __atomic_store_n(&table->slot[i].pid, 0, __ATOMIC_RELAXED);
        }
    }
}

/* An entry's name without its kind ("script:PATH" -> PATH); NULL: none. */
static const char *
entry_name(const void *data, const char *kind)
{
    const char *name = zone_of != NULL ? ric_shm_name_of(zone_of, data) : NULL;
    size_t n = strlen(kind);

    return name != NULL && strncmp(name, kind, n) == 0 ? name + n : NULL;
}

/* "stalled for 1.2s in route script PATH HOOK (route "LABEL")": what the
 * slot says it was doing; whether that was a script's hook. */
static int
describe(const ric_watchdog_slot_t *s, int64_t age_us, char *what, size_t len)
{
    static const char *const hooks[RIC_HOOKS] = { "on_request", "classify", "on_response",
                                                  "on_log" };
    const void *sp = __atomic_load_n(&s->script, __ATOMIC_RELAXED);
    const char *script = sp != NULL ? entry_name(sp, "script:") : NULL;
    const char *route = entry_name(__atomic_load_n(&s->route, __ATOMIC_RELAXED), "metrics:route:");
    int64_t hook = __atomic_load_n(&s->hook, __ATOMIC_RELAXED);

    if (script == NULL) {
        snprintf(what, len, "stalled for %.1fs outside any route script", (double) age_us / 1e6);
        return 0;
    }
    snprintf(what, len, "stalled for %.1fs in route script %s %s%s%s%s", (double) age_us / 1e6,
             script, hook >= 0 && hook < RIC_HOOKS ? hooks[hook] : "(a hook)",
             route != NULL ? " (route \"" : "", route != NULL ? route : "",
             route != NULL ? "\")" : "");
    return 1;
}

void
ric_watchdog_check(int64_t now_us, int64_t limit_ms, ric_watchdog_kill_pt *kill, void *ctx)
{
    ric_watchdog_slot_t *s;
    int64_t turn, pid, gap = now_us - last_look_us;
    char what[4400];
    int i, in_script;

    last_look_us = now_us;
    if (table == NULL || limit_ms <= 0 || gap > limit_ms * 1000 / 2) {
        /* off; or the master itself was held up: the workers may have been too */
        return;
    }
    for (i = 0; i < used; i++) {
        s = &table->slot[i];
        pid = __atomic_load_n(&s->pid, __ATOMIC_RELAXED);
        turn = __atomic_load_n(&s->turn_us, __ATOMIC_RELAXED);
        if (pid <= 0 || s->killed || turn == 0 || now_us - turn <= limit_ms * 1000) {
            continue;
        }
        s->killed = 1;
        __atomic_fetch_add(&table->kills, 1, __ATOMIC_RELAXED);
        in_script = describe(s, now_us - turn, what, sizeof(what));
        kill((pid_t) pid, what, in_script, ctx);
    }
}

uint64_t
ric_watchdog_kills(void)
{
    return table != NULL ? __atomic_load_n(&table->kills, __ATOMIC_RELAXED) : 0;
}

/* --- a worker -------------------------------------------------------------- */

void
ric_watchdog_worker_begin(int index)
{
    if (table == NULL || index < 0) {
        return;
    }
    ric_watchdog_slot = &table->slot[index];
    ric_clock_publish(&ric_watchdog_slot->turn_us);
}

/* Nothing to do but turn: ric_now_us publishes the turn. */
static void
on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void) fd;
    (void) what;
    (void) arg;
    (void) ric_now_us();
}

void
ric_watchdog_worker_loop(struct event_base *base)
{
    struct timeval tv = ric_ms_to_tv(RIC_WATCHDOG_TICK_MS);

    if (ric_watchdog_slot == NULL) {
        return;
    }
    tick = event_new(base, -1, EV_PERSIST, on_tick, NULL);
    event_add(tick, &tv);
}

void
ric_watchdog_worker_end(void)
{
    if (ric_watchdog_slot == NULL) {
        return;
    }
    ric_clock_publish(NULL);
    __atomic_store_n(&ric_watchdog_slot->turn_us, 0, __ATOMIC_RELAXED);
    if (tick != NULL) {
        event_free(tick);
        tick = NULL;
    }
}
