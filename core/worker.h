/* worker.h: one worker process: its event loop, listeners, connections and shutdown. */
#ifndef RIC_WORKER_H
#define RIC_WORKER_H

#include "ric_core.h"
#include "conf.h"
#include "conn.h"
#include "request.h"
#include "upstream.h"

#include <event2/event.h>
#include <signal.h>

struct ric_worker_s {
    struct event_base *base;
    ric_conf_t *conf;
    struct event **accept_events; /* one per listener */
    size_t naccept;
    int accepting;
    int shutting_down; /* graceful: finish in-flight requests, then exit */
    struct event *shutdown_timer;
    struct event *signals[5];
    ric_conn_set_t conns; /* every open client connection (conn.c keeps it) */
    ric_upstream_t *upstreams; /* indexed by ric_upstream_conf_t.index */
    ric_pipeline_t pipeline;   /* what every request is handed */
    struct event *log_timer;   /* writes buffered access log lines (buffer=, flush=) */
    struct event *admin_event; /* accepting on the admin listener: on until the worker exits */
    int admin_paused;          /* out of descriptors, or of room in its set */
    int admin_closed;          /* stopping while another generation serves: it answers there */
    ric_conn_set_t admin_conns;
    ric_pipeline_t admin_pipeline;
};

/* A worker tells its master it serves (its loop is about to run). */
#define RIC_SIG_WORKER_READY (SIGRTMIN + 1)

/* The worker of this process (one per process). */
extern ric_worker_t *ric_worker;

/* Runs the worker loop on conf's listeners until told to stop; returns the
 * process exit code. Called in the child right after fork. */
int ric_worker_run(ric_conf_t *conf);

#endif /* RIC_WORKER_H */
