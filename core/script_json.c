/* script_json.c: cjson and cjson.safe for route scripts, built on the state's allocator and clock. */
#include "script_json.h"
#include "script_deadline.h"

#include <lauxlib.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/*
 * Why not Debian's lua-cjson (2.1.0): its encoder builds the text in a
 * malloc'd buffer the Lua allocator never sees, keeps it between calls
 * (encode_keep_buffer) and leaks it when a Lua error crosses it; its
 * decoder's string buffer, as large as the input, leaks the same way when
 * the state's memory bound refuses a table; its array length is an int
 * that a sparse-array setting lets overflow into an endless loop; and a
 * call never looks at the clock. Wrapping it from outside would mean
 * predicting its memory from its input, which a table that names one
 * large string many times defeats. So the module is ours, with cjson's
 * API, texts and error messages for what scripts do, and three rules:
 * every byte it holds belongs to the state (a Lua string, a userdata, or
 * a block from the state's allocator owned by a userdata the GC frees),
 * so an error raised anywhere in a call leaks nothing and counts against
 * script_memory_max; no setting makes a call unbounded (nesting is capped
 * at RIC_JSON_MAX_DEPTH, an array at RIC_JSON_ARRAY_MAX elements); and the
 * clock is checked every CHECK_EVERY values and at each call's end.
 */

#define CHECK_EVERY 4096     /* values (and KiB of strings) between clock checks */
#define LOCAL_OUT 4096       /* encode output that needs no heap block */
#define MAX_OUT 0x7fffff00u  /* LuaJIT's longest string */

typedef struct {
    int sparse_convert, sparse_ratio, sparse_safe;
    int encode_max_depth, decode_max_depth;
    int precision;
    int encode_invalid; /* 0 refuse NaN and Inf, 1 write them, 2 write null */
    int decode_invalid; /* 1: hex, Inf, NaN, leading zeros and + are read */
    int keep_buffer;    /* accepted for cjson's sake: nothing is ever kept */
} cfg_t;


static const char *const bool_options[] = { "off", "on", NULL };
static const char *const invalid_options[] = { "off", "on", "null", NULL };

#define BUFFER_META "ricochet.json.buffer"

/* --- configuration ------------------------------------------------------------ */

static void
cfg_defaults(cfg_t *cfg)
{
    cfg->sparse_convert = 0;
    cfg->sparse_ratio = 2;
    cfg->sparse_safe = 10;
    cfg->encode_max_depth = RIC_JSON_MAX_DEPTH;
    cfg->decode_max_depth = RIC_JSON_MAX_DEPTH;
    cfg->precision = 14;
    cfg->encode_invalid = 0;
    cfg->decode_invalid = 1;
    cfg->keep_buffer = 1;
}

static cfg_t *
cfg_of(lua_State *L)
{
    return lua_touserdata(L, lua_upvalueindex(1));
}

static void
check_args(lua_State *L, int most)
{
    luaL_argcheck(L, lua_gettop(L) <= most, most + 1, "found too many arguments");
}

/* An on/off (or off/on/null) setting at arg n, as cjson reads it, and
 * pushes its value: a boolean, or the option's name past "on". */
static void
enum_option(lua_State *L, int n, int *setting, const char *const *options)
{
    if (!lua_isnil(L, n)) {
        if (lua_isboolean(L, n)) {
            *setting = lua_toboolean(L, n);
        } else {
            *setting = luaL_checkoption(L, n, NULL, options);
        }
    }
    if (*setting <= 1) {
        lua_pushboolean(L, *setting);
    } else {
        lua_pushstring(L, options[*setting]);
    }
}

/* An integer setting at arg n within [min, max] (cjson names argument 1 in
 * its range error, whatever n is; the range is checked before any cast). */
static void
integer_option(lua_State *L, int n, int *setting, int min, int max)
{
    lua_Integer v;

    if (lua_isnil(L, n)) {
        return;
    }
    v = luaL_checkinteger(L, n);
    if (v < min || v > max) {
        lua_pushfstring(L, "expected integer between %d and %d", min, max);
        luaL_argerror(L, 1, lua_tostring(L, -1));
    }
    *setting = (int) v;
}

static int
l_encode_sparse_array(lua_State *L)
{
    cfg_t *cfg = cfg_of(L);

    check_args(L, 3);
    lua_settop(L, 3);
    enum_option(L, 1, &cfg->sparse_convert, bool_options);
    integer_option(L, 2, &cfg->sparse_ratio, 0, INT_MAX);
    integer_option(L, 3, &cfg->sparse_safe, 0, INT_MAX);
    lua_pushinteger(L, cfg->sparse_ratio);
    lua_pushinteger(L, cfg->sparse_safe);
    return 3;
}

static int
l_encode_max_depth(lua_State *L)
{
    cfg_t *cfg = cfg_of(L);

    check_args(L, 1);
    lua_settop(L, 1);
    integer_option(L, 1, &cfg->encode_max_depth, 1, RIC_JSON_MAX_DEPTH);
    lua_pushinteger(L, cfg->encode_max_depth);
    return 1;
}

static int
l_decode_max_depth(lua_State *L)
{
    cfg_t *cfg = cfg_of(L);

    check_args(L, 1);
    lua_settop(L, 1);
    integer_option(L, 1, &cfg->decode_max_depth, 1, RIC_JSON_MAX_DEPTH);
    lua_pushinteger(L, cfg->decode_max_depth);
    return 1;
}

static int
l_encode_number_precision(lua_State *L)
{
    cfg_t *cfg = cfg_of(L);

    check_args(L, 1);
    lua_settop(L, 1);
    integer_option(L, 1, &cfg->precision, 1, 14);
    lua_pushinteger(L, cfg->precision);
    return 1;
}

static int
l_encode_keep_buffer(lua_State *L)
{
    cfg_t *cfg = cfg_of(L);

    check_args(L, 1);
    lua_settop(L, 1);
    enum_option(L, 1, &cfg->keep_buffer, bool_options);
    return 1;
}

static int
l_encode_invalid_numbers(lua_State *L)
{
    cfg_t *cfg = cfg_of(L);

    check_args(L, 1);
    lua_settop(L, 1);
    enum_option(L, 1, &cfg->encode_invalid, invalid_options);
    return 1;
}

static int
l_decode_invalid_numbers(lua_State *L)
{
    cfg_t *cfg = cfg_of(L);

    check_args(L, 1);
    lua_settop(L, 1);
    enum_option(L, 1, &cfg->decode_invalid, bool_options);
    return 1;
}

/* The clock, every CHECK_EVERY units of work: may raise the stop. */
static void
tick(lua_State *L, int *budget, int units)
{
    *budget -= units;
    if (*budget <= 0) {
        *budget = CHECK_EVERY;
        ric_script_deadline_check(L);
    }
}

/* What a failed call gives: nil and the message (cjson.safe), or the
 * message raised. */
static int
fail(lua_State *L, int safe, const char *msg)
{
    if (safe) {
        lua_pushnil(L);
        lua_pushstring(L, msg);
        return 2;
    }
    lua_pushstring(L, msg);
    return lua_error(L);
}

/* --- decoding ----------------------------------------------------------------- */

enum { T_OBJ_BEGIN, T_OBJ_END, T_ARR_BEGIN, T_ARR_END, T_STRING, T_NUMBER, T_BOOLEAN, T_NULL,
       T_COLON, T_COMMA, T_END, T_ERROR };

/* cjson's names, which its error messages show */
static const char *const token_names[] = { "T_OBJ_BEGIN", "T_OBJ_END", "T_ARR_BEGIN", "T_ARR_END",
                                           "T_STRING", "T_NUMBER", "T_BOOLEAN", "T_NULL",
                                           "T_COLON", "T_COMMA", "T_END", "T_ERROR" };

typedef struct {
    int type;
    size_t at;           /* offset in the text: its start, or where it went wrong */
    const char *str;     /* T_STRING: its bytes (in the text or the scratch) */
    size_t len;
    double num;          /* T_NUMBER; T_BOOLEAN: 0 or 1 */
    const char *problem; /* T_ERROR */
} token_t;

typedef struct {
    lua_State *L;
    const cfg_t *cfg;
    const char *text; /* a Lua string: a NUL ends it, as it ends cjson's */
    const char *p;
    int depth;
    int budget;
    int scratch;      /* the stack slot of the string scratch (a userdata) */
    char *buf;
    size_t cap;
    char msg[160];
} dec_t;

static int
hex4(const char *s)
{
    int v = 0, i, d;

    for (i = 0; i < 4; i++) {
        char c = s[i]; /* stops at the first non-digit: never past the NUL */
        if (c >= '0' && c <= '9') {
            d = c - '0';
        } else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') {
            d = (c | 0x20) - 'a' + 10;
        } else {
            return -1;
        }
        v = v << 4 | d;
    }
    return v;
}

static size_t
put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char) cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char) (0xc0 | cp >> 6);
        o[1] = (char) (0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char) (0xe0 | cp >> 12);
        o[1] = (char) (0x80 | (cp >> 6 & 0x3f));
        o[2] = (char) (0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char) (0xf0 | cp >> 18);
    o[1] = (char) (0x80 | (cp >> 12 & 0x3f));
    o[2] = (char) (0x80 | (cp >> 6 & 0x3f));
    o[3] = (char) (0x80 | (cp & 0x3f));
    return 4;
}

static void
token_error(dec_t *d, token_t *t, const char *at, const char *problem)
{
    t->type = T_ERROR;
    t->at = (size_t) (at - d->text);
    t->problem = problem;
}

/* A string token, d->p at its opening quote. Without escapes its bytes
 * are the text's; with them, they are decoded into the scratch, which is
 * never longer than the text between the quotes. */
static void
string_token(dec_t *d, token_t *t)
{
    const char *start = d->p + 1, *s = start, *end;
    int escapes = 0, cp, lo;
    size_t n;
    char *o;

    while (*s != '"' && *s != '\0') {
        if (*s == '\\') {
            escapes = 1;
            if (s[1] == '\0') {
                break;
            }
            s += 2;
        } else {
            s++;
        }
    }
    end = s;
    tick(d->L, &d->budget, (int) ((size_t) (end - start) >> 10));
    if (!escapes) {
        if (*end != '"') {
            token_error(d, t, end, "unexpected end of string");
            return;
        }
        t->type = T_STRING;
        t->str = start;
        t->len = (size_t) (end - start);
        d->p = end + 1;
        return;
    }
    n = (size_t) (end - start);
    if (n > d->cap) {
        d->cap = n > 2 * d->cap ? n : 2 * d->cap;
        d->buf = lua_newuserdata(d->L, d->cap);
        lua_replace(d->L, d->scratch); /* the old one is garbage */
    }
    o = d->buf;
    for (s = start;;) {
        if (*s == '"') {
            break;
        }
        if (*s == '\0') {
            token_error(d, t, s, "unexpected end of string");
            return;
        }
        if (*s != '\\') {
            *o++ = *s++;
            continue;
        }
        switch (s[1]) {
        case '"': case '\\': case '/':
            *o++ = s[1];
            break;
        case 'b':
            *o++ = '\b';
            break;
        case 'f':
            *o++ = '\f';
            break;
        case 'n':
            *o++ = '\n';
            break;
        case 'r':
            *o++ = '\r';
            break;
        case 't':
            *o++ = '\t';
            break;
        case 'u':
            cp = hex4(s + 2);
            if (cp < 0 || (cp >= 0xdc00 && cp <= 0xdfff)) {
                token_error(d, t, s, "invalid unicode escape code");
                return;
            }
            if (cp >= 0xd800 && cp <= 0xdbff) {
                /* a high surrogate: its low half must follow */
                lo = s[6] == '\\' && s[7] == 'u' ? hex4(s + 8) : -1;
                if (lo < 0xdc00 || lo > 0xdfff) {
                    token_error(d, t, s, "invalid unicode escape code");
                    return;
                }
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                s += 6;
            }
            o += put_utf8(o, (unsigned) cp);
            s += 6;
            continue;
        default:
            token_error(d, t, s, "invalid escape code");
            return;
        }
        s += 2;
    }
    t->type = T_STRING;
    t->str = d->buf;
    t->len = (size_t) (o - d->buf);
    d->p = s + 1;
}

/* What cjson refuses as a number unless decode_invalid_numbers is on: a
 * leading +, hex, leading zeros, inf and nan. */
static int
invalid_number(const char *p)
{
    if (*p == '+') {
        return 1;
    }
    if (*p == '-') {
        p++;
    }
    if (*p == '0') {
        return (p[1] | 0x20) == 'x' || (p[1] >= '0' && p[1] <= '9');
    }
    if (*p <= '9') {
        return 0;
    }
    return strncasecmp(p, "inf", 3) == 0 || strncasecmp(p, "nan", 3) == 0;
}

/* strtod's reading of a number, as cjson's: the same texts give the same
 * values (and the same tokens after them). One call reads the whole
 * number: linear in its length. */
static void
number_token(dec_t *d, token_t *t)
{
    char *end;

    t->num = strtod(d->p, &end);
    if (end == d->p) {
        token_error(d, t, d->p, "invalid number");
        return;
    }
    t->type = T_NUMBER;
    d->p = end;
}

static void
next_token(dec_t *d, token_t *t)
{
    const char *p = d->p;

    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') {
        p++;
    }
    d->p = p;
    t->at = (size_t) (p - d->text);
    switch (*p) {
    case '{':
        t->type = T_OBJ_BEGIN;
        break;
    case '}':
        t->type = T_OBJ_END;
        break;
    case '[':
        t->type = T_ARR_BEGIN;
        break;
    case ']':
        t->type = T_ARR_END;
        break;
    case ',':
        t->type = T_COMMA;
        break;
    case ':':
        t->type = T_COLON;
        break;
    case '\0':
        t->type = T_END;
        return;
    case '"':
        string_token(d, t);
        return;
    default:
        if (*p == '-' || (*p >= '0' && *p <= '9')) {
            if (!d->cfg->decode_invalid && invalid_number(p)) {
                token_error(d, t, p, "invalid number");
            } else {
                number_token(d, t);
            }
        } else if (strncmp(p, "true", 4) == 0) {
            t->type = T_BOOLEAN;
            t->num = 1;
            d->p += 4;
        } else if (strncmp(p, "false", 5) == 0) {
            t->type = T_BOOLEAN;
            t->num = 0;
            d->p += 5;
        } else if (strncmp(p, "null", 4) == 0) {
            t->type = T_NULL;
            d->p += 4;
        } else if (d->cfg->decode_invalid && invalid_number(p)) {
            number_token(d, t);
        } else {
            token_error(d, t, p, "invalid token");
        }
        return;
    }
    d->p++;
}

static int
expected(dec_t *d, const char *what, const token_t *t)
{
    snprintf(d->msg, sizeof(d->msg), "Expected %s but found %s at character %zu", what,
             t->type == T_ERROR ? t->problem : token_names[t->type], t->at + 1);
    return -1;
}

static int parse_value(dec_t *d, token_t *t);

/* One more level of nesting (its token t): refused past decode_max_depth. */
static int
descend(dec_t *d, const token_t *t)
{
    if (++d->depth > d->cfg->decode_max_depth || !lua_checkstack(d->L, 4)) {
        snprintf(d->msg, sizeof(d->msg),
                 "Found too many nested data structures (%d) at character %zu", d->depth,
                 t->at + 1);
        return -1;
    }
    return 0;
}

/* Pushes the object whose '{' is t, or fails (junk left on the stack). */
static int
parse_object(dec_t *d, const token_t *open)
{
    token_t t;

    if (descend(d, open) != 0) {
        return -1;
    }
    lua_newtable(d->L);                                        /* obj */
    next_token(d, &t);
    if (t.type == T_OBJ_END) {
        d->depth--;
        return 0;
    }
    for (;;) {
        if (t.type != T_STRING) {
            return expected(d, "object key string", &t);
        }
        lua_pushlstring(d->L, t.str, t.len);                   /* obj, key */
        next_token(d, &t);
        if (t.type != T_COLON) {
            return expected(d, "colon", &t);
        }
        next_token(d, &t);
        if (parse_value(d, &t) != 0) {                         /* obj, key, value */
            return -1;
        }
        lua_rawset(d->L, -3);                                  /* obj */
        next_token(d, &t);
        if (t.type == T_OBJ_END) {
            break;
        }
        if (t.type != T_COMMA) {
            return expected(d, "comma or object end", &t);
        }
        next_token(d, &t);
    }
    d->depth--;
    return 0;
}

static int
parse_array(dec_t *d, const token_t *open)
{
    token_t t;
    int i;

    if (descend(d, open) != 0) {
        return -1;
    }
    lua_newtable(d->L);                                        /* arr */
    next_token(d, &t);
    if (t.type == T_ARR_END) {
        d->depth--;
        return 0;
    }
    for (i = 1;; i++) {
        if (parse_value(d, &t) != 0) {                         /* arr, value */
            return -1;
        }
        lua_rawseti(d->L, -2, i);                              /* arr */
        next_token(d, &t);
        if (t.type == T_ARR_END) {
            break;
        }
        if (t.type != T_COMMA) {
            return expected(d, "comma or array end", &t);
        }
        next_token(d, &t);
    }
    d->depth--;
    return 0;
}

/* Pushes the value that starts with t, or fails. */
static int
parse_value(dec_t *d, token_t *t)
{
    tick(d->L, &d->budget, 1);
    switch (t->type) {
    case T_STRING:
        lua_pushlstring(d->L, t->str, t->len);
        return 0;
    case T_NUMBER:
        lua_pushnumber(d->L, t->num);
        return 0;
    case T_BOOLEAN:
        lua_pushboolean(d->L, t->num != 0);
        return 0;
    case T_NULL:
        lua_pushlightuserdata(d->L, NULL);
        return 0;
    case T_OBJ_BEGIN:
        return parse_object(d, t);
    case T_ARR_BEGIN:
        return parse_array(d, t);
    default:
        return expected(d, "value", t);
    }
}

static int
l_decode(lua_State *L)
{
    int safe = lua_toboolean(L, lua_upvalueindex(2));
    dec_t d;
    token_t t;
    size_t len;
    int rc;

    luaL_argcheck(L, lua_gettop(L) == 1, 1, "expected 1 argument");
    if (safe && !lua_isstring(L, 1)) {
        /* the text cjson.safe gives: its inner call has no name */
        lua_pushfstring(L, "bad argument #1 to '?' (string expected, got %s)",
                        luaL_typename(L, 1));
        return fail(L, safe, lua_tostring(L, -1));
    }
    d.text = luaL_checklstring(L, 1, &len);
    d.L = L;
    d.cfg = cfg_of(L);
    d.p = d.text;
    d.depth = 0;
    d.budget = CHECK_EVERY;
    d.buf = NULL;
    d.cap = 0;
    lua_pushnil(L);                                            /* text, scratch */
    d.scratch = 2;
    if (len >= 2 && (d.text[0] == '\0' || d.text[1] == '\0')) {
        return fail(L, safe, "JSON parser does not support UTF-16 or UTF-32");
    }
    next_token(&d, &t);
    rc = parse_value(&d, &t);                                  /* text, scratch, value */
    if (rc == 0) {
        next_token(&d, &t);
        if (t.type != T_END) {
            rc = expected(&d, "the end", &t);
        }
    }
    ric_script_deadline_check(L);
    if (rc != 0) {
        lua_settop(L, 0);
        return fail(L, safe, d.msg);
    }
    return 1;
}

/* --- encoding ----------------------------------------------------------------- */

/* A block of the state's allocator: what a grown output lives in, freed
 * by the encoder when it is done, or by the GC after an error crossed it. */
typedef struct {
    char *data;
    size_t cap;
    lua_Alloc alloc;
    void *ud;
} heap_t;

static int
l_heap_gc(lua_State *L)
{
    heap_t *h = lua_touserdata(L, 1);

    if (h != NULL && h->data != NULL) {
        h->alloc(h->ud, h->data, h->cap, 0);
        h->data = NULL;
    }
    return 0;
}

typedef struct {
    lua_State *L;
    const cfg_t *cfg;
    char *data;
    size_t len, cap;
    heap_t *heap; /* NULL while data is local */
    int heap_slot;
    int budget;
    char msg[160];
    char local[LOCAL_OUT];
} enc_t;

static void
heap_release(enc_t *e)
{
    if (e->heap != NULL && e->heap->data != NULL) {
        e->heap->alloc(e->heap->ud, e->heap->data, e->heap->cap, 0);
        e->heap->data = NULL;
    }
}

/* Room for n more bytes: a larger block, or the memory error (the bound
 * refused it; the old block stays the userdata's, for the GC). */
static void
grow(enc_t *e, size_t n)
{
    size_t want = e->len + n, cap = 2 * e->cap;
    char *p;

    if (n > MAX_OUT || want > MAX_OUT) {
        lua_pushliteral(e->L, "not enough memory");
        lua_error(e->L);
    }
    cap = cap < want ? want : cap > MAX_OUT ? MAX_OUT : cap;
    if (e->heap == NULL) {
        e->heap = lua_newuserdata(e->L, sizeof(heap_t));
        e->heap->data = NULL;
        e->heap->cap = 0;
        e->heap->alloc = lua_getallocf(e->L, &e->heap->ud);
        luaL_getmetatable(e->L, BUFFER_META);
        lua_setmetatable(e->L, -2);
        lua_replace(e->L, e->heap_slot);
    }
    p = e->heap->alloc(e->heap->ud, e->heap->data, e->heap->cap, cap);
    if (p == NULL) {
        lua_pushliteral(e->L, "not enough memory");
        lua_error(e->L);
    }
    if (e->heap->data == NULL) {
        memcpy(p, e->data, e->len);
    }
    e->heap->data = p;
    e->heap->cap = cap;
    e->data = p;
    e->cap = cap;
}

static inline void
reserve(enc_t *e, size_t n)
{
    if (e->cap - e->len < n) {
        grow(e, n);
    }
}

static inline void
put(enc_t *e, const char *s, size_t n)
{
    reserve(e, n);
    memcpy(e->data + e->len, s, n);
    e->len += n;
}

static inline void
put_char(enc_t *e, char c)
{
    reserve(e, 1);
    e->data[e->len++] = c;
}

static int
refuse(enc_t *e, int idx, const char *why)
{
    snprintf(e->msg, sizeof(e->msg), "Cannot serialise %s: %s", luaL_typename(e->L, idx), why);
    return -1;
}

/* A byte cjson escapes: controls, '"', '\\', '/' and DEL. */
static inline int
escaped(unsigned char c)
{
    return c < 0x20 || c == '"' || c == '\\' || c == '/' || c == 0x7f;
}

static void
put_string(enc_t *e, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t i = 0, run;
    unsigned char c;

    tick(e->L, &e->budget, (int) (n >> 10));
    put_char(e, '"');
    while (i < n) {
        for (run = i; run < n && !escaped((unsigned char) s[run]); run++) {
        }
        put(e, s + i, run - i);
        if (run == n) {
            break;
        }
        c = (unsigned char) s[run];
        reserve(e, 6);
        e->data[e->len++] = '\\';
        switch (c) {
        case '\b':
            e->data[e->len++] = 'b';
            break;
        case '\t':
            e->data[e->len++] = 't';
            break;
        case '\n':
            e->data[e->len++] = 'n';
            break;
        case '\f':
            e->data[e->len++] = 'f';
            break;
        case '\r':
            e->data[e->len++] = 'r';
            break;
        case '"': case '\\': case '/':
            e->data[e->len++] = (char) c;
            break;
        default:
            memcpy(e->data + e->len, "u00", 3);
            e->data[e->len + 3] = hex[c >> 4];
            e->data[e->len + 4] = hex[c & 15];
            e->len += 5;
        }
        i = run + 1;
    }
    put_char(e, '"');
}

/* A number as cjson writes it: %.14g (encode_number_precision digits). */
static int
put_number(enc_t *e, double v, int idx)
{
    static const double below[] = { 0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11,
                                     1e12, 1e13, 1e14 };
    char tmp[32], *q;
    unsigned long long u;
    int n;

    if (isnan(v) || isinf(v)) {
        if (e->cfg->encode_invalid == 0) {
            return refuse(e, idx, "must not be NaN or Inf");
        }
        if (e->cfg->encode_invalid == 2) {
            put(e, "null", 4);
        } else if (isnan(v)) {
            put(e, "nan", 3);
        } else {
            put(e, v < 0 ? "-inf" : "inf", v < 0 ? 4 : 3);
        }
        return 0;
    }
    if (v == floor(v) && fabs(v) < below[e->cfg->precision] && (v != 0 || !signbit(v))) {
        /* an integer with no more digits than the precision: %g's own text */
        u = (unsigned long long) fabs(v);
        q = tmp + sizeof(tmp);
        do {
            *--q = (char) ('0' + u % 10);
            u /= 10;
        } while (u != 0);
        if (v < 0) {
            *--q = '-';
        }
        put(e, q, (size_t) (tmp + sizeof(tmp) - q));
        return 0;
    }
    n = snprintf(tmp, sizeof(tmp), "%.*g", e->cfg->precision, v);
    put(e, tmp, (size_t) n);
    return 0;
}

static int encode_value(enc_t *e, int depth);

/* The table on top's length as an array (cjson's rules: every key an
 * integer from 1 to INT_MAX, not too sparse), -1 for an object, -2
 * refused. */
static double
array_length(enc_t *e)
{
    const cfg_t *cfg = e->cfg;
    double k, max = 0, items = 0;

    lua_pushnil(e->L);                                         /* t, nil */
    while (lua_next(e->L, -2) != 0) {                          /* t, k, v */
        tick(e->L, &e->budget, 1);
        if (lua_type(e->L, -2) == LUA_TNUMBER) {
            k = lua_tonumber(e->L, -2);
            /* an index past INT_MAX (cjson's int) makes it an object */
            if (k >= 1 && floor(k) == k && k <= INT_MAX) {
                max = k > max ? k : max;
                items++;
                lua_pop(e->L, 1);                              /* t, k */
                continue;
            }
        }
        lua_pop(e->L, 2);                                      /* t */
        return -1;
    }
    if (cfg->sparse_ratio > 0 && max > items * cfg->sparse_ratio && max > cfg->sparse_safe) {
        if (!cfg->sparse_convert) {
            refuse(e, -1, "excessively sparse array");
            return -2;
        }
        return -1;
    }
    if (max > RIC_JSON_ARRAY_MAX) {
        snprintf(e->msg, sizeof(e->msg), "Cannot serialise table: array index %.14g is over %d",
                 max, RIC_JSON_ARRAY_MAX);
        return -2;
    }
    return max;
}

/* The table on top, at depth (1: the outermost). */
static int
encode_table(enc_t *e, int depth)
{
    lua_State *L = e->L;
    double n;
    int i, first = 1;

    if (depth > e->cfg->encode_max_depth || !lua_checkstack(L, 4)) {
        snprintf(e->msg, sizeof(e->msg), "Cannot serialise, excessive nesting (%d)", depth);
        return -1;
    }
    n = array_length(e);
    if (n == -2) {
        return -1;
    }
    if (n > 0) {
        put_char(e, '[');
        for (i = 1; i <= (int) n; i++) {
            if (i > 1) {
                put_char(e, ',');
            }
            lua_rawgeti(L, -1, i);                             /* t, v */
            if (encode_value(e, depth) != 0) {
                return -1;
            }
            lua_pop(L, 1);                                     /* t */
        }
        put_char(e, ']');
        return 0;
    }
    put_char(e, '{');
    lua_pushnil(L);                                            /* t, nil */
    while (lua_next(L, -2) != 0) {                             /* t, k, v */
        if (!first) {
            put_char(e, ',');
        }
        first = 0;
        if (lua_type(L, -2) == LUA_TNUMBER) {
            put_char(e, '"');
            if (put_number(e, lua_tonumber(L, -2), -2) != 0) {
                return -1;
            }
            put(e, "\":", 2);
        } else if (lua_type(L, -2) == LUA_TSTRING) {
            size_t len;
            const char *k = lua_tolstring(L, -2, &len);
            put_string(e, k, len);
            put_char(e, ':');
        } else {
            return refuse(e, -2, "table key must be a number or string");
        }
        if (encode_value(e, depth) != 0) {
            return -1;
        }
        lua_pop(L, 1);                                         /* t, k */
    }
    put_char(e, '}');
    return 0;
}

/* The value on top, inside a table at depth (0: none). */
static int
encode_value(enc_t *e, int depth)
{
    lua_State *L = e->L;
    const char *s;
    size_t len;

    tick(L, &e->budget, 1);
    switch (lua_type(L, -1)) {
    case LUA_TSTRING:
        s = lua_tolstring(L, -1, &len);
        put_string(e, s, len);
        return 0;
    case LUA_TNUMBER:
        return put_number(e, lua_tonumber(L, -1), -1);
    case LUA_TBOOLEAN:
        if (lua_toboolean(L, -1)) {
            put(e, "true", 4);
        } else {
            put(e, "false", 5);
        }
        return 0;
    case LUA_TNIL:
        put(e, "null", 4);
        return 0;
    case LUA_TLIGHTUSERDATA:
        if (lua_touserdata(L, -1) == NULL) {
            put(e, "null", 4);
            return 0;
        }
        return refuse(e, -1, "type not supported");
    case LUA_TTABLE:
        return encode_table(e, depth + 1);
    default:
        return refuse(e, -1, "type not supported");
    }
}

static int
l_encode(lua_State *L)
{
    int safe = lua_toboolean(L, lua_upvalueindex(2)), rc;
    enc_t e;

    luaL_argcheck(L, lua_gettop(L) == 1, 1, "expected 1 argument");
    e.L = L;
    e.cfg = cfg_of(L);
    e.data = e.local;
    e.len = 0;
    e.cap = sizeof(e.local);
    e.heap = NULL;
    e.budget = CHECK_EVERY;
    lua_pushnil(L);                                            /* value, heap */
    e.heap_slot = 2;
    lua_pushvalue(L, 1);                                       /* value, heap, value */
    rc = encode_value(&e, 0);
    if (rc == 0) {
        lua_pushlstring(L, e.data, e.len);                     /* ..., text */
    }
    heap_release(&e);
    ric_script_deadline_check(L);
    if (rc != 0) {
        lua_settop(L, 0);
        return fail(L, safe, e.msg);
    }
    return 1;
}

/* --- the module --------------------------------------------------------------- */

static void push_module(lua_State *L, int safe);

static int
l_new(lua_State *L)
{
    push_module(L, lua_toboolean(L, lua_upvalueindex(1)));
    return 1;
}

/* Pushes a module table of its own settings: cjson's, or cjson.safe's
 * (whose encode and decode return nil and the message instead of raising
 * it; a stop or a memory error is raised all the same). */
static void
push_module(lua_State *L, int safe)
{
    static const luaL_Reg fns[] = {
        { "encode", l_encode },
        { "decode", l_decode },
        { "encode_sparse_array", l_encode_sparse_array },
        { "encode_max_depth", l_encode_max_depth },
        { "decode_max_depth", l_decode_max_depth },
        { "encode_number_precision", l_encode_number_precision },
        { "encode_keep_buffer", l_encode_keep_buffer },
        { "encode_invalid_numbers", l_encode_invalid_numbers },
        { "decode_invalid_numbers", l_decode_invalid_numbers },
        { NULL, NULL }
    };
    const luaL_Reg *f;

    lua_createtable(L, 0, 14);                                 /* m */
    cfg_defaults(lua_newuserdata(L, sizeof(cfg_t)));           /* m, cfg */
    for (f = fns; f->name != NULL; f++) {
        lua_pushvalue(L, -1);
        lua_pushboolean(L, safe);
        lua_pushcclosure(L, f->func, 2);                       /* m, cfg, fn */
        lua_setfield(L, -3, f->name);
    }
    lua_pop(L, 1);                                             /* m */
    lua_pushboolean(L, safe);
    lua_pushcclosure(L, l_new, 1);
    lua_setfield(L, -2, "new");
    lua_pushlightuserdata(L, NULL);
    lua_setfield(L, -2, "null");
    lua_pushliteral(L, "cjson");
    lua_setfield(L, -2, "_NAME");
    lua_pushliteral(L, "2.1.0");
    lua_setfield(L, -2, "_VERSION");
}

void
ric_script_json_open(lua_State *L)
{
    luaL_newmetatable(L, BUFFER_META);                         /* mt */
    lua_pushcfunction(L, l_heap_gc);
    lua_setfield(L, -2, "__gc");
    lua_pop(L, 1);
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "loaded");                             /* package, loaded */
    push_module(L, 0);
    lua_setfield(L, -2, "cjson");
    push_module(L, 1);
    lua_setfield(L, -2, "cjson.safe");
    lua_pop(L, 2);
}
