/* proxy.h: one proxied exchange: the request sent upstream, the response streamed back to the client. */
#ifndef RIC_PROXY_H
#define RIC_PROXY_H

#include "ric_core.h"
#include "access_log.h"
#include "conn.h"
#include "upstream.h"

/* Starts proxying c's current request (its head parsed, its body, if any,
 * read whole into c->body) to the location's upstream. The proxy then owns
 * the exchange until it calls ric_conn_proxy_done or ric_conn_respond. */
void ric_proxy_start(ric_conn_t *c);

/* Streaming a body too large to hold (over retry_body_max): n more body
 * bytes from the client. Returns 1 when the client should not be read
 * until ric_conn_body_resume is called (the upstream is behind). */
int ric_proxy_body_data(ric_proxy_t *p, const u_char *data, size_t n);

/* The client's streamed body ended. */
void ric_proxy_body_done(ric_proxy_t *p);

/* The client socket became writable (or its send_timeout fired). */
void ric_proxy_client_writable(ric_proxy_t *p);

/* Whether any of the upstream's answer went to the client. */
int ric_proxy_responding(const ric_proxy_t *p);

/* Whether the upstream has answered (the request is no longer being sent). */
int ric_proxy_answered(const ric_proxy_t *p);

/* Drops the exchange without an access log line (the connection logs the
 * answer it gives instead). */
void ric_proxy_discard(ric_proxy_t *p);

/* The worker is stopping gracefully: no attempt starts after deadline_ms;
 * a request waiting to retry past it gets its answer now. */
void ric_proxy_shutdown(ric_proxy_t *p, int64_t deadline_ms);

/* The client went away: stop and release everything (the upstream
 * connection is closed, never pooled half-read). */
void ric_proxy_abort(ric_proxy_t *p);

#endif /* RIC_PROXY_H */
