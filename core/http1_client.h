/* http1_client.h: the upstream HTTP/1 client: connect or reuse, send a request, read the response head and body. */
#ifndef RIC_HTTP1_CLIENT_H
#define RIC_HTTP1_CLIENT_H

#include "ric_core.h"
#include "body.h"
#include "http_parse.h"
#include "upload.h"
#include "upstream.h"

/* Response head limit, and the one buffer the body is relayed through. */
#define RIC_HTTP1_BUF_SIZE (32 * 1024)

typedef enum {
    RIC_HTTP1_IDLE = 0,
    RIC_HTTP1_CONNECTING,
    RIC_HTTP1_HANDSHAKE, /* TLS to an https upstream: nothing was sent yet */
    RIC_HTTP1_SENDING,  /* the request is going up (an answer may already come) */
    RIC_HTTP1_HEAD,     /* waiting for the response head */
    RIC_HTTP1_BODY,     /* the body is being read for the caller to relay */
    RIC_HTTP1_DRAIN,    /* reading the rest of a response the caller dropped, to keep it */
    RIC_HTTP1_PEEK      /* reading a small body into buf before the caller decides */
} ric_http1_state_t;

/* What the client tells its user. The client knows nothing of retries:
 * its user decides. Each callback is the last thing the client does in
 * that turn, so the user may free the client from inside it. */
typedef struct {
    /* no final response head: class is RIC_CLASS_CONNECT_ERROR, _RESET,
     * _TIMEOUT or _BAD_RESPONSE; err an errno value or 0; what says what
     * failed, h->state while doing what */
    void (*failed)(ric_http1_t *h, unsigned class, int err, const char *what);
    /* a final response head is in h->resp (interim 1xx are skipped);
     * h->early_answer when it came before the whole request went up */
    void (*head)(ric_http1_t *h);
    /* the whole request went up (a streamed upload: the clocks start) */
    void (*sent)(ric_http1_t *h);
    /* a streamed upload's stage drained: the client may send more */
    void (*upload_room)(ric_http1_t *h);
    /* BODY: bytes to relay in buf[relay_start, relay_end), or h->done */
    void (*body)(ric_http1_t *h);
    /* BODY: the upstream broke off or timed out */
    void (*body_failed)(ric_http1_t *h, int err, const char *what);
    /* DRAIN: the dropped response arrived whole (1), or is not kept (0:
     * its connection drains on alone, or is closed) */
    void (*drained)(ric_http1_t *h, int whole);
    /* PEEK: the body is in buf whole (1), or is larger than asked (0);
     * a body that breaks off comes as failed() */
    void (*peeked)(ric_http1_t *h, int whole);
} ric_http1_handler_t;

struct ric_http1_s {
    const ric_http1_handler_t *handler;
    void *data; /* the user's */
    ric_upstream_t *up;
    ric_peer_t *peer;
    ric_upconn_t *uc;
    ric_http1_state_t state;
    int reused; /* the connection came from the pool */
    int64_t connect_timeout, send_timeout, read_timeout; /* ms */
    uint64_t drain_max;     /* a dropped response's body is read on when at most this is left */
    int64_t drain_timeout;  /* ...for at most this long (ms) from its drop */
    int64_t drain_until_ms; /* DRAIN: the moment drain_timeout ends */
    ric_http_method_t method; /* of the request: decides the response's framing */

    /* the request: a head, then a replayed body and/or a streamed upload */
    const u_char *req;
    size_t req_len;
    const ric_body_t *body; /* borrowed; NULL: none */
    ric_upload_t *upload;   /* borrowed; NULL: none */
    uint64_t sent;          /* head and body bytes written */
    int send_blocked;

    /* the response: head parsed from buf, then body bytes relayed from it */
    u_char *buf;
    size_t buf_len;
    size_t relay_start; /* buf[relay_start, relay_end) is for the caller */
    size_t relay_end;
    ric_http_chunked_t chunked;
    uint64_t body_left;
    int dechunk;        /* the chunked body is decoded in place */
    int done;           /* the response ended */
    int reusable;       /* the connection may carry another request */
    int reading_paused;
    int read_wants_write; /* TLS: a read must write first: reading waits for writability */
    int early_answer;   /* answered before taking the whole request */
    size_t peek_max;    /* PEEK: body bytes wanted at most */
    ric_pipe_t *pipe;   /* BODY, spliced: the body's bytes after buf's go through it */
    char tls_error[200]; /* why a handshake failed, for failed()'s what */
    int tls_failed;      /* ...and that it did */
    ric_http_msg_t resp; /* the response's head (last: ric_http1_init leaves its fields array) */
};

/* Prepares h; nothing is allocated or connected yet. */
void ric_http1_init(ric_http1_t *h, const ric_http1_handler_t *handler, void *data,
                    ric_upstream_t *up, ric_http_method_t method);

/* Sends req (and body, upload: either may be NULL) to peer on a pooled
 * connection or a new one (careful: check even a connection pooled a
 * moment ago). Borrowed buffers must live until the request is sent. The
 * work starts from the event loop: no callback comes from inside this
 * call. RIC_OK, or RIC_ERROR with errno set when the connect failed at
 * once. */
int ric_http1_start(ric_http1_t *h, ric_peer_t *peer, int careful, const u_char *req,
                    size_t req_len, const ric_body_t *body, ric_upload_t *upload);

/* More of a streamed upload was staged: send it when the socket can. */
void ric_http1_upload_kick(ric_http1_t *h);

/* After the head: read the body for relaying (dechunk: decode a chunked
 * body, for a client that cannot take chunks). What already arrived is
 * scanned at once. RIC_OK, or RIC_ERROR when its framing is broken
 * (nothing was relayed: the caller can still answer cleanly). */
int ric_http1_read_body(ric_http1_t *h, int dechunk);

/* After the head, before deciding: read the body into the buffer when it
 * is at most max bytes (and fits the buffer). 1: it is there whole; 0: it
 * is larger (nothing more is read); RIC_AGAIN: reading, the peeked
 * callback (or failed) tells; RIC_ERROR: its framing is broken. Either
 * way ric_http1_read_body or ric_http1_drop then go on as after a head. */
int ric_http1_peek(ric_http1_t *h, size_t max);

/* The whole body read by ric_http1_peek, decoded (chunks joined), into out. */
void ric_http1_peeked_body(const ric_http1_t *h, ric_buf_t *out);

/* The caller relayed n bytes from relay_start; when it took everything the
 * buffer is reused and reading resumes. */
void ric_http1_consumed(ric_http1_t *h, size_t n);

/* After everything in buf was relayed, with more of the body to come:
 * the rest goes into a pipe (h->pipe) for the caller to splice on,
 * never through user space. 1 when it will (a body of a known length
 * from a plain socket), 0 when it is read into buf as before. */
int ric_http1_splice(ric_http1_t *h);

/* The caller spliced bytes out of h->pipe: once it is empty, reading
 * resumes. */
void ric_http1_spliced(ric_http1_t *h);

/* The caller cannot take more now (a slow client): stop reading. */
void ric_http1_pause(ric_http1_t *h);

/* The caller drops the response for a retry (the retry need not wait for
 * it). Returns 1 when it is here whole (the connection went back to the
 * pool when it may); 0 when the rest is read into buf in DRAIN, to keep it
 * (the drained callback tells); -1 when it is not kept: its connection
 * drains without h (what is left is at most drain_max, for at most
 * drain_timeout, then it goes back to the pool) or is closed. */
int ric_http1_drop(ric_http1_t *h);

/* Puts the connection back in the pool when the response ended and the
 * upstream allows, else closes it. The buffer and head stay. */
void ric_http1_release(ric_http1_t *h);

/* Frees the buffer; the connection is closed (never pooled half-read),
 * but for a dropped response's (DRAIN) or a peeked one's (PEEK), which
 * drains without h when its bounds allow (as ric_http1_drop's -1). */
void ric_http1_free(ric_http1_t *h);

#endif /* RIC_HTTP1_CLIENT_H */
