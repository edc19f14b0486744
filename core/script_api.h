/* script_api.h: the C binding under ricochet/api.lua: what req, res, attempt and ricochet.* do in the gateway. */
#ifndef RIC_SCRIPT_API_H
#define RIC_SCRIPT_API_H

#include "ric_core.h"

#include <lua.h>

/* Pushes the binding table that api.lua is given. */
void ric_script_api_push(lua_State *L);

/* A failed on_request: its header edits, key and answer are dropped. */
void ric_script_api_undo(ric_request_t *r);

/* After on_request: 1 when the script answered (req:respond), which is
 * then the request's own answer. */
int ric_script_api_respond(ric_request_t *r);

/* Adds a field to the table on top of the stack as a script sees fields
 * (req:headers(), on_log's ctx.headers): its name lowercased -> value, or
 * a list of the values, in order, when the name repeats. */
void ric_script_api_add_field(lua_State *L, ric_str_t name, ric_str_t value);

#endif /* RIC_SCRIPT_API_H */
