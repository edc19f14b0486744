/* script_deadline.h: whether the running hook call is past its bound, for the long C loops beneath script.c. */
#ifndef RIC_SCRIPT_DEADLINE_H
#define RIC_SCRIPT_DEADLINE_H

#include <lua.h>
#include <signal.h>

/* Set (by script.c's alarm, a signal handler) once the running hook call
 * is past script_timeout; cleared when a call starts. A long loop in our
 * own C code (script_match.c, the digests of script_api.c) reads it at
 * each step: one load while it is not set. */
extern volatile sig_atomic_t ric_script_expired;

/* script.c gives how to tell that the running call is past a bound, and
 * how to stop it (raise its "stopped: it ran longer than a hook may"
 * error, which does not return). Without them (a unit test, the fuzz
 * target) no call is ever past a bound. */
void ric_script_deadline_init(int (*over)(void), void (*stop)(lua_State *L));

/* 1 when ric_script_expired is set and a bounded hook call runs past one
 * of its bounds: the caller frees what it holds and calls
 * ric_script_deadline_stop. 0 otherwise (no call is bounded in the test
 * kit's states or a state's own setup). */
int ric_script_deadline_passed(void);

/* Reads the clock now and stops the running hook call (no return) when it
 * is past one of its bounds, whether or not the alarm rang: for a long C
 * call that looks every few thousand steps and at its end
 * (script_json.c). Nothing without script.c (a unit test, the fuzzer). */
void ric_script_deadline_check(lua_State *L);

/* Stops the running hook call (no return). Only after
 * ric_script_deadline_passed said 1. */
void ric_script_deadline_stop(lua_State *L);

#endif
