/* script_json.h: the route scripts' JSON module (cjson's API), every byte in the state's bounds. */
#ifndef RIC_SCRIPT_JSON_H
#define RIC_SCRIPT_JSON_H

#include <lua.h>

/* Deepest nesting decode and encode take, whatever a script sets
 * (decode_max_depth, encode_max_depth): each level is a C frame. */
#define RIC_JSON_MAX_DEPTH 1000

/* Longest array encode writes (its largest index): a sparse array's
 * holes have no memory behind them in the table. */
#define RIC_JSON_ARRAY_MAX 16777216

/* Makes package.loaded.cjson and package.loaded["cjson.safe"] of L this
 * module: lua-cjson 2.1.0's functions and output for ordinary values, with
 * everything it allocates in L's allocator (counted by script_memory_max,
 * collected after an error: nothing outside L holds memory), no setting
 * that makes a call unbounded, and the hook's bound read as it runs
 * (ric_script_deadline_check, every few thousand values and at the end). Raises a Lua
 * error only when memory runs out (call it protected, or at start). */
void ric_script_json_open(lua_State *L);

#endif
