/* script_deadline.c: whether the running hook call is past its bound, for the long C loops beneath script.c. */
#include "script_deadline.h"

#include <stddef.h>

/* script.c, which bounds hook calls, sits above the C code that reads
 * this (script_match.c, script_api.c, script_json.c): it hands its two functions down
 * here rather than being called back by name. */

volatile sig_atomic_t ric_script_expired;

static int (*over_fn)(void);
static void (*stop_fn)(lua_State *L);

void
ric_script_deadline_init(int (*over)(void), void (*stop)(lua_State *L))
{
    over_fn = over;
    stop_fn = stop;
}

int
ric_script_deadline_passed(void)
{
    return ric_script_expired && over_fn != NULL && over_fn();
}

void
ric_script_deadline_check(lua_State *L)
{
    if (over_fn != NULL && over_fn()) {
        stop_fn(L);
    }
}

void
ric_script_deadline_stop(lua_State *L)
{
    stop_fn(L);
}
