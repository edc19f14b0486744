/* request.h: one request: its phases, its resume, its one finalize, and what every later feature hangs on it. */
#ifndef RIC_REQUEST_H
#define RIC_REQUEST_H

#include "ric_core.h"
#include "access_log.h"
#include "body.h"
#include "conf.h"
#include "conn.h"
#include "pool.h"
#include "retry.h"
#include "upload.h"
#include "upstream.h"

/* A phase of the request, as the layer above hands it in (pipeline.c
 * names them, in order). run returns RIC_OK (go on), RIC_AGAIN
 * (suspended: a timer or an asynchronous callback calls
 * ric_request_resume, and the phase runs again) or RIC_DONE (answered:
 * r->status holds the gateway's own answer, or r->answer the upstream's;
 * the phase flagged RIC_PHASE_ANSWERS comes next). After the last phase
 * the request is finalized (the access log is its last cleanup). */
typedef struct {
    int (*run)(ric_request_t *r);
    unsigned flags;
    /* The running SHA-256 the phase, later, needs of a streamed body
     * (asked when the body begins to stream), seeded as it wants and the
     * held part taken in; NULL: none. */
    ric_body_digest_t *(*body_digest)(const ric_request_t *r);
    /* More of a streamed body was staged (or it ended): every phase's. */
    void (*upload_kick)(ric_request_t *r);
    /* The running phase's: the client's body broke (an answer follows). */
    void (*body_broke)(ric_request_t *r);
    /* ...the worker stops gracefully: nothing new starts after deadline_ms. */
    void (*drain)(ric_request_t *r, int64_t deadline_ms);
    /* ...the client socket can take more of the answer. */
    void (*writable)(ric_request_t *r);
} ric_phase_t;

#define RIC_PHASE_ANSWERS  0x1 /* an earlier phase's DONE skips to this one */
#define RIC_PHASE_OUTLIVES 0x2 /* a keyed request may outlive its client in it */

/* What every request of a worker is given. */
typedef struct {
    const ric_phase_t *phases;
    unsigned nphases;
    ric_upstream_t *upstreams; /* the worker's, by ric_upstream_conf_t.index */
    const ric_conf_t *conf;    /* the worker's generation */
} ric_pipeline_t;

/* The connection's handler (conn.h) that makes and drives requests; its
 * context is a ric_pipeline_t. */
extern const ric_conn_handler_t ric_request_conn_handler;

/* The two phases the request layer itself has: the route (server and
 * location; refused heads answered) and the body (held for replay, or
 * streamed when too large to hold). */
int ric_request_phase_route(ric_request_t *r);
int ric_request_phase_body(ric_request_t *r);

typedef enum {
    RIC_REQ_BODY_NONE = 0,
    RIC_REQ_BODY_DISCARD, /* read and dropped (answered here) */
    RIC_REQ_BODY_BUFFER,  /* held whole, for replay */
    RIC_REQ_BODY_STREAM   /* too large to hold: sent upstream as it arrives */
} ric_req_body_mode_t;

/* A change to the request's fields as sent upstream (a script's
 * set_header): value.data NULL removes the field. */
typedef struct ric_header_edit_s ric_header_edit_t;
struct ric_header_edit_s {
    ric_str_t name;
    ric_str_t value;
    u_char *room;     /* (pool) where its values go, room_size bytes and a NUL: setting the
                       * name again copies into it, a longer value makes it anew */
    size_t room_size;
    ric_header_edit_t *next;
};

struct ric_request_s {
    ric_conn_t *c;
    ric_pool_t *pool; /* owns the request itself; its cleanups run at finalize */
    const ric_http_msg_t *msg; /* the head, parsed in c->in */
    const ric_pipeline_t *pipeline;
    unsigned phase;  /* the phase running, an index of pipeline->phases;
                      * nphases: finalizing; past it: over */
    int running;   /* the phase loop is on the stack */
    int resumed;   /* ...and was resumed meanwhile: it goes round again */
    int ending;    /* finalize was asked while running: 1 + ric_request_end_t */
    ric_request_end_t end; /* how it ended (for the cleanups) */
    int64_t start_us;
    uint64_t seq;  /* this worker's count of requests: with its pid and start, the request's id */

    /* route */
    /* the authority it names: an absolute-form target's, else Host; as an
     * offset into c->in, which may move while the request lives */
    int has_host;
    uint32_t host_off, host_len;
    /* the normalized path locations matched (req.path): path_norm, in the
     * pool, when normalizing changed it; else the target's own bytes at
     * path_off (no copy, the common case) */
    const u_char *path_norm;
    uint32_t path_off, path_len;
    ric_server_conf_t *server;
    ric_location_conf_t *location; /* NULL: none matched */
    const ric_http_settings_t *settings;
    ric_upstream_t *up;            /* NULL: the route does not proxy */

    /* body */
    ric_req_body_mode_t body_mode;
    int body_complete;
    ric_body_t body;     /* held for replay (and the part before streaming) */
    ric_upload_t upload; /* RIC_REQ_BODY_STREAM */
    int upload_paused;   /* the client waits for the stage to drain */
    int upload_unwanted; /* the upstream answered: the rest is dropped */
    ric_body_digest_t *body_digest; /* a streamed body's running SHA-256, when the
                                     * idempotency phase needs its fingerprint
                                     * (seeded by the phase's body_digest) */
    int body_digested;   /* ...it took in every byte: body_sha holds it */
    u_char body_sha[32];
    int body_drop;       /* a streamed body is only digested (the request is
                          * answered without an attempt) */
    int body_awaited;    /* a phase after BODY waits for the body's end */

    /* replay safety and the deadline */
    ric_retry_policy_t policy;
    int64_t deadline_ms;      /* monotonic */
    int64_t deadline_span_ms; /* min(retry_timeout, the client's own) */
    int replay_safe;
    int key_no_contract;      /* its script's key makes nothing safe: no key contract */
    int body_replayable;
    char minted_key[40];      /* idempotency_key auto: one key for every attempt */
    ric_header_edit_t *edits; /* header edits for the upstream (scripts) */
    ric_header_edit_t *res_edits; /* ...and for the client's answer (on_response) */
    ric_str_t answer_fields;  /* the answer's fields as the client got them, "Name: value\r\n"
                               * each (pool), kept for a script's on_log */

    struct ric_attempts_s *attempts; /* attempt.c's state across tries */
    ric_attempt_t *answer;    /* the attempt whose response the client gets */
    int answer_classified;    /* the route script's word on it (RIC_CLASSIFY_*) */

    /* the answer */
    int responding;    /* its head is built: bytes go (or went) out */
    int relayed;       /* a relay ended it outside the phase: 1 all out, -1 the client is gone */
    int status;        /* the client's status */
    int own_answer;    /* the gateway answers itself with status */
    ric_retry_reason_t not_retried; /* why the last failure was final */
    ric_access_entry_t log;         /* the attempt log, for the access log */

    ric_list_t async; /* pending asynchronous operations (ric_async_t) */
    /* the route script's word (script.c, script_api.c) */
    int script_idempotent;     /* req.idempotent: 1 true, -1 false, 0 not set */
    const char *script_key;    /* req:set_idempotency_key (pool) */
    int script_key_removed;    /* req:set_header(key field, nil): the client's key is not sent */
    int script_status;         /* req:respond's status; 0: it did not answer */
    ric_buf_t script_answer;   /* req:respond's fields, then its body (malloc: a later call
                                * reuses it, finalize frees it) */
    size_t script_copied;      /* what set_header calls copied into the pool (a bound) */
    int script_ctx_ref;        /* the script's per-request table (req.ctx); 0: none yet */
    int script_logs;           /* its script's on_log is a cleanup of it (on_request's place) */
    unsigned script_ctx_gen;   /* ...of this generation of the scripts' state */

    /* an own answer with fields and a body of its own (a script's
     * req:respond, a replayed or problem answer of the idempotency store) */
    int own_custom;
    ric_str_t own_fields;      /* "Name: value\r\n" each (pool) */
    ric_str_t own_body;        /* (pool) */

    struct ric_idem_s *idem;   /* the idempotency store's state (idem.c); NULL: none */
    /* the answer's body as relayed, for whoever keeps a copy (idem.c):
     * called once with NULL when the head is out, then with each piece */
    void (*tap)(ric_request_t *r, const u_char *p, size_t n);
    int outlives_client;       /* the exchange goes on when the client leaves */
    int client_left;           /* ...and it left: the answer goes nowhere */
};

/* A suspended phase's wait is over: its phase runs again. Safe to call
 * from inside a phase (the loop then goes round once more). */
void ric_request_resume(ric_request_t *r);

/* The one end of every request: cancels its pending asynchronous
 * operations, runs its cleanups once, in reverse order of registration
 * (what a later phase set up is undone first; the access log, registered
 * at creation, is written last), frees it and tells the connection. Asked
 * from inside the phase loop, it happens when the phase returns. */
void ric_request_finalize(ric_request_t *r, ric_request_end_t end);

/* Registers handler(data) to run at finalize. */
void ric_request_cleanup_add(ric_request_t *r, void (*handler)(void *), void *data);

/* An asynchronous operation begins / ended by itself. */
void ric_request_async_begin(ric_request_t *r, ric_async_t *a);
void ric_request_async_end(ric_request_t *r, ric_async_t *a);

/* The gateway answers the request itself (closes: the connection is not
 * trusted after). Returns RIC_DONE, for a phase to return. */
int ric_request_answer(ric_request_t *r, int status, int closes);

/* The gateway's own answer's fields, "Name: value\r\n" each, as a route
 * script's on_response sees them (not Server, Date or the framing). */
ric_str_t ric_request_own_fields(const ric_request_t *r);

/* The request's id, 32 hex digits unique on the host (the worker's start
 * time and pid, and its count of requests): the access log's "id", the
 * route script's req.id. */
void ric_request_id(const ric_request_t *r, char *out);

/* The status the request ended with, as logged: its answer's, 499 when the
 * client left before one began, 503 when the worker stopped under it. */
int ric_request_final_status(const ric_request_t *r);

/* A span of the request's head. */
static inline ric_str_t
ric_request_span(const ric_request_t *r, uint32_t off, uint32_t len)
{
    return ric_http_span(r->c->in, off, len);
}

/* The authority the request names (data NULL: none, HTTP/1.0). */
static inline ric_str_t
ric_request_host(const ric_request_t *r)
{
    ric_str_t none = ric_null_string;

    return r->has_host ? ric_request_span(r, r->host_off, r->host_len) : none;
}

/* The normalized path routing matched (ric_route_normalize): what
 * locations and req.path see. */
static inline ric_str_t
ric_request_path(const ric_request_t *r)
{
    ric_str_t p = { r->path_norm, r->path_len };

    return r->path_norm != NULL ? p : ric_request_span(r, r->path_off, r->path_len);
}

/* --- what the attempts tell the request ---------------------------------- */

/* The upstream answered before taking the whole streamed body: the rest
 * of it is read and dropped. */
void ric_request_body_unwanted(ric_request_t *r);

/* The streamed upload's stage drained: the client may send more. */
void ric_request_upload_room(ric_request_t *r);

#endif /* RIC_REQUEST_H */
