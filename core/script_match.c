/* script_match.c: Lua 5.1 patterns (find, match, gmatch, gsub) for route scripts, stopped at the hook's deadline. */
#include "script_match.h"
#include "script_deadline.h"

#include <lauxlib.h>
#include <stdint.h>
#include <string.h>

/*
 * LuaJIT's matcher backtracks without bound and cannot be interrupted: a
 * pattern such as ".-.-.-.-.-.-b" over 300 bytes runs for minutes inside
 * one call. This one gives the same results (the same backtracking order,
 * captures, errors and quirks as LuaJIT 2.1's string library: see the
 * unit test and the fuzz target, which compare the two), and reads the
 * hook's deadline (ric_script_expired, set by script.c's alarm) at every
 * step, so a hook past script_timeout is stopped within one step. Plain
 * searches use memmem, linear where LuaJIT's is length × length.
 */

#define ESC '%'
#define MAX_CAPTURES 32 /* LuaJIT's LUA_MAXCAPTURES */
#define MAX_DEPTH 200   /* LuaJIT's LJ_MAX_XLEVEL: "pattern too complex" past it */
#define CAP_OPEN (-1)   /* a capture begun, not closed */
#define CAP_POS (-2)    /* a position capture: () */

typedef struct {
    lua_State *L;
    const char *start, *end; /* the subject */
    int depth;
    int ncap;
    struct {
        const char *at;
        ptrdiff_t len; /* or CAP_OPEN, CAP_POS */
    } cap[MAX_CAPTURES];
} matcher_t;

static const char *step(matcher_t *m, const char *s, const char *p);

/* Stops the hook here when it is past its bound (one load while it is not). */
static void
tick(matcher_t *m)
{
    if (ric_script_expired && ric_script_deadline_passed()) {
        ric_script_deadline_stop(m->L);
    }
}

/* The byte classes of a pattern (%a ...), in the C locale, ASCII only, as
 * LuaJIT's own character tables say. */
static int
in_class(int c, int cl)
{
    int yes;

    switch (cl | 0x20) {
    case 'a': yes = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); break;
    case 'c': yes = c < 32 || c == 127; break;
    case 'd': yes = c >= '0' && c <= '9'; break;
    case 'g': yes = c > 32 && c < 127; break; /* LuaJIT has Lua 5.2's %g */
    case 'l': yes = c >= 'a' && c <= 'z'; break;
    case 'p': yes = c > 32 && c < 127 && !in_class(c, 'w'); break;
    case 's': yes = c == ' ' || (c >= '\t' && c <= '\r'); break;
    case 'u': yes = c >= 'A' && c <= 'Z'; break;
    case 'w': yes = in_class(c, 'a') || in_class(c, 'd'); break;
    case 'x': yes = in_class(c, 'd') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); break;
    case 'z': yes = c == 0; break;
    default: return cl == c; /* %. %% %] ...: the byte itself, never its complement */
    }
    return (cl >= 'A' && cl <= 'Z') ? !yes : yes;
}

/* The end of the single-byte item at p (past its %x or [set]). */
static const char *
item_end(matcher_t *m, const char *p)
{
    switch (*p++) {
    case ESC:
        if (*p == '\0') {
            luaL_error(m->L, "malformed pattern (ends with '%%')");
        }
        return p + 1;
    case '[':
        if (*p == '^') {
            p++;
        }
        do { /* the first byte is in the set even when it is ']' */
            if (*p == '\0') {
                luaL_error(m->L, "malformed pattern (missing ']')");
            }
            if (*p++ == ESC && *p != '\0') {
                p++;
            }
        } while (*p != ']');
        return p + 1;
    default:
        return p;
    }
}

/* Whether c is in the set from '[' at p to its ']' at close. */
static int
in_set(int c, const char *p, const char *close)
{
    int want = 1;

    if (p[1] == '^') {
        want = 0;
        p++;
    }
    while (++p < close) {
        if (*p == ESC) {
            p++;
            if (in_class(c, (unsigned char) *p)) {
                return want;
            }
        } else if (p[1] == '-' && p + 2 < close) {
            if ((unsigned char) p[0] <= c && c <= (unsigned char) p[2]) {
                return want;
            }
            p += 2;
        } else if ((unsigned char) *p == c) {
            return want;
        }
    }
    return !want;
}

/* Whether byte c matches the item from p to ep. */
static int
item_matches(int c, const char *p, const char *ep)
{
    switch (*p) {
    case '.': return 1;
    case ESC: return in_class(c, (unsigned char) p[1]);
    case '[': return in_set(c, p, ep - 1);
    default: return (unsigned char) *p == c;
    }
}

/* item* : as many as match, then fewer until the rest matches. */
static const char *
longest(matcher_t *m, const char *s, const char *p, const char *ep)
{
    ptrdiff_t n = 0;
    const char *r;

    while (s + n < m->end && item_matches((unsigned char) s[n], p, ep)) {
        n++;
        tick(m);
    }
    for (; n >= 0; n--) {
        if ((r = step(m, s + n, ep + 1)) != NULL) {
            return r;
        }
    }
    return NULL;
}

/* item- : as few as let the rest match. */
static const char *
shortest(matcher_t *m, const char *s, const char *p, const char *ep)
{
    const char *r;

    for (;;) {
        if ((r = step(m, s, ep + 1)) != NULL) {
            return r;
        }
        if (s >= m->end || !item_matches((unsigned char) *s, p, ep)) {
            return NULL;
        }
        s++;
    }
}

static const char *
open_capture(matcher_t *m, const char *s, const char *p, ptrdiff_t kind)
{
    const char *r;

    if (m->ncap >= MAX_CAPTURES) {
        luaL_error(m->L, "too many captures");
    }
    m->cap[m->ncap].at = s;
    m->cap[m->ncap].len = kind;
    m->ncap++;
    if ((r = step(m, s, p)) == NULL) {
        m->ncap--;
    }
    return r;
}

static const char *
close_capture(matcher_t *m, const char *s, const char *p)
{
    int i;
    const char *r;

    for (i = m->ncap - 1; i >= 0 && m->cap[i].len != CAP_OPEN; i--) {
    }
    if (i < 0) {
        luaL_error(m->L, "invalid pattern capture");
    }
    m->cap[i].len = s - m->cap[i].at;
    if ((r = step(m, s, p)) == NULL) {
        m->cap[i].len = CAP_OPEN;
    }
    return r;
}

/* %1..%9: the text of a closed capture again. */
static const char *
same_as_capture(matcher_t *m, const char *s, int digit)
{
    int i = digit - '1';
    size_t len;

    if (i < 0 || i >= m->ncap || m->cap[i].len == CAP_OPEN) {
        luaL_error(m->L, "invalid capture index");
    }
    len = (size_t) m->cap[i].len; /* a position capture's is huge: it never matches */
    if ((size_t) (m->end - s) >= len && memcmp(m->cap[i].at, s, len) == 0) {
        return s + len;
    }
    return NULL;
}

/* %bxy: from an x to its balancing y. */
static const char *
balanced(matcher_t *m, const char *s, const char *p)
{
    int depth = 1;

    if (p[0] == '\0' || p[1] == '\0') {
        luaL_error(m->L, "unbalanced pattern");
    }
    if (s >= m->end || *s != p[0]) {
        return NULL;
    }
    while (++s < m->end) {
        tick(m);
        if (*s == p[1]) {
            if (--depth == 0) {
                return s + 1;
            }
        } else if (*s == p[0]) {
            depth++;
        }
    }
    return NULL;
}

/* Matches the pattern at p (up to its NUL: a pattern ends at its first
 * zero byte, as LuaJIT's does) against the subject at s. The end of the
 * match, or NULL. Recursion only where LuaJIT's recurses, so that "pattern
 * too complex" comes at the same depth. */
static const char *
step(matcher_t *m, const char *s, const char *p)
{
    const char *ep, *r;
    int hit;

    if (++m->depth > MAX_DEPTH) {
        luaL_error(m->L, "pattern too complex");
    }
    for (;;) {
        tick(m);
        switch (*p) {
        case '\0':
            goto done;
        case '(':
            s = p[1] == ')' ? open_capture(m, s, p + 2, CAP_POS)
                            : open_capture(m, s, p + 1, CAP_OPEN);
            goto done;
        case ')':
            s = close_capture(m, s, p + 1);
            goto done;
        case '$':
            if (p[1] == '\0') {
                s = s == m->end ? s : NULL;
                goto done;
            }
            break;
        case ESC:
            if (p[1] == 'b') {
                if ((s = balanced(m, s, p + 2)) == NULL) {
                    goto done;
                }
                p += 4;
                continue;
            }
            if (p[1] == 'f') {
                int before, at;

                p += 2;
                if (*p != '[') {
                    luaL_error(m->L, "missing '[' after '%%f' in pattern");
                }
                ep = item_end(m, p);
                before = s == m->start ? 0 : (unsigned char) s[-1];
                at = s < m->end ? (unsigned char) *s : 0;
                if (in_set(before, p, ep - 1) || !in_set(at, p, ep - 1)) {
                    s = NULL;
                    goto done;
                }
                p = ep;
                continue;
            }
            if (p[1] >= '0' && p[1] <= '9') {
                if ((s = same_as_capture(m, s, (unsigned char) p[1])) == NULL) {
                    goto done;
                }
                p += 2;
                continue;
            }
            break;
        default:
            break;
        }
        /* a single-byte item, maybe with a quantifier after it */
        ep = item_end(m, p);
        hit = s < m->end && item_matches((unsigned char) *s, p, ep);
        switch (*ep) {
        case '?':
            if (hit && (r = step(m, s + 1, ep + 1)) != NULL) {
                s = r;
                goto done;
            }
            p = ep + 1;
            continue;
        case '*':
            s = longest(m, s, p, ep);
            goto done;
        case '+':
            s = hit ? longest(m, s + 1, p, ep) : NULL;
            goto done;
        case '-':
            s = shortest(m, s, p, ep);
            goto done;
        default:
            if (!hit) {
                s = NULL;
                goto done;
            }
            s++;
            p = ep;
            continue;
        }
    }
done:
    m->depth--;
    return s;
}

/* Pushes capture i (the whole match from s to e when the pattern has none). */
static void
push_capture(matcher_t *m, int i, const char *s, const char *e)
{
    if (i >= m->ncap) {
        if (i != 0) {
            luaL_error(m->L, "invalid capture index");
        }
        lua_pushlstring(m->L, s, (size_t) (e - s));
    } else if (m->cap[i].len == CAP_OPEN) {
        luaL_error(m->L, "unfinished capture");
    } else if (m->cap[i].len == CAP_POS) {
        lua_pushinteger(m->L, m->cap[i].at - m->start + 1);
    } else {
        lua_pushlstring(m->L, m->cap[i].at, (size_t) m->cap[i].len);
    }
}

/* Pushes every capture (or the whole match, when s is not NULL and the
 * pattern has none); their count. */
static int
push_captures(matcher_t *m, const char *s, const char *e)
{
    int i, n = m->ncap == 0 && s != NULL ? 1 : m->ncap;

    luaL_checkstack(m->L, n, "too many captures");
    for (i = 0; i < n; i++) {
        push_capture(m, i, s, e);
    }
    return n;
}

static void
matcher_init(matcher_t *m, lua_State *L, const char *s, size_t len)
{
    m->L = L;
    m->start = s;
    m->end = s + len;
}

static const char *
match_at(matcher_t *m, const char *s, const char *p)
{
    m->ncap = 0;
    m->depth = 0;
    return step(m, s, p);
}

/* A byte that makes a pattern more than a plain string (LuaJIT's list). */
static int
has_specials(const char *p, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        if (p[i] != '\0' && strchr("^$*+?.([%-", p[i]) != NULL) {
            return 1;
        }
    }
    return 0;
}

/* string.find (find) and string.match (!find). */
static int
find_or_match(lua_State *L, int find)
{
    size_t len, plen;
    const char *s = luaL_checklstring(L, 1, &len);
    const char *p = luaL_checklstring(L, 2, &plen);
    const char *at, *e;
    int32_t init = lua_isnoneornil(L, 3) ? 1 : (int32_t) luaL_checknumber(L, 3);
    int anchored = 0;
    matcher_t m;

    /* init as LuaJIT reads it: negative from the end, past the end the end */
    init = init < 0 ? init + (int32_t) len : init - 1;
    init = init < 0 ? 0 : init;
    at = s + ((size_t) init > len ? len : (size_t) init);
    if (find && ((lua_gettop(L) >= 4 && lua_toboolean(L, 4)) || !has_specials(p, plen))) {
        e = memmem(at, (size_t) (s + len - at), p, plen); /* linear, unlike a naive scan */
        if (e == NULL) {
            lua_pushnil(L);
            return 1;
        }
        lua_pushinteger(L, e - s + 1);
        lua_pushinteger(L, e - s + (ptrdiff_t) plen);
        return 2;
    }
    if (*p == '^') {
        anchored = 1;
        p++;
    }
    matcher_init(&m, L, s, len);
    do {
        if ((e = match_at(&m, at, p)) != NULL) {
            if (!find) {
                return push_captures(&m, at, e);
            }
            lua_pushinteger(L, at - s + 1);
            lua_pushinteger(L, e - s);
            return push_captures(&m, NULL, NULL) + 2;
        }
    } while (at++ < m.end && !anchored);
    lua_pushnil(L);
    return 1;
}

static int
l_find(lua_State *L)
{
    return find_or_match(L, 1);
}

static int
l_match(lua_State *L)
{
    return find_or_match(L, 0);
}

/* gmatch's iterator: upvalues subject, pattern, offset of the next try. */
static int
gmatch_next(lua_State *L)
{
    size_t len;
    const char *s = lua_tolstring(L, lua_upvalueindex(1), &len);
    const char *p = lua_tostring(L, lua_upvalueindex(2));
    const char *at = s + (size_t) lua_tointeger(L, lua_upvalueindex(3)), *e;
    matcher_t m;

    matcher_init(&m, L, s, len);
    for (; at <= m.end; at++) {
        if ((e = match_at(&m, at, p)) != NULL) {
            /* an empty match moves on by one byte, as LuaJIT's does */
            lua_pushinteger(L, e - s + (e == at));
            lua_replace(L, lua_upvalueindex(3));
            return push_captures(&m, at, e);
        }
    }
    return 0;
}

/* string.gmatch: no init, and '^' is an ordinary byte here (LuaJIT's way). */
static int
l_gmatch(lua_State *L)
{
    luaL_checkstring(L, 1);
    luaL_checkstring(L, 2);
    lua_settop(L, 2);
    lua_pushinteger(L, 0);
    lua_pushcclosure(L, gmatch_next, 3);
    return 1;
}

/* Appends the replacement string (argument 3) with its %0..%9 and %x. */
static void
add_replacement(matcher_t *m, luaL_Buffer *b, const char *s, const char *e)
{
    size_t len, i;
    const char *r = lua_tolstring(m->L, 3, &len);

    for (i = 0; i < len; i++) {
        if (r[i] != ESC) {
            luaL_addchar(b, r[i]);
            continue;
        }
        i++; /* a '%' at the end adds the string's terminating zero, as LuaJIT's does */
        if (r[i] < '0' || r[i] > '9') {
            luaL_addchar(b, r[i]);
        } else if (r[i] == '0') {
            luaL_addlstring(b, s, (size_t) (e - s));
        } else {
            push_capture(m, r[i] - '1', s, e);
            luaL_addvalue(b);
        }
    }
}

/* Appends what replaces the match from s to e. */
static void
add_value(matcher_t *m, luaL_Buffer *b, const char *s, const char *e)
{
    lua_State *L = m->L;

    switch (lua_type(L, 3)) {
    case LUA_TFUNCTION:
        lua_pushvalue(L, 3);
        lua_call(L, push_captures(m, s, e), 1);
        break;
    case LUA_TTABLE:
        push_capture(m, 0, s, e);
        lua_gettable(L, 3);
        break;
    default: /* a string or a number */
        add_replacement(m, b, s, e);
        return;
    }
    if (!lua_toboolean(L, -1)) {
        lua_pop(L, 1);
        lua_pushlstring(L, s, (size_t) (e - s)); /* nil or false: the match stays */
    } else if (!lua_isstring(L, -1)) {
        luaL_error(L, "invalid replacement value (a %s)", luaL_typename(L, -1));
    }
    luaL_addvalue(b);
}

static int
l_gsub(lua_State *L)
{
    size_t len;
    const char *s = luaL_checklstring(L, 1, &len);
    const char *p = luaL_checkstring(L, 2);
    int type = lua_type(L, 3);
    int max = luaL_optint(L, 4, (int) (len + 1));
    int anchored = 0, n = 0;
    const char *e;
    matcher_t m;
    luaL_Buffer b;

    if (*p == '^') {
        anchored = 1;
        p++;
    }
    if (type != LUA_TNUMBER && type != LUA_TSTRING && type != LUA_TFUNCTION
        && type != LUA_TTABLE) {
        luaL_argerror(L, 3, "string/function/table expected");
    }
    luaL_buffinit(L, &b);
    matcher_init(&m, L, s, len);
    while (n < max) {
        if ((e = match_at(&m, s, p)) != NULL) {
            n++;
            add_value(&m, &b, s, e);
        }
        if (e != NULL && e > s) {
            s = e;
        } else if (s < m.end) {
            luaL_addchar(&b, *s++);
        } else {
            break;
        }
        if (anchored) {
            break;
        }
    }
    luaL_addlstring(&b, s, (size_t) (m.end - s));
    luaL_pushresult(&b);
    lua_pushinteger(L, n);
    return 2;
}

void
ric_script_match_push(lua_State *L)
{
    static const luaL_Reg fns[] = {
        { "find", l_find }, { "match", l_match }, { "gmatch", l_gmatch }, { "gsub", l_gsub },
        { NULL, NULL },
    };

    lua_newtable(L);
    luaL_register(L, NULL, fns);
}
