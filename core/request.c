/* request.c: a request: the phases it is handed, run in order, its resume after a suspension, and the one finalize every ending goes through. */
#include "request.h"
#include "metrics.h"
#include "headers.h"
#include "log.h"
#include "route.h"

#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#define REQUEST_POOL_SIZE 8192

static void log_cleanup(void *data);

static uint64_t requests_seen; /* by this worker */
static unsigned requests_live; /* made and not yet finalized */
static int trim_pending;       /* on_idle is due */

static void
on_idle(evutil_socket_t fd, short what, void *arg)
{
    (void) fd;
    (void) what;
    (void) arg;
    trim_pending = 0;
    if (requests_live == 0) {
        ric_pool_trim_idle();
    }
}

static uint32_t id_started, id_pid;

/* After a fork the child is another worker: its ids start anew. */
static void
id_forget(void)
{
    id_pid = 0;
}

void
ric_request_id(const ric_request_t *r, char *out)
{
    static int registered;

    if (id_pid == 0) {
        /* once per process (getpid is a system call: never one per request) */
        if (!registered) {
            registered = 1;
            pthread_atfork(NULL, NULL, id_forget);
        }
        id_pid = (uint32_t) getpid();
        id_started = (uint32_t) time(NULL);
    }
    uint32_t started = id_started, pid = id_pid;
    snprintf(out, 33, "%08x%08x%016llx", started, pid, (unsigned long long) r->seq);
}

static ric_request_t *
request_create(void *ctx, ric_conn_t *c, int error_status)
{
    ric_pool_t *pool = ric_pool_create(REQUEST_POOL_SIZE);
    ric_request_t *r = ric_pcalloc(pool, sizeof(*r));

    r->c = c;
    r->pool = pool;
    r->pipeline = ctx;
    r->msg = &c->msg;
    r->start_us = ric_now_us();
    r->seq = ++requests_seen;
    requests_live++;
    r->server = c->listener->default_server;
    r->settings = &r->server->settings;
    r->status = error_status;
    ric_body_init(&r->body, 0, NULL);
    /* registered first, so written last: after every other cleanup */
    ric_request_cleanup_add(r, log_cleanup, r);
    return r;
}

void
ric_request_cleanup_add(ric_request_t *r, void (*handler)(void *), void *data)
{
    ric_pool_cleanup_add(r->pool, handler, data);
}

void
ric_request_async_begin(ric_request_t *r, ric_async_t *a)
{
    if (a->pending) {
        return;
    }
    a->pending = 1;
    ric_list_push_front(&r->async, &a->link);
}

void
ric_request_async_end(ric_request_t *r, ric_async_t *a)
{
    if (!a->pending) {
        return;
    }
    a->pending = 0;
    ric_list_remove(&r->async, &a->link);
}

int
ric_request_answer(ric_request_t *r, int status, int closes)
{
    r->own_answer = 1;
    r->status = status;
    if (closes) {
        ric_conn_close_after(r->c);
    }
    return RIC_DONE;
}

ric_str_t
ric_request_own_fields(const ric_request_t *r)
{
    static const ric_str_t text = ric_string("Content-Type: text/plain\r\n"), none = { NULL, 0 };

    return r->own_custom ? r->own_fields : r->status == 204 || r->status == 304 ? none : text;
}

/* --- the phase loop -------------------------------------------------------- */

/* Where a DONE before the answering phase goes. */
static unsigned
answering(const ric_pipeline_t *p, unsigned from)
{
    unsigned i;

    for (i = from + 1; i < p->nphases; i++) {
        if (p->phases[i].flags & RIC_PHASE_ANSWERS) {
            return i;
        }
    }
    return from + 1;
}

static void
request_run(ric_request_t *r)
{
    const ric_pipeline_t *p = r->pipeline;
    int rc;

    if (r->running) {
        r->resumed = 1;
        return;
    }
    r->running = 1;
    do {
        r->resumed = 0;
        while (r->phase < p->nphases && !r->ending) {
            rc = p->phases[r->phase].run(r);
            if (rc == RIC_AGAIN) {
                break;
            }
            r->phase = rc == RIC_DONE ? answering(p, r->phase) : r->phase + 1;
        }
    } while (r->resumed && !r->ending && r->phase < p->nphases);
    r->running = 0;
    if (r->ending) {
        ric_request_finalize(r, (ric_request_end_t) (r->ending - 1));
    } else if (r->phase == p->nphases) {
        ric_request_finalize(r, RIC_END_ANSWERED);
    }
}

/* The phase running now (NULL: none, it is ending). */
static const ric_phase_t *
running_phase(const ric_request_t *r)
{
    return r->phase < r->pipeline->nphases ? &r->pipeline->phases[r->phase] : NULL;
}

static int
request_outlive(ric_request_t *r, int half)
{
    const ric_phase_t *ph = running_phase(r);

    /* the whole body read, held or streamed (the rest of a streamed one
     * goes upstream from the upload's stage): what reaches the upstream is
     * the whole request, which may run, so its answer must be kept. A body
     * cut short cuts the request, and its key is released */
    if (!r->outlives_client || !r->body_complete || r->own_answer || ph == NULL
        || !(ph->flags & RIC_PHASE_OUTLIVES)) {
        return 0;
    }
    if (half) {
        ric_log_error(RIC_LOG_INFO, 0, "the client ended its side of the connection; its keyed "
                      "request goes on and the answer is still sent to it, client: %s",
                      r->c->peer);
        return 1;
    }
    r->client_left = 1;
    ric_log_error(RIC_LOG_INFO, 0, "the client left; its keyed request goes on so that its "
                  "answer is kept for the key, client: %s", r->c->peer);
    return 1;
}

void
ric_request_resume(ric_request_t *r)
{
    request_run(r);
}

void
ric_request_finalize(ric_request_t *r, ric_request_end_t end)
{
    ric_conn_t *c = r->c;
    ric_async_t *a;

    if (r->phase > r->pipeline->nphases) {
        return; /* over */
    }
    if (r->running) {
        if (!r->ending) {
            r->ending = (int) end + 1; /* when the phase on the stack returns */
        }
        return;
    }
    r->phase = r->pipeline->nphases + 1;
    r->end = end;
    while ((a = ric_list_first(&r->async, ric_async_t, link)) != NULL) {
        ric_request_async_end(r, a);
        a->cancel(a); /* a late callback must never find the request */
    }
    ric_pool_destroy(r->pool); /* the cleanups, then the request's memory */
    if (--requests_live == 0 && ric_pool_released >= RIC_POOL_TRIM_AFTER && !trim_pending) {
        /* the last of a burst that freed much: trimmed once what its
         * connections hold is gone too, if no request came meanwhile */
        struct timeval tv = { 1, 0 };
        trim_pending = event_base_once(c->base, -1, EV_TIMEOUT, on_idle, NULL, &tv) == 0;
    }
    ric_conn_request_done(c, end);
}

/* --- phases ---------------------------------------------------------------- */

static void
use_settings(ric_request_t *r, const ric_http_settings_t *s)
{
    r->settings = s;
    ric_conn_use_settings(r->c, s);
}

int
ric_request_phase_route(ric_request_t *r)
{
    const ric_http_msg_t *m = r->msg;
    ric_str_t path = ric_request_span(r, m->target_off, m->path_len);
    ric_str_t host = ric_headers_find(r->c->in, m, "host");
    static const ric_str_t root = ric_string("/");
    size_t norm_len;
    u_char *norm;
    uint64_t limit;

    if (r->status != 0) {
        return ric_request_answer(r, r->status, 1); /* the head was refused */
    }
    /* an absolute-form target names the host itself, which wins over Host
     * (RFC 9112 §3.2.2); routing uses its path (path is the target up to '?') */
    if (ric_http_absolute_form(path, &host, &path) && path.len == 0) {
        path = root;
    }
    if (host.data != NULL) { /* routing and $host see one value */
        r->has_host = 1;
        r->host_off = (uint32_t) (host.data - r->c->in);
        r->host_len = (uint32_t) host.len;
    }
    r->server = ric_route_server(r->c->listener, host);
    use_settings(r, &r->server->settings);
    /* locations and scripts see the normalized path, so /x/../small,
     * //small and /%73mall all meet the settings (and the checks) of
     * location /small; a path already normal is not copied */
    if (path.data != root.data && ric_route_path_normal(path.data, path.len)) {
        r->path_off = (uint32_t) (path.data - r->c->in);
        r->path_len = (uint32_t) path.len;
    } else {
        norm = ric_palloc(r->pool, path.len);
        if (ric_route_normalize(path.data, path.len, norm, &norm_len) != RIC_OK) {
            ric_log_error(RIC_LOG_INFO, 0, "client sent an invalid request (400: invalid path) "
                          "while reading the request, client: %s", r->c->peer);
            return ric_request_answer(r, 400, 1);
        }
        r->path_norm = norm;
        r->path_len = (uint32_t) norm_len;
    }
    path = ric_request_path(r);
    r->location = ric_route_location(r->server, path);
    if (r->location != NULL) {
        use_settings(r, &r->location->settings);
        if (r->location->upstream != NULL) {
            r->up = &r->pipeline->upstreams[r->location->upstream->index];
        }
    }
    limit = (uint64_t) r->settings->client_max_body_size;
    if (m->body == RIC_BODY_LENGTH && limit > 0 && m->content_length > limit) {
        ric_log_error(RIC_LOG_INFO, 0, "client sent too large a body (413: %s) while reading the "
                      "request, client: %s", ric_http_status_text(413), r->c->peer);
        return ric_request_answer(r, 413, 1);
    }
    if (m->method == RIC_HTTP_CONNECT) {
        return ric_request_answer(r, 405, 1);
    }
    return RIC_OK;
}

static void
body_cleanup(void *data)
{
    ric_request_t *r = data;

    ric_body_reset(&r->body);
    ric_upload_free(&r->upload);
    ric_body_digest_free(r->body_digest);
}

/* The body streams from here on (what was held goes first). */
static void
stream_begin(ric_request_t *r, int chunked)
{
    const ric_pipeline_t *p = r->pipeline;
    unsigned i;

    r->body_mode = RIC_REQ_BODY_STREAM;
    ric_upload_init(&r->upload, chunked, ric_body_size(&r->body));
    for (i = r->phase + 1; i < p->nphases; i++) {
        if (p->phases[i].body_digest != NULL) {
            r->body_digest = p->phases[i].body_digest(r);
            if (r->body_digest != NULL) {
                break;
            }
        }
    }
}

int
ric_request_phase_body(ric_request_t *r)
{
    const ric_http_msg_t *m = r->msg;
    const ric_http_settings_t *s = r->settings;

    if (r->own_answer) {
        return RIC_DONE; /* the body broke */
    }
    if (r->body_mode == RIC_REQ_BODY_NONE) {
        if (m->body == RIC_BODY_NONE) {
            r->body_complete = 1;
            return RIC_OK;
        }
        if (r->up == NULL) {
            r->body_mode = RIC_REQ_BODY_DISCARD;
        } else {
            ric_body_init(&r->body, (size_t) s->client_body_buffer_size,
                          r->location->refs.body_temp_path);
            ric_request_cleanup_add(r, body_cleanup, r);
            r->body_mode = RIC_REQ_BODY_BUFFER;
            if (m->body == RIC_BODY_LENGTH
                && m->content_length > (uint64_t) s->retry_body_max) {
                /* too large to hold for replay: it streams through, sent once */
                stream_begin(r, 0);
            }
        }
        ric_conn_body_read(r->c);
    }
    if (r->own_answer) {
        return RIC_DONE;
    }
    if (r->body_complete || r->body_mode == RIC_REQ_BODY_STREAM) {
        r->body_awaited = 0; /* its wait is over: a later phase's is its own */
        return RIC_OK;
    }
    r->body_awaited = 1;
    return RIC_AGAIN;
}

/* --- what the connection tells ---------------------------------------------- */

/* Every phase that feeds on a streamed upload hears there is more. */
static void
upload_kick(ric_request_t *r)
{
    const ric_pipeline_t *p = r->pipeline;
    unsigned i;

    for (i = 0; i < p->nphases; i++) {
        if (p->phases[i].upload_kick != NULL) {
            p->phases[i].upload_kick(r);
        }
    }
}

static int
body_data(ric_request_t *r, const u_char *data, size_t n)
{
    switch (r->body_mode) {
    case RIC_REQ_BODY_BUFFER:
        if (ric_body_append(&r->body, data, n) != RIC_OK) {
            return RIC_ERROR;
        }
        if (ric_body_size(&r->body) > (uint64_t) r->settings->retry_body_max) {
            /* a chunked body grew past what is held for replay: what came
             * so far goes first, the rest streams through */
            stream_begin(r, r->msg->body == RIC_BODY_CHUNKED);
            ric_request_resume(r);
        }
        return RIC_OK;
    case RIC_REQ_BODY_STREAM:
        if (r->body_digest != NULL) {
            ric_body_digest_add(r->body_digest, data, n);
        }
        if (r->upload_unwanted || r->body_drop) {
            return RIC_OK;
        }
        if (ric_upload_put(&r->upload, data, n)) {
            r->upload_paused = 1;
        }
        upload_kick(r);
        return r->upload_paused ? RIC_AGAIN : RIC_OK;
    default:
        return RIC_OK;
    }
}

static void
body_done(ric_request_t *r)
{
    r->body_complete = 1;
    if (r->body_digest != NULL && !r->upload_unwanted) {
        /* every byte passed through the digest (none was dropped unread) */
        r->body_digested = ric_body_digest_final(r->body_digest, r->body_sha) == RIC_OK;
    }
    if (r->body_mode == RIC_REQ_BODY_STREAM && !r->upload_unwanted && !r->body_drop) {
        ric_upload_end(&r->upload);
        upload_kick(r);
    }
    if (r->body_awaited) {
        r->body_awaited = 0;
        ric_request_resume(r);
    }
}

static void
body_failed(ric_request_t *r, int status)
{
    const ric_phase_t *ph = running_phase(r);

    if (r->responding) {
        /* part of the answer may be out: nothing can be said cleanly */
        ric_request_finalize(r, RIC_END_CLIENT_GONE);
        return;
    }
    if (ph != NULL && ph->body_broke != NULL) {
        ph->body_broke(r); /* a streamed body broke: its attempt with it */
    }
    ric_request_answer(r, status, 1);
    ric_request_resume(r);
}

void
ric_request_body_unwanted(ric_request_t *r)
{
    r->upload_unwanted = 1;
    if (r->body_mode == RIC_REQ_BODY_STREAM && !r->body_complete) {
        r->upload_paused = 0;
        ric_conn_body_discard(r->c);
    }
}

void
ric_request_upload_room(ric_request_t *r)
{
    if (r->upload_paused) {
        r->upload_paused = 0;
        ric_conn_body_read(r->c);
    }
}

static void
client_writable(ric_request_t *r)
{
    const ric_phase_t *ph = running_phase(r);

    if (ph != NULL && ph->writable != NULL) {
        ph->writable(r);
    }
}

static void
request_drain(ric_request_t *r, int64_t deadline_ms)
{
    const ric_phase_t *ph = running_phase(r);

    if (ph != NULL && ph->drain != NULL) {
        ph->drain(r, deadline_ms);
    }
}

const ric_conn_handler_t ric_request_conn_handler = {
    .begin = request_create,
    .run = request_run,
    .body_data = body_data,
    .body_done = body_done,
    .body_failed = body_failed,
    .writable = client_writable,
    .outlive = request_outlive,
    .gone = ric_request_finalize,
    .drain = request_drain,
};

/* --- the last cleanup ------------------------------------------------------- */

int
ric_request_final_status(const ric_request_t *r)
{
    /* no answer began: 499 when the client left, as nginx logs it; 503
     * when the worker stopped under it */
    return r->client_left || (!r->responding && r->end == RIC_END_CLIENT_GONE) ? 499
           : r->responding ? r->status
           : r->end == RIC_END_SHUTDOWN ? 503 : r->status;
}

/* The request's last word: its route's metrics, and its access log line. */
static void
log_cleanup(void *data)
{
    ric_request_t *r = data;
    const ric_http_refs_t *refs = r->location ? &r->location->refs : &r->server->refs;
    ric_access_entry_t *e = &r->log;
    const ric_http_msg_t *m = r->msg;
    int64_t took = ric_now_us() - r->start_us;
    int status = ric_request_final_status(r);

    ric_metrics_request(r->location ? r->location->metrics : r->server->metrics, status, took);
    if (refs->access_log == NULL || refs->access_log->fd == -1) {
        return;
    }
    e->client = r->c->peer;
    if (m->head_len > 0) {
        e->method = ric_request_span(r, m->method_off, m->method_len);
        e->path = ric_request_span(r, m->target_off, m->target_len);
        e->host = ric_request_host(r);
    }
    e->status = status;
    ric_request_id(r, e->id);
    e->bytes = r->c->response_bytes;
    e->duration_us = took;
    e->not_retried = r->not_retried != RIC_RETRY_YES ? ric_retry_reason_name(r->not_retried)
                                                     : NULL;
    ric_access_log_write(refs->access_log, e);
}
