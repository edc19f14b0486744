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

#endif /* RIC_SCRIPT_API_H */
