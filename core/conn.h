/* conn.h: a client (downstream) HTTP/1.1 connection: reading requests, answering in order, keep-alive. */
#ifndef RIC_CONN_H
#define RIC_CONN_H

#include "ric_core.h"
#include "conf.h"
#include "body.h"
#include "http_parse.h"

#include <event2/event.h>

typedef enum {
    RIC_CONN_HEAD,      /* waiting for / reading a request head */
    RIC_CONN_BODY,      /* reading the request body */
    RIC_CONN_WRITE,     /* writing a response */
    RIC_CONN_PROXY,     /* the proxy owns the exchange (proxy.c) */
    RIC_CONN_LINGER     /* answered with close: draining what the client still sends */
} ric_conn_state_t;

struct ric_conn_s {
    int fd;
    ric_worker_t *worker;
    ric_listener_t *listener;
    ric_conn_state_t state;
    struct event *rev;
    struct event *wev;
    char peer[64];     /* "ip:port" for logs */
    char peer_ip[48];  /* "ip" for $remote_addr and X-Forwarded-For */
    char peer_port[8];

    /* input: the current request's head starts at in[0]; what follows it
     * (its body, pipelined requests) comes after */
    u_char *in;
    size_t in_size;
    size_t in_len;
    size_t in_used; /* bytes of in[] belonging to the current request */

    ric_http_msg_t msg;
    ric_http_chunked_t chunked;
    uint64_t body_left;     /* Content-Length bytes still to read */
    uint64_t body_received; /* body bytes so far (for client_max_body_size) */
    int continue_sent;
    ric_body_t body; /* kept for the upstream when the route proxies */
    int body_streaming; /* too large to hold: sent upstream as it arrives */
    int body_done;      /* ...and all of it has arrived */
    int body_paused;    /* ...and the upstream is behind: the client waits */
    int body_error;     /* the status a broken body gets */

    /* the current request's route */
    ric_server_conf_t *server;
    ric_location_conf_t *location; /* NULL: none matched */
    const ric_http_settings_t *settings;
    ric_proxy_t *proxy;            /* while state is RIC_CONN_PROXY */
    int64_t request_start_us;
    int64_t requests;          /* served on this connection */
    int64_t keepalive_timeout; /* ms, of the route that answered last */

    /* output */
    u_char *out;
    size_t out_size;
    size_t out_len;
    size_t out_sent;
    int close_after; /* close once the current response is written */
    int status;      /* of the current response, for logs */

    int linger;          /* after an error: drain the client before closing */
    int running;         /* conn_run calls on the stack */
    int closed;          /* closed; freed when running drops to 0 */
    int64_t read_deadline; /* ms, monotonic: header, body or linger deadline */

    ric_conn_t *prev, *next; /* worker's list */
};

/* Takes over an accepted, non-blocking socket. Returns RIC_OK, or RIC_ERROR
 * with the socket closed. */
int ric_conn_accept(ric_worker_t *w, ric_listener_t *ls, int fd, const struct sockaddr *sa,
                    socklen_t salen);

/* Closes the connection now and frees it. */
void ric_conn_close(ric_conn_t *c);

/* Queues the gateway's own answer (502, 504, 500...) to the current
 * request (c->out_len is then its size); ric_conn_continue sends it and
 * goes on with the connection. */
void ric_conn_respond(ric_conn_t *c, int status);
void ric_conn_continue(ric_conn_t *c);

/* The upstream answered while the client's body was still streaming. */
void ric_conn_body_answered(ric_conn_t *c);

/* The streaming proxy caught up: read the client's body again. */
void ric_conn_body_resume(ric_conn_t *c);

/* Appends bytes to the pending output. */
void ric_conn_out_append(ric_conn_t *c, const void *p, size_t n);

/* The proxy wrote the whole response (or gave up on the client): the
 * connection goes on to the next request, or closes when close_after. */
void ric_conn_proxy_done(ric_conn_t *c);

/* Graceful shutdown: closes c if it is idle between requests; otherwise it
 * will close once its current response is written. */
void ric_conn_shutdown(ric_conn_t *c);

#endif /* RIC_CONN_H */
