/* watchdog.h: the worker watchdog: each worker's heartbeat slot in the shared zone, and the master's look at it. */
#ifndef RIC_WATCHDOG_H
#define RIC_WATCHDOG_H

#include "ric_core.h"

#include <sys/types.h>

/*
 * The last resort behind a route script's own bounds: a worker whose
 * event loop has not turned for worker_watchdog is killed (SIGKILL) by the
 * master and replaced; what it held in flight is lost.
 *
 * Each worker has a slot in the shared zone. Its loop publishes the
 * moment of each turn there (ric_clock_publish: a plain store at the
 * turn's first look at the clock, which the turn makes anyway), and a
 * hook call of a route script says which script, hook and route run
 * (ric_watchdog_enter/leave: stores of three words). A worker idle in
 * epoll_wait has nothing to turn for, so its loop wakes every
 * RIC_WATCHDOG_TICK_MS: idle is never taken for stalled, whatever the
 * watchdog is (a reload may change it, and it then applies to every
 * worker, draining ones included). The master looks every
 * RIC_WATCHDOG_TICK_MS; a look that comes after the master itself was
 * held up for more than half the watchdog (a machine that stopped every
 * process, a long reload) judges no one: the workers may not have had
 * their turn either.
 */
#define RIC_WATCHDOG_TICK_MS 250
#define RIC_WATCHDOG_MIN_MS 1000   /* worker_watchdog's least value: a turn well above the tick */
#define RIC_WATCHDOG_SLOTS 2048    /* workers alive at once, every generation */

/* One worker's slot. The master claims it (cleared, before the fork),
 * frees it and writes pid and killed; the worker writes the rest. Its own
 * cache line: no two workers write one. */
typedef struct {
    int64_t pid;        /* 0: free; -1: claimed for a worker being forked */
    int64_t turn_us;    /* its loop's last turn (monotonic clock); 0: not turned yet, or leaving */
    const void *script; /* the running hook's script: its entry in the zone ("script:PATH"); NULL: none */
    const void *route;  /* ...its request's location: its entry ("metrics:route:LABEL") */
    int64_t hook;       /* ...which hook (RIC_HOOK_*) */
    int64_t killed;     /* the master killed it: reported once */
} __attribute__((aligned(64))) ric_watchdog_slot_t;

/* The zone's entry "watchdog". */
typedef struct {
    uint64_t kills; /* every worker the watchdog killed since start (the master counts) */
    ric_watchdog_slot_t slot[RIC_WATCHDOG_SLOTS];
} ric_watchdog_table_t;

struct ric_shm_s;

/* --- the master ------------------------------------------------------------ */

/* Finds or makes the table in zone (at start, at each reload and sweep:
 * the same entry, so the kills count survives). RIC_ERROR with err when
 * the zone has no room. */
int ric_watchdog_share(struct ric_shm_s *zone, char *err, size_t errlen);

/* The room the table takes in the zone. */
size_t ric_watchdog_zone_size(void);

/* Before a worker's fork: a free slot's index, claimed; -1 when every slot
 * is taken (the worker then runs unwatched, logged). After the fork, the
 * parent says whose it is (pid; 0 when the fork failed: the slot is free
 * again), and the child calls ric_watchdog_worker_begin with it. */
int ric_watchdog_claim(void);
void ric_watchdog_started(int index, pid_t pid);

/* A child was reaped: its slot (if it had one) is free. */
void ric_watchdog_gone(pid_t pid);

/* What the master does with a stalled worker: what says "stalled for 1.2s
 * in route script PATH HOOK (route "LABEL")" or "... outside any route
 * script"; in_script whether a script was running. */
typedef void ric_watchdog_kill_pt(pid_t pid, const char *what, int in_script, void *ctx);

/* The master's look at now_us (its monotonic clock): every worker whose
 * last turn is older than limit_ms (0: off, nobody is judged) is counted
 * and handed to kill once (it kills it). */
void ric_watchdog_check(int64_t now_us, int64_t limit_ms, ric_watchdog_kill_pt *kill, void *ctx);

/* Workers killed since start (for /metrics; any process). */
uint64_t ric_watchdog_kills(void);

/* --- a worker -------------------------------------------------------------- */

/* This worker's slot (NULL: unwatched). */
extern ric_watchdog_slot_t *ric_watchdog_slot;

/* In the child, after fork: index is what ric_watchdog_claim gave (-1:
 * none). Its loop publishes its turns from here on. */
void ric_watchdog_worker_begin(int index);

/* The worker's loop on base runs: its tick starts (an idle loop turns). */
void ric_watchdog_worker_loop(struct event_base *base);

/* The worker leaves its loop (it exits): no longer judged; the tick goes. */
void ric_watchdog_worker_end(void);

/* A route script's hook starts: script and route are the script's and
 * the location's entries in the zone (any may be NULL), hook RIC_HOOK_*. */
static inline void
ric_watchdog_enter(const void *script, const void *route, int hook)
{
    ric_watchdog_slot_t *s = ric_watchdog_slot;

    if (s != NULL) {
        __atomic_store_n(&s->script, script, __ATOMIC_RELAXED);
        __atomic_store_n(&s->route, route, __ATOMIC_RELAXED);
        __atomic_store_n(&s->hook, (int64_t) hook, __ATOMIC_RELAXED);
    }
}

/* ...and ends. */
static inline void
ric_watchdog_leave(void)
{
    if (ric_watchdog_slot != NULL) {
        __atomic_store_n(&ric_watchdog_slot->script, NULL, __ATOMIC_RELAXED);
    }
}

#endif /* RIC_WATCHDOG_H */
