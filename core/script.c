/* script.c: route scripts: one LuaJIT state per script, loading at config time, bounded hook calls. */
#include "script.h"
#include "conf.h"
#include "pool.h"
#include "shm.h"
#include "attempt.h"
#include "headers.h"
#include "log.h"
#include "request.h"
#include "retry.h"
#include "route.h"
#include "script_api.h"
#include "script_deadline.h"
#include "script_match.h"
#include "script_json.h"
#include "upstream.h"
#include "watchdog.h"

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <ctype.h>
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>

/*
 * Each `script` file gets its own state, made when its directive is read,
 * in the process that reads the config (the master, or `ricochet -t`): a
 * script that does not load stops the config. Workers are forked with a
 * copy of every state, so nothing is shared between workers, nor between
 * two scripts. The bundled library (ricochet/api.lua, the objects
 * the hooks get; ricochet/sandbox.lua, how a script is loaded) is built
 * into the binary.
 */

extern const char ric_lua_api[];
extern const char ric_lua_sandbox[];

/* One Lua state a script: nothing one script does (a table it changes, a
 * library it configures, the memory it fills) reaches another. cur is the
 * state of the script being loaded or called; the names below are its. */
typedef struct ric_script_state_s {
    lua_State *lua;
    ric_script_t *script;
    int ref_traceback, ref_prepare, ref_check, ref_ricochet;
    int ref_unwind;       /* sandbox.unwind: what a failed call left in flight, put back */
    int ref_sources;      /* file -> its text, as read at the first load (sandbox.lua) */
    int ref_req, ref_res, ref_attempt, ref_req_fields, ref_res_fields, ref_attempt_fields;
    size_t bytes;         /* counted by its allocator */
    int refused;          /* an allocation was refused during the current call */
    int rebuild;          /* made again before its next call */
    unsigned gen;         /* bumped each time it is made: older registry refs are void */
    uint64_t shown;       /* 1 + the seq of the request req's fields show; 0: none */
} state_t;

static state_t *cur;
static ric_script_t *scripts; /* of every configuration alive in this process */

#define L (cur->lua)
#define ref_traceback (cur->ref_traceback)
#define ref_prepare (cur->ref_prepare)
#define ref_check (cur->ref_check)
#define ref_ricochet (cur->ref_ricochet)
#define ref_unwind (cur->ref_unwind)
#define ref_sources (cur->ref_sources)
#define ref_req (cur->ref_req)
#define ref_res (cur->ref_res)
#define ref_attempt (cur->ref_attempt)
#define ref_req_fields (cur->ref_req_fields)
#define ref_res_fields (cur->ref_res_fields)
#define ref_attempt_fields (cur->ref_attempt_fields)
#define mem_used (cur->bytes)
#define mem_over (cur->refused)
#define rebuild_pending (cur->rebuild)
#define state_gen (cur->gen)

/* The script's state becomes the current one. */
static void
use(const ric_script_t *s)
{
    cur = s->state;
}


/* --- the bound on a call ------------------------------------------------------ */

#define HOOK_EVERY 1000 /* instructions between checks */

static int64_t call_start_us;
static volatile int64_t call_deadline_us; /* read by the alarm's handler */
static int64_t call_ticks;
static volatile sig_atomic_t call_stopped; /* read by the alarm's handler */
static volatile sig_atomic_t call_running; /* a bounded call is on the stack */
static lua_State *volatile call_lua;      /* ...in this state */
static int64_t call_bound_ms; /* the clock's bound of the call running */
static int config_load;       /* the scripts of a configuration being read are loading */

int64_t ric_script_timeout_ms = RIC_SCRIPT_MAX_MS;
size_t ric_script_memory_max = RIC_SCRIPT_MEMORY_MAX;

void
ric_script_limits(const ric_conf_t *conf)
{
    if (conf->http != NULL) {
        ric_script_timeout_ms = conf->http->settings.script_timeout;
        ric_script_memory_max = (size_t) conf->http->settings.script_memory_max;
    }
}

/* A state's memory, counted by its allocator: past script_memory_max an
 * allocation fails, which LuaJIT raises as an error in the script. */

static void *
bounded_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    state_t *st = ud;
    void *p;

    if (nsize == 0) {
        free(ptr);
        st->bytes -= ptr != NULL ? osize : 0;
        return NULL;
    }
    if (ptr == NULL) {
        osize = 0;
    }
    /* only inside a protected call: a refusal outside one would be an
     * error nothing catches */
    if (call_running && nsize > osize
        && st->bytes + (nsize - osize) > ric_script_memory_max) {
        st->refused = 1;
        return NULL;
    }
    p = realloc(ptr, nsize);
    if (p != NULL) {
        st->bytes = st->bytes - osize + nsize;
    }
    return p;
}

static void stop_now(lua_State *l);
static void push_ctx(ric_request_t *r);

static int
over_bound(void)
{
    return call_stopped || ric_script_expired
           || call_ticks * HOOK_EVERY > RIC_SCRIPT_MAX_INSTRUCTIONS
           || ric_now_exact_us() > call_deadline_us;
}

/* sandbox.lua's guard: the clock checked after a library call that can
 * run long, so a hook is stopped at its bound, not after the next
 * instructions (deadline_over and deadline_stop, handed to
 * script_deadline.c, which the JSON module reads the same way). */
static int
l_guard(lua_State *l)
{
    ric_script_deadline_check(l);
    return 0;
}

/* Once a call is over its bound, every further instruction of it raises
 * the error again: a script that catches it (pcall) cannot go on. The
 * traceback handler is C, which no count hook interrupts. */
static void
bound_hook(lua_State *l, lua_Debug *ar)
{
    (void) ar;
    ++call_ticks;
    if (!over_bound()) {
        return;
    }
    stop_now(l);
}

/* --- the deadline's alarm --------------------------------------------------------
 * The count hook reads the clock every HOOK_EVERY instructions, but one
 * instruction can take milliseconds (a comparison, a concatenation or a
 * digest of a long string): a loop of them overshot script_timeout many
 * times over. So one timer per process rings at the running call's
 * deadline, and its handler makes the count hook run at the very next
 * instruction (lua_sethook is async-signal-safe in LuaJIT; its own lua.c
 * calls it from SIGINT) and sets ric_script_expired, which our own long C
 * loops (script_match.c, the digests) read. The timer is armed only when
 * it is not already armed for an earlier deadline: a syscall at most once
 * per script_timeout, not one per call. A ring that finds no call running
 * does nothing; one that finds a later call re-arms for that call's
 * deadline. After the deadline it rings again every millisecond until the
 * call ends, so a hook count the interpreter was decrementing at the ring
 * (a lost update) cannot delay the stop by more than that. */

static timer_t alarm_timer;
static int alarm_made;                   /* in this process: timers are not inherited by fork */
static volatile sig_atomic_t alarm_armed;
static volatile int64_t alarm_at_us;     /* the moment it rings, when armed */

static void
alarm_set(int64_t at_us)
{
    struct itimerspec when = { { 0, 0 }, { at_us / 1000000, (long) (at_us % 1000000) * 1000 } };

    alarm_at_us = at_us;
    alarm_armed = 1;
    if (timer_settime(alarm_timer, TIMER_ABSTIME, &when, NULL) != 0) {
        alarm_armed = 0; /* the count hook alone bounds the call */
    }
}

static void
on_alarm(int sig)
{
    int saved = errno;
    int64_t deadline = call_deadline_us;

    (void) sig;
    alarm_armed = 0;
    if (call_running && !call_stopped) {
        if (ric_now_exact_us() >= deadline) {
            ric_script_expired = 1;
            lua_sethook(call_lua, bound_hook, LUA_MASKCOUNT, 1);
            deadline = ric_now_exact_us() + 1000;
        }
        alarm_set(deadline);
    }
    errno = saved;
}

/* A forked child has no timer (and no alarm armed): it makes its own. */
static void
alarm_forget(void)
{
    alarm_made = 0;
    alarm_armed = 0;
}

/* The alarm rings by the call's deadline. Once per process it is made; if
 * it cannot be, the count hook alone bounds calls. */
static void
alarm_arm(void)
{
    static int atfork_registered;
    struct sigevent ev;
    struct sigaction sa;

    if (alarm_armed && alarm_at_us <= call_deadline_us) {
        return;
    }
    if (!alarm_made) {
        if (!atfork_registered) {
            atfork_registered = 1;
            pthread_atfork(NULL, NULL, alarm_forget);
        }
        memset(&sa, 0, sizeof(sa));
        sa.sa_handler = on_alarm;
        sa.sa_flags = SA_RESTART;
        sigemptyset(&sa.sa_mask);
        memset(&ev, 0, sizeof(ev));
        ev.sigev_notify = SIGEV_SIGNAL;
        ev.sigev_signo = RIC_SIG_SCRIPT_ALARM;
        if (sigaction(RIC_SIG_SCRIPT_ALARM, &sa, NULL) != 0
            || timer_create(CLOCK_MONOTONIC, &ev, &alarm_timer) != 0) {
            return;
        }
        alarm_made = 1;
    }
    alarm_set(call_deadline_us);
}

/* script_deadline.c's two functions: whether the running call is past a
 * bound, and its stop. */
static int
deadline_over(void)
{
    return call_running && over_bound();
}

static void
deadline_stop(lua_State *l)
{
    stop_now(l);
}

static void
stop_now(lua_State *l)
{
    if (!call_stopped) {
        call_stopped = 1;
        lua_sethook(l, bound_hook, LUA_MASKCOUNT, 1);
    }
    luaL_error(l, "stopped: it ran longer than a hook may (%d instructions or %d ms)",
               RIC_SCRIPT_MAX_INSTRUCTIONS, (int) call_bound_ms);
}

/* Calls the function below its nargs arguments on the stack with nres
 * results, bounded, with a traceback on error. 0, or an error with the
 * message (and traceback) on the stack. */
static int
call(int nargs, int nres)
{
    int base = lua_gettop(L) - nargs, rc;

    lua_rawgeti(L, LUA_REGISTRYINDEX, ref_traceback);
    lua_insert(L, base);
    call_start_us = ric_now_exact_us(); /* the turn's now may be old */
    /* no request waits on a configuration being read, and a busy machine
     * can keep the process off the CPU longer than script_timeout there:
     * its main chunks get RIC_SCRIPT_LOAD_MS (the instruction bound holds) */
    call_bound_ms = config_load ? ric_max(ric_script_timeout_ms, (int64_t) RIC_SCRIPT_LOAD_MS)
                                : ric_script_timeout_ms;
    call_deadline_us = call_start_us + call_bound_ms * 1000;
    call_ticks = 0;
    call_stopped = 0;
    ric_script_expired = 0;
    call_lua = L;
    mem_over = 0;
    lua_sethook(L, bound_hook, LUA_MASKCOUNT, HOOK_EVERY);
    call_running = 1; /* after the hook is set, so the alarm's handler never races its setting */
    alarm_arm();
    rc = lua_pcall(L, nargs, nres, base);
    call_running = 0;
    lua_sethook(L, NULL, 0, 0);
    lua_remove(L, base);
    if (rc != 0) {
        /* a stopped call skipped the sandbox's ways out (a callback's
         * depth, a module marked loading): put back before anything else
         * runs in the state; unbounded and unhooked now, it cannot be
         * stopped, and it allocates nothing */
        lua_rawgeti(L, LUA_REGISTRYINDEX, ref_unwind);
        if (lua_pcall(L, 0, 0, 0) != 0) {
            lua_pop(L, 1);
            rebuild_pending = 1; /* not put back: a new state has nothing in flight */
        }
    }
    if (ric_now_exact_us() - call_start_us >= 1000) {
        ric_clock_update(); /* a long call: what follows in this turn sees its end */
    }
    if (rc != 0 && mem_over) {
        lua_pushfstring(L, "stopped: it used more memory than script_memory_max allows (%d "
                        "MiB for the scripts' state): %s", (int) (ric_script_memory_max >> 20),
                        lua_isstring(L, -1) ? lua_tostring(L, -1) : "?");
        lua_remove(L, -2);
    }
    if (rc != 0 && (mem_over || call_stopped)) {
        /* what a stopped call piled up goes now, back to the system, not
         * only to malloc: the worker's memory returns to where it was */
        for (int i = 0; i < 6; i++) {
            lua_gc(L, LUA_GCCOLLECT, 0); /* each cycle halves LuaJIT's string buffer */
        }
        malloc_trim(0);
        if (mem_used > ric_script_memory_max / 2) {
            rebuild_pending = 1; /* what it keeps is the script's own: start again */
        }
    }
    return rc;
}

/* Every call's error handler: the message and a traceback. C, so no count
 * hook interrupts it, and it runs no script code: an error object that is
 * not a string (error({}), error(nil)) is named by its type, not by its
 * __tostring, with the FILE:LINE of the script's line that raised it (the
 * first frame in a script's file: the sandbox passes errors of callbacks
 * on, and its own line would say nothing). */
static int
l_traceback(lua_State *l)
{
    lua_Debug ar;
    int level, found = 0;

    if (!lua_isstring(l, 1)) {
        for (level = 1; !found && lua_getstack(l, level, &ar); level++) {
            found = lua_getinfo(l, "Sl", &ar) != 0 && ar.currentline > 0 && ar.source[0] == '@';
        }
        if (found) {
            lua_pushfstring(l, "%s:%d: (error object is a %s value)", ar.short_src, ar.currentline,
                            luaL_typename(l, 1));
        } else {
            lua_pushfstring(l, "(error object is a %s value)", luaL_typename(l, 1));
        }
        lua_replace(l, 1);
    }
    luaL_traceback(l, l, lua_tostring(l, 1), 1);
    return 1;
}

/* The error on top of the stack as text: l_traceback made it a string; the
 * fallback keeps a NULL out of the formats that print it. */
static const char *
error_text(void)
{
    const char *m = lua_tostring(L, -1);

    return m != NULL ? m : lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, -1));
}

/* --- the state ---------------------------------------------------------------- */

static int
load_bundled(const char *src, const char *name, char *err, size_t errlen)
{
    if (luaL_loadbuffer(L, src, strlen(src), name) != 0 || lua_pcall(L, 0, 1, 0) != 0) {
        snprintf(err, errlen, "cannot load the bundled %s: %s", name + 1, lua_tostring(L, -1));
        return RIC_ERROR;
    }
    return RIC_OK;
}

static void
script_free(ric_script_t *s)
{
    if (s->state != NULL && s->state->lua != NULL) {
        lua_close(s->state->lua);
    }
    if (cur == s->state) {
        cur = NULL;
    }
    free(s->state);
    free(s->path);
    free(s);
}

/* A configuration is freed: its scripts' states go with it (a reload's
 * old generation in the master, or a configuration that did not load). */
static void
scripts_free(void *data)
{
    const ric_conf_t *conf = data;
    ric_script_t **sp = &scripts, *s;

    while ((s = *sp) != NULL) {
        if (s->conf == conf) {
            *sp = s->next;
            script_free(s);
        } else {
            sp = &s->next;
        }
    }
}

/* At exit, in every process that has a copy: what a state holds goes
 * when it closes. */
static void
state_close(void)
{
    ric_script_t *s;

    while ((s = scripts) != NULL) {
        scripts = s->next;
        script_free(s);
    }
    cur = NULL;
}

static int
state_init(char *err, size_t errlen)
{
    static int closing_registered;

    if (!closing_registered) {
        closing_registered = 1;
        atexit(state_close);
    }
    L = lua_newstate(bounded_alloc, cur);
    state_gen++;
    cur->shown = 0;
    if (L == NULL) {
        snprintf(err, errlen, "cannot create the Lua state (out of memory)");
        return RIC_ERROR;
    }
    luaL_openlibs(L);
    /* cjson and cjson.safe are ours: what they allocate is the state's */
    ric_script_json_open(L);
    /* the strings' metatable reaches the real string table from any
     * script: sandbox.lua bounds what is there (rep, gsub, ...) */
    lua_pushcfunction(L, l_traceback);
    ref_traceback = luaL_ref(L, LUA_REGISTRYINDEX);

    /* api.lua returns function(binding) -> { req, res, attempt, ricochet } */
    if (load_bundled(ric_lua_api, "=ricochet/api.lua", err, errlen) != RIC_OK) {
        return RIC_ERROR;
    }
    ric_script_api_push(L, push_ctx);
    if (lua_pcall(L, 1, 1, 0) != 0) {
        snprintf(err, errlen, "cannot start the route script library: %s",
                 lua_tostring(L, -1));
        return RIC_ERROR;
    }
    lua_getfield(L, -1, "req");
    ref_req = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getfield(L, -1, "res");
    ref_res = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getfield(L, -1, "attempt");
    ref_attempt = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getfield(L, -1, "req_fields");
    ref_req_fields = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getfield(L, -1, "res_fields");
    ref_res_fields = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getfield(L, -1, "attempt_fields");
    ref_attempt_fields = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getfield(L, -1, "ricochet");
    ref_ricochet = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_pop(L, 1);

    ric_script_deadline_init(deadline_over, deadline_stop);
    /* the pattern functions sandbox.lua puts in the string table: ours,
     * which stop at the hook's deadline */
    lua_getglobal(L, "package");
    lua_getfield(L, -1, "loaded");
    ric_script_match_push(L);
    lua_setfield(L, -2, "ricochet.patterns");
    lua_pop(L, 2);
    if (load_bundled(ric_lua_sandbox, "=ricochet/sandbox.lua", err, errlen) != RIC_OK) {
        return RIC_ERROR;
    }
    lua_getfield(L, -1, "prepare");
    ref_prepare = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getfield(L, -1, "check");
    ref_check = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getfield(L, -1, "unwind");
    ref_unwind = luaL_ref(L, LUA_REGISTRYINDEX);
    lua_getfield(L, -1, "set_guard");
    lua_pushcfunction(L, l_guard);
    if (lua_pcall(L, 1, 0, 0) != 0) {
        snprintf(err, errlen, "cannot start the sandbox: %s", lua_tostring(L, -1));
        return RIC_ERROR;
    }
    lua_pop(L, 1);
    lua_newtable(L);
    ref_sources = luaL_ref(L, LUA_REGISTRYINDEX);
    return RIC_OK;
}

/* --- loading ------------------------------------------------------------------ */

/* A hook of the route table on the stack (checked by sandbox.check). */
static int
hook_ref(const char *name)
{
    lua_pushstring(L, name);
    lua_rawget(L, -2);
    if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        return LUA_NOREF;
    }
    return luaL_ref(L, LUA_REGISTRYINDEX);
}

/* Runs the script at path in the state (its main chunk, bounded) and keeps
 * its hooks in s. RIC_OK, or RIC_ERROR with "path:line: reason" in err. */
static int
load_hooks(const char *path, ric_script_t *s, char *err, size_t errlen)
{
    int top = lua_gettop(L);

    lua_rawgeti(L, LUA_REGISTRYINDEX, ref_prepare);
    lua_pushstring(L, path);
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref_ricochet);
    lua_pushnil(L);
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref_sources);
    if (call(4, 2) != 0 || lua_isnil(L, -2)) {
        snprintf(err, errlen, "%s", lua_isnil(L, -2) && lua_isstring(L, -1) ? lua_tostring(L, -1)
                                                                            : error_text());
        lua_settop(L, top);
        return RIC_ERROR;
    }
    lua_pop(L, 1);
    /* the main chunk runs once, bounded like a hook */
    if (call(0, 1) != 0) {
        snprintf(err, errlen, "%s", error_text());
        lua_settop(L, top);
        return RIC_ERROR;
    }
    /* sandbox.check(path, route) -> route | nil, reason */
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref_check);
    lua_pushstring(L, path);
    lua_pushvalue(L, -3);
    if (lua_pcall(L, 2, 2, 0) != 0 || lua_isnil(L, -2)) {
        snprintf(err, errlen, "%s", lua_tostring(L, -1) ? lua_tostring(L, -1) : "not a route");
        lua_settop(L, top);
        return RIC_ERROR;
    }
    lua_pop(L, 2);
    s->ref_on_request = hook_ref("on_request");
    s->ref_classify = hook_ref("classify");
    s->ref_on_log = hook_ref("on_log");
    s->ref_on_response = hook_ref("on_response");
    lua_settop(L, top);
    return RIC_OK;
}

ric_script_t *
ric_script_load(ric_conf_t *conf, const char *path, char *err, size_t errlen)
{
    ric_script_t *s;
    int first = 1, ok;

    for (s = scripts; s; s = s->next) {
        if (s->conf == conf && strcmp(s->path, path) == 0) {
            return s; /* several locations of one configuration share it */
        }
        first = first && s->conf != conf;
    }
    s = ric_xcalloc(1, sizeof(*s));
    s->state = ric_xcalloc(1, sizeof(*s->state));
    s->state->script = s;
    use(s);
    config_load = 1;
    ok = state_init(err, errlen) == RIC_OK && load_hooks(path, s, err, errlen) == RIC_OK;
    config_load = 0;
    if (!ok) {
        if (L != NULL) {
            lua_close(L);
        }
        free(s->state);
        free(s);
        cur = NULL;
        return NULL;
    }
    s->path = ric_xstrdup(path);
    s->conf = conf;
    s->has_on_log = s->ref_on_log != LUA_NOREF;
    s->next = scripts;
    scripts = s;
    if (first) {
        ric_pool_cleanup_add(conf->pool, scripts_free, conf);
    }
    return s;
}

/* A state that a script filled past script_memory_max, and keeps full, is
 * thrown away and made again: every script's main chunk runs anew, so the
 * worker's memory returns to where it was. Between calls only: no call
 * holds the old state. */
static void
state_rebuild(void)
{
    ric_script_t *s = cur->script;
    char err[1024];
    ric_buf_t texts = { NULL, 0, 0 };
    const char *p;
    size_t n, len;
    int ok;

    rebuild_pending = 0;
    /* the files as they were read first, not as they are on disk now: a
     * worker's script does not change under it (a reload changes it) */
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref_sources);
    lua_pushnil(L);
    while (lua_next(L, -2) != 0) {
        if (lua_type(L, -2) == LUA_TSTRING && lua_type(L, -1) == LUA_TSTRING) {
            for (n = 0; n < 2; n++) {
                p = lua_tolstring(L, n == 0 ? -2 : -1, &len);
                ric_buf_put(&texts, &len, sizeof(len));
                ric_buf_put(&texts, p, len);
            }
        }
        lua_pop(L, 1);
    }
    lua_close(L);
    L = NULL;
    mem_used = 0;
    ok = state_init(err, sizeof(err)) == RIC_OK;
    if (ok) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, ref_sources);
        for (n = 0; n + sizeof(len) <= texts.len; ) {
            memcpy(&len, texts.data + n, sizeof(len));
            lua_pushlstring(L, (const char *) texts.data + n + sizeof(len), len);
            n += sizeof(len) + len;
            memcpy(&len, texts.data + n, sizeof(len));
            lua_pushlstring(L, (const char *) texts.data + n + sizeof(len), len);
            n += sizeof(len) + len;
            lua_rawset(L, -3);
        }
        lua_pop(L, 1);
    }
    ric_buf_free(&texts);
    if (!ok || load_hooks(s->path, s, err, sizeof(err)) != RIC_OK) {
        ric_log_error(RIC_LOG_ERR, 0, "route script %s cannot be made again: %s: it is off in this "
                      "worker", s->path, err);
        s->ref_on_request = s->ref_classify = s->ref_on_log = s->ref_on_response = LUA_NOREF;
        return;
    }
    malloc_trim(0);
    ric_log_error(RIC_LOG_WARN, 0, "route script %s: its Lua state was made again (it kept more "
                  "than half of script_memory_max after it was stopped): %zu KiB now", s->path,
                  mem_used >> 10);
}

/* --- calls -------------------------------------------------------------------- */

static ric_script_t *
script_of(const ric_request_t *r)
{
    return r->location != NULL ? r->location->refs.script : NULL;
}

/* table[-1][name] = value[top], raw: no metamethod runs outside a call. */
static void
set_raw(const char *name)
{
    lua_pushstring(L, name);
    lua_insert(L, -2);
    lua_rawset(L, -3);
}

static void
set_string(const char *field, ric_str_t v)
{
    lua_pushlstring(L, (const char *) v.data, v.len);
    set_raw(field);
}

/* "FILE:LINE" of a hook's definition, for what it returned. */
static const char *
hook_where(int ref, char *buf, size_t size)
{
    lua_Debug ar;

    lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
    if (lua_getinfo(L, ">S", &ar) == 0) {
        snprintf(buf, size, "?");
    } else {
        snprintf(buf, size, "%s:%d", ar.source[0] == '@' ? ar.source + 1 : ar.short_src,
                 ar.linedefined);
    }
    return buf;
}

size_t
ric_script_zone_size(const ric_conf_t *conf)
{
    const ric_script_t *s;
    size_t n = 0;

    for (s = scripts; s; s = s->next) {
        n += s->conf != conf ? 0 : 256 + sizeof(ric_script_counts_t) + strlen(s->path);
    }
    return n;
}

int
ric_script_share(const ric_conf_t *conf, ric_shm_t *zone, char *err, size_t errlen)
{
    ric_script_t *s;
    char name[4200];
    int created;

    for (s = scripts; s; s = s->next) {
        if (s->conf != conf) {
            continue;
        }
        snprintf(name, sizeof(name), "script:%s", s->path);
        s->counts = ric_shm_entry(zone, name, sizeof(ric_script_counts_t), &created);
        if (s->counts == NULL) {
            snprintf(err, errlen, "the shared memory zone has no room for the counters of route "
                     "script %s", s->path);
            return RIC_ERROR;
        }
    }
    return RIC_OK;
}

#define MESSAGE_MAX 1024 /* of an error's message in the log line, escaped */
#define TRACE_MAX 2048   /* of its traceback */

/* The error on top of the stack as its log line shows it: a long message
 * is cut (marked "..."), not its traceback, which comes whole unless it is
 * itself over TRACE_MAX. Pushes the text (and what error_text pushed);
 * the caller's settop takes them. */
static const char *
failure_text(void)
{
    static const char mark[] = "\nstack traceback:";
    const char *text = error_text(), *trace, *p;
    size_t len = lua_objlen(L, -1), mlen, tlen, mfit, tfit;

    /* the traceback is the handler's, after the message: the last mark
     * (a message may carry the words too) */
    trace = text + len;
    for (p = text; (p = memmem(p, (size_t) (text + len - p), mark, sizeof(mark) - 1)) != NULL;
         p++) {
        trace = p;
    }
    mlen = (size_t) (trace - text);
    tlen = len - mlen;
    mfit = ric_log_fit(text, mlen, MESSAGE_MAX);
    tfit = ric_log_fit(trace, tlen, TRACE_MAX);
    lua_pushlstring(L, text, mfit);
    lua_pushstring(L, mfit < mlen ? "..." : "");
    lua_pushlstring(L, trace, tfit);
    lua_pushstring(L, tfit < tlen ? "..." : "");
    lua_concat(L, 4);
    return lua_tostring(L, -1);
}

/* A hook's call failed: logged with the script's FILE:LINE in the error,
 * and counted (a stop by the bounds as one too). */
static void
log_failure(const ric_script_t *s, int hook, const ric_request_t *r)
{
    static const char *const names[RIC_HOOKS] = { "on_request", "classify", "on_response",
                                                  "on_log" };
    int stopped = call_stopped || mem_over;
    uint64_t n = 0;
    char count[96] = "";

    if (s->counts != NULL) {
        __atomic_fetch_add(&s->counts->failed[hook], 1, __ATOMIC_RELAXED);
        if (stopped) {
            n = __atomic_add_fetch(&s->counts->stopped[hook], 1, __ATOMIC_RELAXED);
            snprintf(count, sizeof(count), " (stop %llu of its %s in every worker since start)",
                     (unsigned long long) n, names[hook]);
        }
    }
    ric_log_error(RIC_LOG_ERR, 0, "route script %s: %s failed%s: %s%s, client: %s", s->path,
                  names[hook], hook == RIC_HOOK_ON_RESPONSE ? " (the answer goes unchanged)"
                  : hook != RIC_HOOK_ON_LOG ? " (the built-in policy decides)" : "",
                  failure_text(), count, r->c->peer);
}

/* --- on_log's ctx:set: fields of the script's own in the access log line ----------- */

static ric_request_t *log_request; /* the request whose on_log runs */

/* ctx:set(name, value): name 1 to 64 of [A-Za-z0-9_.-], value a string (up
 * to 256 bytes), a number or a boolean; at most RIC_MAX_SCRIPT_FIELDS
 * fields and RIC_SCRIPT_FIELDS_BYTES in all; setting a name again replaces it,
 * in the room its first set made (a loop of sets does not grow the pool).
 * Its upvalue is the seq of the request whose ctx it is: a ctx kept from
 * an earlier on_log and called in another's writes nothing there. */
static int
l_ctx_set(lua_State *l)
{
    ric_request_t *r = log_request;
    ric_access_entry_t *e;
    ric_script_field_t *f = NULL;
    const char *name, *text, *p;
    char num[32];
    size_t nlen, len;
    int i, quoted = 0;

    if (r == NULL) {
        return luaL_error(l, "ctx:set can only be called in on_log");
    }
    if (lua_tonumber(l, lua_upvalueindex(1)) != (lua_Number) r->seq) {
        return luaL_error(l, "ctx:set: this ctx is an earlier request's (kept from its on_log): "
                          "only the ctx on_log is given may be set");
    }
    e = &r->log;
    name = luaL_checklstring(l, 2, &nlen);
    for (p = name; *p && (isalnum((unsigned char) *p) || strchr("_.-", *p)); p++) {
    }
    if (nlen == 0 || nlen > 64 || (size_t) (p - name) != nlen) {
        return luaL_error(l, "ctx:set: a name is 1 to 64 letters, digits, '_', '.' or '-'");
    }
    switch (lua_type(l, 3)) {
    case LUA_TSTRING:
        text = lua_tolstring(l, 3, &len);
        if (len > RIC_SCRIPT_FIELD_VALUE_MAX) {
            return luaL_error(l, "ctx:set: a string value is at most %d bytes",
                              RIC_SCRIPT_FIELD_VALUE_MAX);
        }
        quoted = 1;
        break;
    case LUA_TNUMBER:
        if (!isfinite(lua_tonumber(l, 3))) {
            return luaL_error(l, "ctx:set: a number must be finite (JSON has no inf or nan)");
        }
        len = (size_t) snprintf(num, sizeof(num), "%.14g", lua_tonumber(l, 3));
        text = num;
        break;
    case LUA_TBOOLEAN:
        text = lua_toboolean(l, 3) ? "true" : "false";
        len = strlen(text);
        break;
    default:
        return luaL_error(l, "ctx:set: a value is a string, a number or a boolean, not a %s",
                          luaL_typename(l, 3));
    }
    for (i = 0; i < e->nscript; i++) {
        if (strcmp(e->script[i].name, name) == 0) {
            f = &e->script[i];
            e->script_bytes -= strlen(f->name) + f->len;
        }
    }
    if (f == NULL && e->nscript == RIC_MAX_SCRIPT_FIELDS) {
        return luaL_error(l, "ctx:set: at most %d fields", RIC_MAX_SCRIPT_FIELDS);
    }
    if (e->script_bytes + nlen + len > RIC_SCRIPT_FIELDS_BYTES) {
        if (f != NULL) {
            e->script_bytes += nlen + f->len; /* it stays as it was */
        }
        return luaL_error(l, "ctx:set: the script's fields are over %d bytes",
                          RIC_SCRIPT_FIELDS_BYTES);
    }
    if (f == NULL) {
        f = &e->script[e->nscript++];
        f->name = ric_pstrndup(r->pool, name, nlen);
        f->text = ric_palloc(r->pool, RIC_SCRIPT_FIELD_VALUE_MAX + 1);
    }
    memcpy(f->text, text, len);
    f->len = len;
    f->quoted = quoted;
    e->script_bytes += nlen + len;
    return 0;
}

/* Pushes on_log's ctx:set for r (l_ctx_set's upvalue names r). */
static void
push_ctx_set(const ric_request_t *r)
{
    lua_pushnumber(L, (lua_Number) r->seq);
    lua_pushcclosure(L, l_ctx_set, 1);
}

/* --- the per-request context --------------------------------------------------- */

static void
ctx_unref(ric_request_t *r)
{
    const ric_script_t *s = script_of(r);

    if (s == NULL) {
        return;
    }
    use(s);
    if (r->script_ctx_ref != 0 && r->script_ctx_gen == state_gen && L != NULL) {
        luaL_unref(L, LUA_REGISTRYINDEX, r->script_ctx_ref);
    }
    r->script_ctx_ref = 0;
}

/* A request that ends without on_log (none, or never registered: it
 * ended before on_request's place) lets its table go here; with on_log,
 * the log cleanup (which runs after this one) does. */
static void
ctx_cleanup(void *data)
{
    ric_request_t *r = data;
    const ric_script_t *s = script_of(r);

    if (s == NULL || !r->script_logs) {
        ctx_unref(r);
    }
}

/* Pushes the request's own table for its script (req.ctx, attempt.ctx,
 * ctx.ctx): made at its first hook, the same one until the request ends,
 * never another request's. */
static void
push_ctx(ric_request_t *r)
{
    int first = r->script_ctx_ref == 0;

    if (!first && r->script_ctx_gen == state_gen) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, r->script_ctx_ref);
        return;
    }
    lua_newtable(L);
    lua_pushvalue(L, -1);
    r->script_ctx_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    r->script_ctx_gen = state_gen;
    if (first) {
        ric_request_cleanup_add(r, ctx_cleanup, r);
    }
}

/* The request's table when a hook of it made one, else nil: the table is
 * made when a script first reads req.ctx (push_ctx), so a
 * request whose script never does pays nothing for it. */
static void
push_ctx_if_made(ric_request_t *r)
{
    if (r->script_ctx_ref != 0 && r->script_ctx_gen == state_gen) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, r->script_ctx_ref);
    } else {
        lua_pushnil(L);
    }
}

/* Pushes req.host: the authority routing used (an absolute-form target's,
 * else Host), lowercase, without its port; "" when none. A copy only when
 * it has capitals. */
static void
push_host(const ric_request_t *r)
{
    ric_str_t h = ric_route_host_name(ric_request_host(r));
    luaL_Buffer b;
    size_t i = 0;

    while (i < h.len && !(h.data[i] >= 'A' && h.data[i] <= 'Z')) {
        i++;
    }
    if (i == h.len) {
        lua_pushlstring(L, h.len ? (const char *) h.data : "", h.len);
        return;
    }
    luaL_buffinit(L, &b);
    for (i = 0; i < h.len; i++) {
        luaL_addchar(&b, (char) tolower(h.data[i]));
    }
    luaL_pushresult(&b);
}

/* Fills the req object's fields with r's, unless they show r already:
 * before every hook, so a req a script kept from another request (an
 * earlier one, or one whose hooks interleave with r's) shows r, never
 * that one's. */
static void
show_request(ric_request_t *r)
{
    const ric_http_msg_t *m = r->msg;
    ric_str_t target, query = ric_null_string;

    static const char *const res_keys[] = { "status", "ctx", NULL };
    static const char *const attempt_keys[] = { "number", "class", "elapsed", "remaining",
                                                "upstream", "ctx", NULL };
    const char *const *k;

    if (cur->shown == r->seq + 1) {
        return;
    }
    cur->shown = r->seq + 1;
    /* a res or attempt kept from another request shows nothing of it */
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref_res_fields);
    for (k = res_keys; *k; k++) {
        lua_pushnil(L);
        set_raw(*k);
    }
    lua_pop(L, 1);
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref_attempt_fields);
    for (k = attempt_keys; *k; k++) {
        lua_pushnil(L);
        set_raw(*k);
    }
    lua_pop(L, 1);
    /* path: the normalized one routing matched; query: after the first '?'
     * of the target (an absolute-form authority has none); target: as sent */
    target = ric_request_span(r, m->target_off, m->target_len);
    if (m->path_len < m->target_len) {
        query.data = target.data + m->path_len + 1;
        query.len = target.len - m->path_len - 1;
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref_req_fields);
    set_string("method", ric_request_span(r, m->method_off, m->method_len));
    set_string("path", ric_request_path(r));
    lua_pushlstring(L, query.len ? (const char *) query.data : "", query.len);
    set_raw("query");
    set_string("target", target);
    push_host(r);
    set_raw("host");
    if (r->script_idempotent != 0) {
        lua_pushboolean(L, r->script_idempotent > 0);
    } else {
        lua_pushnil(L);
    }
    set_raw("idempotent");
    lua_pushnil(L); /* client and id: made on first read (push_ctx's way) */
    set_raw("client");
    lua_pushnil(L);
    set_raw("id");
    push_ctx_if_made(r);
    set_raw("ctx");
    lua_pop(L, 1);
}

int
ric_script_on_request(ric_request_t *r)
{
    ric_script_t *s = script_of(r);
    char where[512];
    int top, rc;

    if (s == NULL || r->up == NULL) {
        return RIC_OK; /* no script, or a route that does not proxy */
    }
    if (s->has_on_log) {
        ric_request_cleanup_add(r, ric_script_log_cleanup, r); /* before the access log's */
        r->script_logs = 1;
    }
    use(s);
    if (rebuild_pending) {
        state_rebuild();
    }
    if (s->ref_on_request == LUA_NOREF) {
        return RIC_OK;
    }
    top = lua_gettop(L);
    lua_rawgeti(L, LUA_REGISTRYINDEX, s->ref_on_request);
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref_req);            /* the argument: the proxy */
    show_request(r);

    ric_script_hook.r = r;
    ric_script_hook.in_on_request = 1;
    ric_watchdog_enter(s->counts, r->location->metrics, RIC_HOOK_ON_REQUEST);
    rc = call(1, 0);
    ric_watchdog_leave();
    ric_script_hook.in_on_request = 0;
    ric_script_hook.r = NULL;
    if (rc != 0) {
        log_failure(s, RIC_HOOK_ON_REQUEST, r);
        ric_script_api_undo(r);
        lua_settop(L, top);
        return RIC_OK;
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref_req_fields);
    lua_pushstring(L, "idempotent");
    lua_rawget(L, -2);
    if (lua_isboolean(L, -1)) {
        r->script_idempotent = lua_toboolean(L, -1) ? 1 : -1;
    } else if (!lua_isnil(L, -1)) {
        ric_log_error(RIC_LOG_ERR, 0, "route script %s: on_request set req.idempotent to a %s; "
                      "it takes true or false (ignored), client: %s",
                      hook_where(s->ref_on_request, where, sizeof(where)), luaL_typename(L, -1),
                      r->c->peer);
    }
    lua_settop(L, top);
    return ric_script_api_respond(r) ? RIC_DONE : RIC_OK;
}

/* ctx.headers: "Name: value\r\n" lines as lowercase name -> value, or a
 * list of the values of a name that repeats. */
static void
push_fields(ric_str_t f)
{
    ric_str_t name, value;

    lua_newtable(L);
    while (ric_lines_next(&f, &name, &value)) {
        ric_script_api_add_field(L, name, value);
    }
}

int
ric_script_on_response(ric_request_t *r)
{
    ric_script_t *s = script_of(r);
    int top;

    if (s == NULL) {
        return 0;
    }
    use(s);
    if (rebuild_pending) {
        state_rebuild();
    }
    if (s->ref_on_response == LUA_NOREF) {
        return r->script_logs;
    }
    top = lua_gettop(L);
    show_request(r);
    lua_rawgeti(L, LUA_REGISTRYINDEX, s->ref_on_response);
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref_res);
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref_res_fields);
    lua_pushinteger(L, r->status);
    set_raw("status");
    push_ctx_if_made(r);
    set_raw("ctx");
    lua_pop(L, 1); /* the fields: the proxy stays, as the argument */

    ric_script_hook.r = r;
    ric_script_hook.attempt = r->answer; /* NULL: the gateway's own answer */
    ric_script_hook.in_on_response = 1;
    ric_watchdog_enter(s->counts, r->location->metrics, RIC_HOOK_ON_RESPONSE);
    if (call(1, 0) != 0) {
        log_failure(s, RIC_HOOK_ON_RESPONSE, r);
        r->res_edits = NULL; /* a failed hook changes nothing */
    }
    ric_watchdog_leave();
    ric_script_hook.in_on_response = 0;
    ric_script_hook.attempt = NULL;
    ric_script_hook.r = NULL;
    lua_settop(L, top);
    return r->script_logs;
}

int
ric_script_classifies(const ric_request_t *r)
{
    const ric_script_t *s = script_of(r);

    return s != NULL && s->ref_classify != LUA_NOREF;
}

int
ric_script_classify(ric_request_t *r, ric_attempt_t *u, unsigned class, int64_t *delay_ms,
                    int *failed)
{
    ric_script_t *s = script_of(r);
    int64_t now = ric_now_ms();
    const char *verdict;
    char where[512];
    double delay;
    int top, rc, word = RIC_CLASSIFY_DEFAULT;

    *delay_ms = -1;
    if (s == NULL) {
        return RIC_CLASSIFY_DEFAULT;
    }
    use(s);
    if (rebuild_pending) {
        state_rebuild();
    }
    if (s->ref_classify == LUA_NOREF) {
        return RIC_CLASSIFY_DEFAULT;
    }
    top = lua_gettop(L);
    show_request(r);
    lua_rawgeti(L, LUA_REGISTRYINDEX, s->ref_classify);
    if (class == RIC_CLASS_STATUS) {
        lua_rawgeti(L, LUA_REGISTRYINDEX, ref_res);
        lua_rawgeti(L, LUA_REGISTRYINDEX, ref_res_fields);
        lua_pushinteger(L, u->client.resp.status);
        set_raw("status");
        lua_pop(L, 1);
    } else {
        lua_pushnil(L); /* no response: attempt.class says why */
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref_attempt);
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref_attempt_fields);
    lua_pushinteger(L, u->number);
    set_raw("number");
    lua_pushstring(L, ric_retry_class_name(class));
    set_raw("class");
    lua_pushnumber(L, (double) (ric_now_exact_us() - r->start_us) / 1e6);
    set_raw("elapsed");
    lua_pushnumber(L, (double) ric_max(r->deadline_ms - now, (int64_t) 0) / 1e3);
    set_raw("remaining");
    lua_pushstring(L, u->client.peer ? u->client.peer->conf->addr_text : "");
    set_raw("upstream");
    push_ctx_if_made(r);
    set_raw("ctx");
    lua_pop(L, 1);

    ric_script_hook.r = r;
    ric_script_hook.attempt = u;
    ric_watchdog_enter(s->counts, r->location->metrics, RIC_HOOK_CLASSIFY);
    rc = call(2, 2);
    ric_watchdog_leave();
    ric_script_hook.r = NULL;
    ric_script_hook.attempt = NULL;
    if (rc != 0) {
        log_failure(s, RIC_HOOK_CLASSIFY, r);
        lua_settop(L, top);
        return RIC_CLASSIFY_DEFAULT;
    }
    verdict = lua_type(L, -2) == LUA_TSTRING ? lua_tostring(L, -2) : NULL;
    if (lua_isnil(L, -2)) {
        word = RIC_CLASSIFY_DEFAULT; /* no opinion */
    } else if (verdict != NULL && strcmp(verdict, "retry") == 0) {
        word = RIC_CLASSIFY_RETRY;
        *failed = 1;
        if (lua_type(L, -1) == LUA_TNUMBER) {
            delay = lua_tonumber(L, -1);
            if (delay >= 0 && delay < 86400.0 * 365) {
                *delay_ms = (int64_t) (delay * 1000.0 + 0.5);
            } else {
                ric_log_error(RIC_LOG_ERR, 0, "route script %s: classify asked for a delay of %g "
                              "seconds (ignored: backoff decides), client: %s",
                              hook_where(s->ref_classify, where, sizeof(where)), delay,
                              r->c->peer);
            }
        } else if (!lua_isnil(L, -1)) {
            ric_log_error(RIC_LOG_ERR, 0, "route script %s: classify's delay is a %s, not a number "
                          "of seconds (ignored), client: %s",
                          hook_where(s->ref_classify, where, sizeof(where)),
                          luaL_typename(L, -1), r->c->peer);
        }
    } else if (verdict != NULL && strcmp(verdict, "accept") == 0) {
        word = RIC_CLASSIFY_FINAL;
        *failed = 0;
    } else if (verdict != NULL && strcmp(verdict, "fail") == 0) {
        word = RIC_CLASSIFY_FINAL;
        *failed = 1;
    } else {
        ric_log_error(RIC_LOG_ERR, 0, "route script %s: classify returned %s%s%s; it returns "
                      "\"retry\" [, seconds], \"accept\", \"fail\" or nil (the built-in policy "
                      "decides), client: %s", hook_where(s->ref_classify, where, sizeof(where)),
                      verdict ? "\"" : "a ",
                      verdict ? verdict : luaL_typename(L, -2), verdict ? "\"" : "", r->c->peer);
    }
    lua_settop(L, top);
    return word;
}

void
ric_script_log_cleanup(void *data)
{
    ric_request_t *r = data;
    ric_script_t *s = script_of(r);
    const ric_access_entry_t *e = &r->log;
    const ric_http_msg_t *m = r->msg;
    int top, i;

    if (s == NULL) {
        return;
    }
    use(s);
    if (rebuild_pending) {
        state_rebuild();
    }
    if (s->ref_on_log == LUA_NOREF) {
        ctx_unref(r);
        return;
    }
    top = lua_gettop(L);
    show_request(r);
    lua_rawgeti(L, LUA_REGISTRYINDEX, s->ref_on_log);
    lua_newtable(L); /* ctx: a copy, so nothing the hook does reaches the request */
    set_string("method", ric_request_span(r, m->method_off, m->method_len));
    set_string("path", ric_request_path(r));
    set_string("target", ric_request_span(r, m->target_off, m->target_len));
    lua_pushinteger(L, ric_request_final_status(r));
    lua_setfield(L, -2, "status");
    lua_pushnumber(L, (double) (ric_now_exact_us() - r->start_us) / 1e6);
    lua_setfield(L, -2, "duration");
    if (r->log.upstream != NULL) {
        lua_pushstring(L, r->log.upstream);
        lua_setfield(L, -2, "upstream");
    }
    if (r->not_retried != RIC_RETRY_YES) {
        lua_pushstring(L, ric_retry_reason_name(r->not_retried));
        lua_setfield(L, -2, "not_retried");
    }
    if (e->verdict != NULL) {
        lua_pushstring(L, e->verdict);
        lua_setfield(L, -2, "verdict");
        lua_pushstring(L, e->reason);
        lua_setfield(L, -2, "reason");
    }
    if (e->hedge != NULL) {
        lua_pushstring(L, e->hedge);
        lua_setfield(L, -2, "hedge");
    }
    lua_createtable(L, e->nattempts, 0);
    for (i = 0; i < e->nattempts; i++) {
        const ric_attempt_record_t *a = &e->attempts[i];
        lua_createtable(L, 0, 6);
        lua_pushstring(L, a->class);
        lua_setfield(L, -2, "class");
        if (a->status > 0) {
            lua_pushinteger(L, a->status);
            lua_setfield(L, -2, "status");
        }
        if (a->server != NULL) {
            lua_pushstring(L, a->server);
            lua_setfield(L, -2, "upstream");
        }
        lua_pushnumber(L, (double) a->duration_us / 1e6);
        lua_setfield(L, -2, "duration");
        lua_pushnumber(L, (double) a->wait_us / 1e6);
        lua_setfield(L, -2, "wait");
        if (a->regime != NULL) {
            lua_pushstring(L, a->regime);
            lua_setfield(L, -2, "regime");
        }
        if (a->hedge) {
            lua_pushboolean(L, 1);
            lua_setfield(L, -2, "hedge");
        }
        lua_rawseti(L, -2, i + 1);
    }
    lua_setfield(L, -2, "attempts");
    push_ctx(r);
    lua_setfield(L, -2, "ctx");
    /* the answer's fields as the client got them (none: it never began) */
    push_fields(r->answer_fields);
    lua_setfield(L, -2, "headers");
    push_ctx_set(r);
    lua_setfield(L, -2, "set");

    /* no current request: req and res kept from earlier hooks change nothing now */
    log_request = r;
    ric_watchdog_enter(s->counts, r->location->metrics, RIC_HOOK_ON_LOG);
    if (call(1, 0) != 0) {
        log_failure(s, RIC_HOOK_ON_LOG, r);
    }
    ric_watchdog_leave();
    log_request = NULL;
    lua_settop(L, top);
    ctx_unref(r);
}
