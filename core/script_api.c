/* script_api.c: the gateway's binding for route scripts: the request being handled, its attempt, OpenSSL digests. */
#include "script_api.h"
#include "attempt.h"
#include "headers.h"
#include "log.h"
#include "request.h"
#include "retry_after.h"
#include "respond.h"
#include "script.h"
#include "script_deadline.h"
#include "shared_dict.h"

#include <ctype.h>
#include <math.h>
#include <lauxlib.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdio.h>
#include <strings.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* An error raised where the script called: level 1 is api.lua's wrapper,
 * level 2 the script's line. */
static int
script_error(lua_State *L, const char *fmt, ...)
{
    va_list ap;

    luaL_where(L, 2);
    va_start(ap, fmt);
    lua_pushvfstring(L, fmt, ap);
    va_end(ap);
    lua_concat(L, 2);
    return lua_error(L);
}

ric_script_hook_t ric_script_hook;

static void (*push_ctx)(ric_request_t *r); /* script.c's */

/* Every function works on the hook's request, set only while it runs. */
static ric_request_t *
current(lua_State *L)
{
    if (ric_script_hook.r == NULL) {
        script_error(L, "req and res can only be used while their hook runs");
    }
    return ric_script_hook.r;
}

/* The request, for a change to it: only on_request may make one. */
static ric_request_t *
changing(lua_State *L, const char *what)
{
    ric_request_t *r = current(L);

    if (!ric_script_hook.in_on_request) {
        script_error(L, "%s can only be called in on_request", what);
    }
    return r;
}

static ric_attempt_t *
current_attempt(lua_State *L)
{
    if (current(L) != NULL && ric_script_hook.attempt == NULL && !ric_script_hook.in_on_response) {
        script_error(L, "res can only be used in classify and on_response");
    }
    return ric_script_hook.attempt;
}

/* A field of the answer res stands for: an attempt's, or in on_response
 * the gateway's own answer's. */
static ric_str_t
res_field(lua_State *L, const char *name)
{
    ric_attempt_t *u = current_attempt(L);

    if (u == NULL) {
        return ric_lines_find(ric_request_own_fields(ric_script_hook.r), name);
    }
    return ric_headers_find(u->client.buf, &u->client.resp, name);
}

static void
push_str(lua_State *L, ric_str_t v)
{
    if (v.data == NULL) {
        lua_pushnil(L);
    } else {
        lua_pushlstring(L, (const char *) v.data, v.len);
    }
}

/* A field name the client may send: a token. */
static int
is_token(const char *s, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++) {
        unsigned char ch = (unsigned char) s[i];
        if (!(ch > 32 && ch < 127 && !strchr("\"(),/:;<=>?@[\\]{}", ch))) {
            return 0;
        }
    }
    return n > 0;
}

static int
is_value(const char *s, size_t n)
{
    size_t i;

    for (i = 0; i < n; i++) {
        unsigned char ch = (unsigned char) s[i];
        if ((ch < 32 && ch != '\t') || ch == 127) {
            return 0;
        }
    }
    return 1;
}

/* Fields the gateway frames itself. */
static int
is_reserved(const char *name, size_t n)
{
    static const char *const names[] = { "content-length", "transfer-encoding", "connection",
                                         "keep-alive", "upgrade", "te", "trailer",
                                         "proxy-connection" };
    ric_str_t a = { (const u_char *) name, n };
    size_t i;

    for (i = 0; i < ric_nelems(names); i++) {
        ric_str_t b = { (const u_char *) names[i], strlen(names[i]) };
        if (ric_str_eq_nocase(a, b)) {
            return 1;
        }
    }
    return 0;
}

/* A set_header's field (value NULL: removed): a token name, not a framing
 * field, a value without control bytes, the two no longer than a client's
 * whole field section; else an error where the script called (what:
 * "req:set_header"). The size first: nothing is scanned past the bound. */
static void
check_field(lua_State *L, const char *what, const char *name, size_t n, const char *value,
            size_t vn)
{
    if (n + vn > RIC_SCRIPT_FIELD_MAX) {
        script_error(L, "%s: a field of %d bytes (name and value) is over the %d a client's "
                     "field section may hold", what, (int) ric_min(n + vn, (size_t) INT32_MAX),
                     RIC_SCRIPT_FIELD_MAX);
    }
    if (!is_token(name, n)) {
        script_error(L, "%s: \"%s\" is not a valid field name", what, name);
    }
    if (is_reserved(name, n)) {
        script_error(L, "%s: %s is the gateway's to set", what, name);
    }
    if (value != NULL && !is_value(value, vn)) {
        script_error(L, "%s: the value of %s has control characters", what, name);
    }
}

static ric_header_edit_t *
find_edit_in(ric_header_edit_t *list, const char *name, size_t n)
{
    ric_header_edit_t *e;
    ric_str_t want = { (const u_char *) name, n };

    for (e = list; e; e = e->next) {
        if (ric_str_eq_nocase(e->name, want)) {
            return e;
        }
    }
    return NULL;
}

static ric_header_edit_t *
find_edit(ric_request_t *r, const char *name, size_t n)
{
    return find_edit_in(r->edits, name, n);
}

/* Sets (value non-NULL) or removes a field in *list: as it goes upstream
 * (r->edits) or to the client (r->res_edits). What goes into the pool is
 * counted against RIC_SCRIPT_EDITS_MAX for the whole request: a new name,
 * and a value longer than any its name had (a shorter one is copied over
 * the longest's room), so a loop of set_header cannot grow the pool. */
static void
edit_in(lua_State *L, const char *what, ric_request_t *r, ric_header_edit_t **list,
        const char *name, size_t nlen, const char *value, size_t vlen)
{
    ric_header_edit_t *e = find_edit_in(*list, name, nlen), **last;
    size_t cost = e == NULL ? nlen : 0, names = 0;

    if (value != NULL && (e == NULL || vlen > e->room_size)) {
        cost += vlen;
    }
    if (r->script_copied + cost > RIC_SCRIPT_EDITS_MAX) {
        script_error(L, "%s: the request's set_header calls would copy more than the %d bytes "
                     "they may (each new name, and each value longer than its name had)", what,
                     RIC_SCRIPT_EDITS_MAX);
    }
    if (e == NULL) {
        for (last = list; *last != NULL; last = &(*last)->next) {
            names++;
        }
        if (names == RIC_SCRIPT_EDITS_NAMES) {
            script_error(L, "%s: a request's script sets or removes at most %d fields", what,
                         RIC_SCRIPT_EDITS_NAMES);
        }
        e = ric_pcalloc(r->pool, sizeof(*e));
        e->name.data = (const u_char *) ric_pstrndup(r->pool, name, nlen);
        e->name.len = nlen;
        e->next = *list;
        *list = e;
    }
    r->script_copied += cost;
    if (value == NULL) {
        e->value = (ric_str_t) ric_null_string;
        return;
    }
    if (e->room == NULL || vlen > e->room_size) {
        e->room = ric_palloc(r->pool, vlen + 1);
        e->room_size = vlen;
    }
    memcpy(e->room, value, vlen);
    e->room[vlen] = '\0';
    e->value.data = e->room;
    e->value.len = vlen;
}

/* --- req -------------------------------------------------------------------- */

static int
req_header(lua_State *L)
{
    ric_request_t *r = current(L);
    size_t n;
    const char *name = luaL_checklstring(L, 1, &n);
    ric_header_edit_t *e = find_edit(r, name, n);

    if (e != NULL) {
        push_str(L, e->value);
        return 1;
    }
    push_str(L, ric_headers_find(r->c->in, r->msg, name));
    return 1;
}

void
ric_script_api_add_field(lua_State *L, ric_str_t name, ric_str_t value)
{
    char lower[256];
    size_t k;

    for (k = 0; k < name.len && k < sizeof(lower); k++) {
        lower[k] = (char) tolower(name.data[k]);
    }
    lua_pushlstring(L, lower, k);                          /* t name */
    lua_pushvalue(L, -1);                                  /* t name name */
    lua_rawget(L, -3);                                     /* t name old */
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);                                     /* t name */
        push_str(L, value);                                /* t name value */
    } else if (lua_isstring(L, -1)) {
        lua_createtable(L, 2, 0);                          /* t name old list */
        lua_insert(L, -2);                                 /* t name list old */
        lua_rawseti(L, -2, 1);                             /* t name list */
        push_str(L, value);
        lua_rawseti(L, -2, 2);
    } else {
        push_str(L, value);                                /* t name list value */
        lua_rawseti(L, -2, (int) lua_objlen(L, -2) + 1);   /* t name list */
    }
    lua_rawset(L, -3);                                     /* t */
}

/* Every field the client sent (ric_script_api_add_field's table). */
static int
req_headers(lua_State *L)
{
    ric_request_t *r = current(L);
    const ric_http_msg_t *m = r->msg;
    unsigned i;

    lua_createtable(L, 0, (int) m->nfields);
    for (i = 0; i < m->nfields; i++) {
        ric_script_api_add_field(L, ric_field_name(r->c->in, m, i),
                                 ric_field_value(r->c->in, m, i));
    }
    return 1;
}

static int
req_set_header(lua_State *L)
{
    ric_request_t *r = changing(L, "req:set_header");
    size_t n, vn = 0;
    const char *name = luaL_checklstring(L, 1, &n);
    const char *value = lua_isnil(L, 2) ? NULL : luaL_checklstring(L, 2, &vn);
    const char *key_header = r->location->refs.idempotency_key_header;
    ric_str_t a = { (const u_char *) name, n }, b = { (const u_char *) key_header,
                                                      strlen(key_header) };

    check_field(L, "req:set_header", name, n, value, vn);
    edit_in(L, "req:set_header", r, &r->edits, name, n, value, vn);
    if (ric_str_eq_nocase(a, b)) {
        /* the key field is the key: replay safety follows what is sent */
        r->script_key = value != NULL ? (const char *) find_edit(r, name, n)->value.data : NULL;
        r->script_key_removed = value == NULL;
    }
    return 0;
}

static int
req_body(lua_State *L)
{
    ric_request_t *r = current(L);
    const ric_body_t *b = &r->body;
    luaL_Buffer buf;
    char chunk[16384];
    uint64_t off = 0;
    ssize_t got;

    if (r->body_mode != RIC_REQ_BODY_BUFFER || !r->body_complete) {
        lua_pushnil(L); /* none, or streamed through */
        return 1;
    }
    luaL_buffinit(L, &buf);
    luaL_addlstring(&buf, (const char *) b->mem, b->mem_len);
    while (b->fd != -1 && off < b->file_len) {
        got = pread(b->fd, chunk, (size_t) ric_min((uint64_t) sizeof(chunk), b->file_len - off),
                    (off_t) off);
        if (got <= 0) {
            return script_error(L, "req:body: cannot read the body's temp file");
        }
        luaL_addlstring(&buf, chunk, (size_t) got);
        off += (uint64_t) got;
    }
    luaL_pushresult(&buf);
    return 1;
}

static int
req_set_idempotency_key(lua_State *L)
{
    ric_request_t *r = changing(L, "req:set_idempotency_key");
    const char *header = r->location->refs.idempotency_key_header;
    size_t n;
    const char *key = luaL_checklstring(L, 1, &n);

    if (n == 0 || n > 255 || !is_value(key, n)) {
        return script_error(L, "req:set_idempotency_key: a key is 1 to 255 printable characters");
    }
    edit_in(L, "req:set_idempotency_key", r, &r->edits, header, strlen(header), key, n);
    r->script_key = (const char *) find_edit(r, header, strlen(header))->value.data;
    r->script_key_removed = 0;
    return 0;
}

static int
req_idempotency_key(lua_State *L)
{
    ric_request_t *r = current(L);
    const char *header = r->location->refs.idempotency_key_header;

    if (r->script_key != NULL) {
        lua_pushstring(L, r->script_key);
        return 1;
    }
    if (r->script_key_removed) {
        lua_pushnil(L);
        return 1;
    }
    push_str(L, ric_headers_find(r->c->in, r->msg, header));
    return 1;
}

#define RESPOND_MAX_BODY (1 << 20)

static void
free_answer(void *data)
{
    ric_request_t *r = data;

    ric_pool_released += r->script_answer.size; /* a large one may leave a hole */
    ric_buf_free(&r->script_answer);
}

/* req:respond(status, {name, value, ...}, body): checked by api.lua for
 * types; here for what HTTP allows. The fields and the body go into one
 * buffer of the request's, which a later call reuses: however often a
 * script answers, the request holds its last answer only. */
static int
req_respond(lua_State *L)
{
    ric_request_t *r = changing(L, "req:respond");
    int status = (int) luaL_checkinteger(L, 1), i, n;
    size_t nlen, vlen, blen, fields = 0, head;
    const char *name, *value, *body;
    ric_buf_t *h = &r->script_answer;
    int typed = 0;

    luaL_checktype(L, 2, LUA_TTABLE);
    body = luaL_checklstring(L, 3, &blen);
    if (status < 200 || status > 599) {
        return script_error(L, "req:respond: status %d is not from 200 to 599", status);
    }
    if ((status == 204 || status == 304) && blen > 0) {
        return script_error(L, "req:respond: a %d has no body", status);
    }
    if (blen > RESPOND_MAX_BODY) {
        return script_error(L, "req:respond: a body of %d bytes is over the %d a script may send",
                          (int) ric_min(blen, (size_t) INT32_MAX), RESPOND_MAX_BODY);
    }
    n = (int) lua_objlen(L, 2);
    if (n / 2 > RIC_SCRIPT_EDITS_NAMES) {
        return script_error(L, "req:respond: at most %d fields", RIC_SCRIPT_EDITS_NAMES);
    }
    /* checked whole first: an error leaves the answer as it was */
    for (i = 1; i + 1 <= n; i += 2) {
        lua_rawgeti(L, 2, i);
        lua_rawgeti(L, 2, i + 1);
        name = lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &nlen) : NULL;
        value = lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &vlen) : NULL;
        if (name != NULL && value != NULL) {
            fields += nlen + vlen;
            if (fields > RIC_SCRIPT_FIELD_MAX) {
                return script_error(L, "req:respond: the fields are over the %d bytes (names and "
                                    "values) a client's field section may hold",
                                    RIC_SCRIPT_FIELD_MAX);
            }
        }
        if (name == NULL || value == NULL || !is_token(name, nlen) || !is_value(value, vlen)) {
            return script_error(L, "req:respond: \"%s\" is not a valid header",
                              name ? name : "(not a string)");
        }
        if (is_reserved(name, nlen) || (nlen == 4 && strncasecmp(name, "date", 4) == 0)
            || (nlen == 6 && strncasecmp(name, "server", 6) == 0)) {
            return script_error(L, "req:respond: %s is the gateway's to set", name);
        }
        lua_pop(L, 2);
    }
    if (h->data == NULL) {
        ric_request_cleanup_add(r, free_answer, r); /* the first answer of the request */
    }
    h->len = 0;
    for (i = 1; i + 1 <= n; i += 2) {
        lua_rawgeti(L, 2, i);
        lua_rawgeti(L, 2, i + 1);
        name = lua_tolstring(L, -2, &nlen);
        value = lua_tolstring(L, -1, &vlen);
        typed |= nlen == 12 && strncasecmp(name, "content-type", 12) == 0;
        ric_buf_put(h, name, nlen);
        ric_buf_puts(h, ": ");
        ric_buf_put(h, value, vlen);
        ric_buf_puts(h, "\r\n");
        lua_pop(L, 2);
    }
    if (!typed && status != 204 && status != 304) {
        ric_buf_puts(h, "Content-Type: text/plain\r\n");
    }
    head = h->len;
    ric_buf_put(h, body, blen);
    ric_buf_put(h, "", 1); /* data is never NULL after the first call (an empty answer too) */
    r->script_status = status;
    r->own_fields.data = h->data;
    r->own_fields.len = head;
    r->own_body.data = h->data + head;
    r->own_body.len = blen;
    return 0;
}

/* --- res -------------------------------------------------------------------- */

static int
res_header(lua_State *L)
{
    push_str(L, res_field(L, luaL_checkstring(L, 1)));
    return 1;
}

static int
res_retry_after(lua_State *L)
{
    ric_str_t v = res_field(L, "retry-after");
    int64_t ms;

    if (v.data != NULL && ric_retry_after_parse(v.data, v.len, time(NULL), &ms) == RIC_OK) {
        lua_pushnumber(L, (double) ms / 1000.0);
    } else {
        lua_pushnil(L);
    }
    return 1;
}

/* res:set_header(name, value | nil) in on_response: the field as it goes to
 * the client (nil removes it); framing fields are the gateway's. */
static int
res_set_header(lua_State *L)
{
    ric_request_t *r = current(L);
    size_t n, vn = 0;
    const char *name = luaL_checklstring(L, 1, &n);
    const char *value = lua_isnil(L, 2) ? NULL : luaL_checklstring(L, 2, &vn);

    if (!ric_script_hook.in_on_response) {
        return script_error(L, "res:set_header can only be called in on_response");
    }
    check_field(L, "res:set_header", name, n, value, vn);
    edit_in(L, "res:set_header", r, &r->res_edits, name, n, value, vn);
    return 0;
}

static int
res_body(lua_State *L)
{
    ric_attempt_t *u = current_attempt(L);
    ric_buf_t b = { NULL, 0, 0 };

    if (u == NULL) {
        lua_pushnil(L); /* the gateway's own answer: nothing of an upstream's to read */
        return 1;
    }
    if (u->peeked != 1) {
        /* no classify_body_max, or larger than it: by head only */
        if (ric_script_hook.r->settings->classify_body_max == 0
            && !ric_script_hook.r->location->warned_body_max) {
            /* once per location and worker: nil here is the location's doing */
            ric_script_hook.r->location->warned_body_max = 1;
            ric_log_error(RIC_LOG_WARN, 0, "route script %s: res:body() and res:json() are nil on "
                          "location \"%s\" (%s:%d): it has no classify_body_max (add, say, "
                          "\"classify_body_max 4k;\" to read bodies up to 4 KiB before classify)",
                          ric_script_hook.r->location->refs.script->path,
                          ric_script_hook.r->location->path,
                          ric_script_hook.r->location->file, ric_script_hook.r->location->line);
        }
        lua_pushnil(L);
        return 1;
    }
    ric_http1_peeked_body(&u->client, &b);
    lua_pushlstring(L, b.data ? (const char *) b.data : "", b.len);
    ric_buf_free(&b);
    return 1;
}

/* The request's own table, made when a hook first reads req.ctx. */
static int
ctx_of_request(lua_State *L)
{
    push_ctx(current(L));
    return 1;
}

/* req.client and req.id, made on first read. */
static int
req_client(lua_State *L)
{
    lua_pushstring(L, current(L)->c->peer_ip);
    return 1;
}

static int
req_id(lua_State *L)
{
    char id[33];

    ric_request_id(current(L), id);
    lua_pushlstring(L, id, 32);
    return 1;
}

/* --- ricochet.shared(NAME) ---------------------------------------------------- */

/* The dictionary named by argument 1, or an error where the script called. */
static struct ric_dict_s *
dict_arg(lua_State *L)
{
    size_t n;
    const char *name = luaL_checklstring(L, 1, &n);
    int known;
    struct ric_dict_s *d = ric_shared_dict_find(name, n, &known);

    if (!known) {
        script_error(L, "ricochet.shared: no lua_shared_dict \"%s\" (declare it at http level: "
                     "lua_shared_dict %s 1m;)", name, name);
    }
    if (d == NULL) {
        script_error(L, "ricochet.shared(\"%s\"): the dictionary is there from the first request "
                     "on, not while the script's main chunk runs", name);
    }
    return d;
}

static int
shared_check(lua_State *L)
{
    size_t n;
    const char *name = luaL_checklstring(L, 1, &n);
    int known;

    ric_shared_dict_find(name, n, &known);
    if (!known) {
        /* a main chunk at config time: its lua_shared_dict may come later */
        luaL_where(L, 2);
        known = ric_shared_dict_ask(name, n, lua_tostring(L, -1));
        lua_pop(L, 1);
    }
    if (!known) {
        return script_error(L, "ricochet.shared: no lua_shared_dict \"%s\" (declare it at http "
                            "level: lua_shared_dict %s 1m;)", name, name);
    }
    return 0;
}

static int
shared_get(lua_State *L)
{
    struct ric_dict_s *d = dict_arg(L);
    size_t kn;
    const char *key = luaL_checklstring(L, 2, &kn);
    ric_dict_value_t v;
    char buf[RIC_DICT_VALUE_MAX];

    ric_shared_dict_get(d, key, kn, &v, buf);
    switch (v.type) {
    case RIC_DICT_STRING:
        lua_pushlstring(L, v.str, v.len);
        break;
    case RIC_DICT_NUMBER:
        lua_pushnumber(L, v.num);
        break;
    case RIC_DICT_BOOLEAN:
        lua_pushboolean(L, v.num != 0);
        break;
    default:
        lua_pushnil(L);
    }
    return 1;
}

static int
shared_set(lua_State *L)
{
    struct ric_dict_s *d = dict_arg(L);
    size_t kn;
    const char *key = luaL_checklstring(L, 2, &kn), *why;
    double ttl = luaL_optnumber(L, 4, 0);
    ric_dict_value_t v;

    memset(&v, 0, sizeof(v));
    switch (lua_type(L, 3)) {
    case LUA_TNIL:
    case LUA_TNONE:
        v.type = RIC_DICT_NONE;
        break;
    case LUA_TSTRING:
        v.type = RIC_DICT_STRING;
        v.str = lua_tolstring(L, 3, &v.len);
        break;
    case LUA_TNUMBER:
        v.type = RIC_DICT_NUMBER;
        v.num = lua_tonumber(L, 3);
        break;
    case LUA_TBOOLEAN:
        v.type = RIC_DICT_BOOLEAN;
        v.num = lua_toboolean(L, 3);
        break;
    default:
        return script_error(L, "a shared value is a string, a number or a boolean, not a %s",
                            luaL_typename(L, 3));
    }
    if (!(ttl >= 0) || ttl > 1e9) { /* api.lua said so first; here for the binding alone */
        return script_error(L, "a shared value's ttl is a number of seconds from 0 to 1e9 (0 or "
                            "none: for ever)");
    }
    /* whole milliseconds, up: a ttl under 1 ms is 1 ms, not for ever */
    if (ric_shared_dict_set(d, key, kn, &v, (int64_t) ceil(ttl * 1000), &why) != RIC_OK) {
        return script_error(L, "ricochet.shared: %s", why);
    }
    return 0;
}

static int
shared_incr(lua_State *L)
{
    struct ric_dict_s *d = dict_arg(L);
    size_t kn;
    const char *key = luaL_checklstring(L, 2, &kn);
    double n = luaL_checknumber(L, 3), init, result;
    int has_init = !lua_isnoneornil(L, 4), rc;

    if (kn == 0 || kn > RIC_DICT_KEY_MAX) {
        return script_error(L, "ricochet.shared: a key is 1 to 64 bytes");
    }
    init = has_init ? luaL_checknumber(L, 4) : 0;
    rc = ric_shared_dict_incr(d, key, kn, n, has_init ? &init : NULL, &result);
    if (rc == RIC_ERROR) {
        return script_error(L, "ricochet.shared: incr of \"%s\", which is not a number", key);
    }
    if (rc == RIC_DECLINED) {
        lua_pushnil(L);
        lua_pushliteral(L, "not found");
        return 2;
    }
    lua_pushnumber(L, result);
    return 1;
}

/* --- ricochet.* ------------------------------------------------------------- */

static int
uuid(lua_State *L)
{
    char id[37];

    ric_uuid_v4(id);
    lua_pushlstring(L, id, 36);
    return 1;
}

static void
push_hex(lua_State *L, const unsigned char *md, unsigned n)
{
    static const char digits[] = "0123456789abcdef";
    char hex[2 * EVP_MAX_MD_SIZE];
    unsigned i;

    for (i = 0; i < n; i++) {
        hex[2 * i] = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 15];
    }
    lua_pushlstring(L, hex, 2 * n);
}

/* A digest runs in slices of this many bytes, with the script's deadline
 * read between two (ric_script_expired): a long input stops the hook
 * within one slice's work (well under a millisecond), not at its end. */
#define DIGEST_SLICE (256 << 10)

/* Feeds n bytes of s to d, slice by slice. 1, or 0 when OpenSSL failed;
 * past the hook's deadline it frees d and stops the hook (no return). */
static int
digest_feed(lua_State *L, EVP_MD_CTX *d, const void *s, size_t n)
{
    const unsigned char *p = s;
    size_t k;

    while (n > 0) {
        if (ric_script_expired && ric_script_deadline_passed()) {
            EVP_MD_CTX_free(d);
            ric_script_deadline_stop(L);
        }
        k = n < DIGEST_SLICE ? n : DIGEST_SLICE;
        if (EVP_DigestUpdate(d, p, k) != 1) {
            return 0;
        }
        p += k;
        n -= k;
    }
    return 1;
}

/* SHA-256 of the pieces (a first one of n0 bytes, then one of n1) into md. */
static int
sha256_of(lua_State *L, EVP_MD_CTX *d, const void *s0, size_t n0, const void *s1, size_t n1,
          unsigned char *md)
{
    unsigned len = 0;

    return EVP_DigestInit_ex(d, EVP_sha256(), NULL) == 1 && digest_feed(L, d, s0, n0)
           && digest_feed(L, d, s1, n1) && EVP_DigestFinal_ex(d, md, &len) == 1 && len == 32;
}

static int
sha256(lua_State *L)
{
    size_t n;
    const char *s = luaL_checklstring(L, 1, &n);
    unsigned char md[32];
    EVP_MD_CTX *d = EVP_MD_CTX_new();
    int ok = d != NULL && sha256_of(L, d, s, n, "", 0, md);

    EVP_MD_CTX_free(d);
    if (!ok) {
        return script_error(L, "ricochet.sha256: OpenSSL failed");
    }
    push_hex(L, md, 32);
    return 1;
}

/* HMAC-SHA-256 (RFC 2104) over digest_feed, so that a long key or message
 * is timed as sha256's input is: a key longer than the 64-byte block is
 * hashed first, then H((K ^ opad) || H((K ^ ipad) || message)). */
static int
hmac_sha256(lua_State *L)
{
    size_t kn, n, i;
    const char *key = luaL_checklstring(L, 1, &kn);
    const char *s = luaL_checklstring(L, 2, &n);
    unsigned char k0[64] = { 0 }, pad[64], inner[32], md[32];
    EVP_MD_CTX *d = EVP_MD_CTX_new();
    int ok = d != NULL;

    if (ok && kn > sizeof(k0)) {
        ok = sha256_of(L, d, key, kn, "", 0, k0);
    } else if (ok) {
        memcpy(k0, key, kn);
    }
    for (i = 0; i < sizeof(pad); i++) {
        pad[i] = k0[i] ^ 0x36;
    }
    ok = ok && sha256_of(L, d, pad, sizeof(pad), s, n, inner);
    for (i = 0; i < sizeof(pad); i++) {
        pad[i] = k0[i] ^ 0x5c;
    }
    ok = ok && sha256_of(L, d, pad, sizeof(pad), inner, sizeof(inner), md);
    EVP_MD_CTX_free(d);
    if (!ok) {
        return script_error(L, "ricochet.hmac_sha256: OpenSSL failed");
    }
    push_hex(L, md, 32);
    return 1;
}

static int
now(lua_State *L)
{
    struct timeval tv;

    gettimeofday(&tv, NULL);
    lua_pushnumber(L, (double) tv.tv_sec + (double) tv.tv_usec / 1e6);
    return 1;
}

static int
log_line(lua_State *L)
{
    static const struct { const char *name; int level; } levels[] = {
        { "debug", RIC_LOG_DEBUG }, { "info", RIC_LOG_INFO }, { "notice", RIC_LOG_NOTICE },
        { "warn", RIC_LOG_WARN }, { "error", RIC_LOG_ERR }
    };
    const char *level = luaL_checkstring(L, 1), *msg = luaL_checkstring(L, 2), *where;
    size_t i;

    luaL_where(L, 2); /* the script's line: 1 is api.lua's wrapper */
    where = lua_tostring(L, -1);
    for (i = 0; i < ric_nelems(levels); i++) {
        if (strcmp(level, levels[i].name) == 0) {
            ric_log_error(levels[i].level, 0, "route script: %s%s%s%s", where, msg,
                          ric_script_hook.r ? ", client: " : "",
                          ric_script_hook.r ? ric_script_hook.r->c->peer : "");
            break;
        }
    }
    return 0;
}

void
ric_script_api_push(lua_State *L, void (*ctx_pusher)(ric_request_t *r))
{
    static const luaL_Reg fns[] = {
        { "req_header", req_header }, { "req_set_header", req_set_header },
        { "req_body", req_body }, { "req_headers", req_headers }, { "req_set_idempotency_key", req_set_idempotency_key },
        { "req_idempotency_key", req_idempotency_key }, { "req_respond", req_respond },
        { "res_header", res_header }, { "res_retry_after", res_retry_after },
        { "res_body", res_body }, { "res_set_header", res_set_header },
        { "shared_check", shared_check }, { "shared_get", shared_get }, { "shared_set", shared_set },
        { "shared_incr", shared_incr }, { "ctx", ctx_of_request },
        { "req_client", req_client }, { "req_id", req_id }, { "uuid", uuid }, { "sha256", sha256 },
        { "hmac_sha256", hmac_sha256 }, { "now", now }, { "log", log_line }, { NULL, NULL }
    };

    const luaL_Reg *f;

    push_ctx = ctx_pusher;
    lua_newtable(L);
    for (f = fns; f->name != NULL; f++) {
        lua_pushcfunction(L, f->func);
        lua_setfield(L, -2, f->name);
    }
}

void
ric_script_api_undo(ric_request_t *r)
{
    r->edits = NULL;
    r->script_key = NULL;
    r->script_key_removed = 0;
    r->script_status = 0;
}

int
ric_script_api_respond(ric_request_t *r)
{
    if (r->script_status == 0) {
        return 0;
    }
    r->own_custom = 1;
    ric_request_answer(r, r->script_status, 0);
    return 1;
}
