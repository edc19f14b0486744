/* script_match.h: Lua 5.1 patterns for route scripts that stop at the hook's deadline. */
#ifndef RIC_SCRIPT_MATCH_H
#define RIC_SCRIPT_MATCH_H

#include <lua.h>

/* Pushes a table of find, match, gmatch and gsub: LuaJIT 2.1's string
 * functions of those names, result for result and error for error, but
 * stopped (script.c's "stopped: it ran longer than a hook may") as soon
 * as a bounded hook call is past script_timeout, however the pattern
 * backtracks. Plain finds are linear (memmem). Raises only Lua errors. */
void ric_script_match_push(lua_State *L);

#endif
