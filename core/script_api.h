/* script_api.h: the C binding under ricochet/api.lua: what req, res, attempt and ricochet.* do in the gateway. */
#ifndef RIC_SCRIPT_API_H
#define RIC_SCRIPT_API_H

#include "ric_core.h"
#include "http_parse.h"

#include <lua.h>

/* What a script may make the gateway copy for one request, outside its
 * Lua state's script_memory_max: a field it sets (name and value), and
 * req:respond's fields together, no longer than a client's whole field
 * section; at most as many names as a client may send, in each of the
 * request's and the answer's edits; its set_header calls copying at most
 * RIC_SCRIPT_EDITS_MAX into the request's pool in all. */
#define RIC_SCRIPT_FIELD_MAX RIC_HTTP_MAX_HEADER_BYTES
#define RIC_SCRIPT_EDITS_NAMES RIC_HTTP_MAX_FIELDS
#define RIC_SCRIPT_EDITS_MAX (64 * 1024)

/* The hook being run, set by script.c around each call: the binding acts
 * only on its request, so a req or res kept and used later is an error,
 * never a stale pointer. */
typedef struct {
    ric_request_t *r;       /* NULL outside a hook */
    ric_attempt_t *attempt; /* classify's, or on_response's answer (NULL: the gateway's own) */
    int in_on_request;      /* req may be changed only then */
    int in_on_response;     /* ...and the answer's fields only then */
} ric_script_hook_t;

extern ric_script_hook_t ric_script_hook;

/* Pushes the binding table that api.lua is given; push_ctx pushes a
 * request's own table (req.ctx), made on first use by the state's owner. */
void ric_script_api_push(lua_State *L, void (*push_ctx)(ric_request_t *r));

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
