/* conn.h: a client (downstream) HTTP/1.1 connection: reading requests, writing their answers in order, keep-alive. */
#ifndef RIC_CONN_H
#define RIC_CONN_H

#include "ric_core.h"
#include "conf.h"
#include "http_parse.h"
#include "io.h"

#include <event2/event.h>
#include <event2/event_struct.h>

typedef enum {
    RIC_CONN_HANDSHAKE, /* listen ... ssl: the TLS handshake, before the first head */
    RIC_CONN_HEAD,    /* waiting for / reading a request head */
    RIC_CONN_REQUEST, /* a request (ric_request_t) is under way */
    RIC_CONN_LINGER   /* answered with close: draining what the client still sends */
} ric_conn_state_t;

/* How a request ended, as the connection needs to know (request.c). */
typedef enum {
    RIC_END_ANSWERED,    /* the whole answer went out */
    RIC_END_CUT_SHORT,   /* the answer broke off midway: the connection closes */
    RIC_END_CLIENT_GONE, /* the client hung up, or its socket failed or stalled */
    RIC_END_SHUTDOWN     /* the worker stops with the request unanswered */
} ric_request_end_t;

/* What the layer above does with a connection's requests (request.c
 * implements it; the connection knows nothing else of a request). */
typedef struct {
    /* A head was parsed in c->msg (error_status 0) or refused (400, 408,
     * 414, 431, 501, 505): the request for it, never NULL; then run. */
    ric_request_t *(*begin)(void *ctx, ric_conn_t *c, int error_status);
    void (*run)(ric_request_t *r);
    /* n more body bytes. RIC_OK; RIC_AGAIN: taken, but pause until
     * ric_conn_body_read; RIC_ERROR: they could not be kept (500). */
    int (*body_data)(ric_request_t *r, const u_char *data, size_t n);
    /* The body ended / broke (400 bad chunk, 408, 413, 500). */
    void (*body_done)(ric_request_t *r);
    void (*body_failed)(ric_request_t *r, int status);
    /* The client socket can take more of the answer. */
    void (*writable)(ric_request_t *r);
    /* The client left (half 0), or only ended its side (half 1: an end
     * of stream while the request waits for its answer; HTTP/1.1 lets it
     * read on). 1 when the request goes on: without the client (half 0:
     * its answer goes nowhere), or still answering it (half 1: a client
     * that closed for good is found by a failed write, a leave then);
     * ric_conn_request_done follows when it ends. */
    int (*outlive)(ric_request_t *r, int half);
    /* The connection closes under the request (end: the client is gone,
     * or the worker stops): it ends now, with ric_conn_request_done. */
    void (*gone)(ric_request_t *r, ric_request_end_t end);
    /* The worker stops gracefully: no attempt starts after deadline_ms. */
    void (*drain)(ric_request_t *r, int64_t deadline_ms);
} ric_conn_handler_t;

/* A worker's open client connections, kept by conn.c. Past max, idle
 * keep-alive ones are reclaimed to make room; the owner hears through
 * room() when accepting must pause (0) or may go on (1), and, once the set
 * drains (ric_conn_set_drain), through emptied() when the last one closed. */
typedef struct {
    ric_list_t list; /* ric_conn_t */
    int64_t n, max;
    int counted;       /* its connections' states count in the instance's gauges */
    int draining;
    int64_t drain_ms;  /* a request under way must be answered within this
                        * (a share of worker_shutdown_timeout) */
    struct event_base *base;
    const ric_conn_handler_t *handler; /* for every connection's requests */
    void *handler_ctx;
    void (*room)(void *ctx, int room);
    void (*emptied)(void *ctx);
    void *ctx;
} ric_conn_set_t;

/* Drains the set: no more room() calls; every connection finishes what it
 * is doing and closes (an idle one after a moment); a request under way must be
 * answered within drain_ms. */
void ric_conn_set_drain(ric_conn_set_t *s, int64_t drain_ms);

/* Closes every connection of the set now (a request under way ends as
 * shutdown). */
void ric_conn_set_close_all(ric_conn_set_t *s);

struct ric_conn_s {
    ric_io_t io;
    ric_conn_set_t *set; /* the set it is in: its loop, its requests' handler */
    struct event_base *base;
    ric_listener_t *listener;
    ric_conn_state_t state;
    struct event *rev; /* rev_ev and wev_ev while the socket is open; NULL once */
    struct event *wev; /* an orphan's is closed */
    struct event rev_ev;
    struct event wev_ev;
    char peer[64];     /* "ip:port" for logs */
    char peer_ip[48];  /* "ip" for $remote_addr and X-Forwarded-For */
    char peer_port[8];

    /* input: the current request's head starts at in[0]; what follows it
     * (its body, pipelined requests) comes after */
    u_char *in;
    size_t in_size;
    size_t in_len;
    size_t in_used; /* bytes of in[] belonging to the current request's head */
    ric_http_msg_t msg;

    /* the request body, as the request asks for it */
    int body_reading;       /* the request wants its body read */
    int body_paused;        /* ...but cannot take more now */
    int body_discard;       /* ...or no longer wants it: read and drop */
    int body_complete;      /* all of it was read */
    ric_http_chunked_t chunked;
    uint64_t body_left;     /* Content-Length bytes still to read */
    uint64_t body_received; /* body bytes so far (for client_max_body_size) */
    int body_error;         /* the status a broken body gets */
    int continue_sent;
    int interim_pending; /* the rest of a 100 Continue waits for the socket */
    int read_wants_write; /* TLS: a read must write first: reading waits for writability */

    ric_request_t *r; /* the current request; NULL between requests */
    const ric_http_settings_t *settings; /* of the current request's route */
    int64_t requests;          /* served on this connection */
    int64_t keepalive_timeout; /* ms, of the route that answered last */

    /* output: the head being written; the body is written from the
     * request's buffers without a copy */
    ric_buf_t out;
    size_t out_sent;
    uint64_t response_bytes; /* of the current answer that went out */
    int close_after;         /* close once the current answer is written */
    int promised;            /* the current answer's head said the connection stays open */

    int running;           /* entries on the stack */
    int closed;            /* closed; freed when running drops to 0 */
    int orphan;            /* the client left, its request goes on: no socket */
    int64_t read_deadline; /* ms, monotonic: header, body or linger deadline */

    int gauge;               /* 1 + its state in the instance's gauges; 0: not counted */
    ric_link_t link;         /* in its set */
    int recycled;            /* freed, and kept for a next connection (conn.c) */
};

/* Takes over an accepted, non-blocking socket. Returns RIC_OK, or RIC_ERROR
 * with the socket closed. */
int ric_conn_accept(ric_conn_set_t *s, ric_listener_t *ls, int fd, const struct sockaddr *sa,
                    socklen_t salen);

/* Closes the connection now (a request under way ends as client gone). */
void ric_conn_close(ric_conn_t *c);

/* --- what the current request uses -------------------------------------- */

/* The route's settings now apply to the connection (timeouts, keep-alive). */
void ric_conn_use_settings(ric_conn_t *c, const ric_http_settings_t *s);

/* Whether the connection can carry another request after this answer:
 * the client's keep-alive, keepalive_timeout and _requests, no shutdown,
 * room in the worker, nothing that forced a close. The head being built
 * says so; a no is kept, so the close follows the head that announced it. */
int ric_conn_keepalive(ric_conn_t *c);

/* The connection closes after this answer (the rest of the body was not
 * read, the body ends with the connection...). */
void ric_conn_close_after(ric_conn_t *c);

/* Appends bytes to the answer's head. */
void ric_conn_head_append(ric_conn_t *c, const void *p, size_t n);

/* How long the head being built is, and a pool copy of it from such a
 * length on (what a script's on_log sees of the answer's fields). */
size_t ric_conn_head_len(const ric_conn_t *c);
ric_str_t ric_conn_head_since(const ric_conn_t *c, size_t from, ric_pool_t *pool);

/* Whether an answer's body may be spliced to this client (a plain
 * socket, someone there). */
int ric_conn_can_splice(const ric_conn_t *c);

/* Writes what p holds after the head (ric_conn_write's rules: RIC_OK when
 * all of it went, RIC_AGAIN when the client blocks, the write event then
 * armed, RIC_ERROR when it is gone). */
int ric_conn_splice(ric_conn_t *c, ric_pipe_t *p);

/* Writes the rest of the head, then data[0, n). RIC_OK: all of it went
 * out. RIC_AGAIN: *taken bytes of data did (the rest waits for the
 * client; the handler's writable follows, or the request ends as
 * client gone after send_timeout). RIC_ERROR: the client is gone. */
int ric_conn_write(ric_conn_t *c, const u_char *data, size_t n, size_t *taken);

/* Starts (or resumes, after the handler's body_data said RIC_AGAIN)
 * reading the request body: bytes go to body_data, then body_done or
 * body_failed. */
void ric_conn_body_read(ric_conn_t *c);

/* The rest of the body is not wanted: read and dropped, with no clock, so
 * that no 408 lands in the middle of the answer. */
void ric_conn_body_discard(ric_conn_t *c);

/* The request ended (its finalize's last step): the connection
 * goes on to the next request, or closes: after lingering (half-close,
 * drain, bounded in time) when unread input could reset it, at once when
 * the client is gone. Every close after an answer passes here. */
void ric_conn_request_done(ric_conn_t *c, ric_request_end_t end);

#endif /* RIC_CONN_H */
