/* script.h: route scripts: the LuaJIT state, loading at config time, and the three hooks' calls. */
#ifndef RIC_SCRIPT_H
#define RIC_SCRIPT_H

#include "ric_core.h"

#include <signal.h>

/* A script's hooks, as its counters name them. */
enum { RIC_HOOK_ON_REQUEST, RIC_HOOK_CLASSIFY, RIC_HOOK_ON_RESPONSE, RIC_HOOK_ON_LOG, RIC_HOOKS };

/* Every worker's count of a script's hook calls that failed, and of those
 * the ones its bounds stopped (script_timeout, script_memory_max): an
 * entry of the shared zone ("script:PATH"), changed with atomics. */
typedef struct {
    uint64_t failed[RIC_HOOKS];
    uint64_t stopped[RIC_HOOKS];
} ric_script_counts_t;

/* One loaded route script (several locations may share it). */
typedef struct ric_script_s ric_script_t;
struct ric_script_s {
    char *path;
    int ref_on_request; /* registry refs; LUA_NOREF when the hook is absent */
    int ref_classify;
    int ref_on_log;
    int ref_on_response;
    int has_on_log;
    struct ric_script_state_s *state; /* its own Lua state (script.c) */
    ric_script_counts_t *counts;      /* in the shared zone; NULL: not counted (-t) */
    const ric_conf_t *conf;           /* the configuration that loaded it (a generation) */
    ric_script_t *next;
};

struct ric_shm_s;

/* The room the loaded scripts' counters take in the shared zone, and
 * their entries, made by the master before the first fork. */
size_t ric_script_zone_size(const ric_conf_t *conf);
int ric_script_share(const ric_conf_t *conf, struct ric_shm_s *zone, char *err, size_t errlen);

/* Most instructions one hook call may run before it is stopped (counted
 * in the interpreter, where script code always runs), and the wall-clock
 * bound checked alongside. */
#define RIC_SCRIPT_MAX_INSTRUCTIONS 10000000
#define RIC_SCRIPT_MAX_MS 50
/* The clock's bound of a main chunk while a configuration is read (at
 * least script_timeout): no request waits on it, and a busy machine can
 * keep the process off the CPU longer than script_timeout. */
#define RIC_SCRIPT_LOAD_MS 1000
#define RIC_SCRIPT_MEMORY_MAX ((size_t) 64 << 20)

/* The signal of the per-process timer that rings at a hook call's deadline
 * (script.c: its handler makes the count hook fire at the next instruction
 * and sets ric_script_expired, script_deadline.h). */
#define RIC_SIG_SCRIPT_ALARM (SIGRTMIN + 6)

/* The bounds in force (script_timeout, script_memory_max; set when the
 * config is read, the defaults until then). */
extern int64_t ric_script_timeout_ms;
extern size_t ric_script_memory_max;

/* Makes conf's script_timeout and script_memory_max the bounds of every
 * hook call in this process (a worker, for its generation; the master,
 * back to the running one after a reload it refused). */
void ric_script_limits(const ric_conf_t *conf);

/* Loads the script at path (once per path) in this process's state: its
 * main chunk runs, bounded, and must return a table of hooks. NULL with
 * err set to "path:line: reason" when it cannot. */
ric_script_t *ric_script_load(ric_conf_t *conf, const char *path, char *err, size_t errlen);

/* The on_request phase (pipeline.c's table; after the body, so
 * req:body() has it): runs the route script's on_request, if any, and
 * registers its on_log as a cleanup (which runs before the access log).
 * RIC_OK, or RIC_DONE when the script answered (req:respond). An error in
 * the script is logged and the request goes on as if it had none. */
int ric_script_on_request(ric_request_t *r);

/* The script's word on the attempt that just ended (RIC_CLASSIFY_*), with
 * *delay_ms for a "retry" that named a delay (-1: none). The built-in
 * policy decides (RIC_CLASSIFY_DEFAULT) when the script has no classify,
 * returns nil, fails, or returns something else (logged). *failed says
 * whether the verdict counts as a failure for health and budget (a
 * "fail" or "retry"; "accept" is a success). */
int ric_script_classify(ric_request_t *r, ric_attempt_t *u, unsigned class, int64_t *delay_ms,
                        int *failed);

/* Whether the route has a script with classify. */
int ric_script_classifies(const ric_request_t *r);

/* The script's on_log, as a request cleanup (registered when has_on_log). */
void ric_script_log_cleanup(void *data);


/* The respond phase, before the head of any answer is built (the
 * upstream's or the gateway's own): the route script's on_response, which
 * may set or remove the answer's fields (r->res_edits); an error is logged
 * and changes nothing. Whether the script's on_log wants the fields as
 * sent (r->answer_fields). */
int ric_script_on_response(ric_request_t *r);


#endif /* RIC_SCRIPT_H */
