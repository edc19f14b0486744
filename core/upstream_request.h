/* upstream_request.h: the head of the request as sent upstream: target, header edits, hop-by-hop, forwarding and keys. */
#ifndef RIC_UPSTREAM_REQUEST_H
#define RIC_UPSTREAM_REQUEST_H

#include "ric_core.h"

/* Builds into out (emptied first) the head of attempt number `attempt` of
 * r: the request line, Host, the client's end-to-end fields less those
 * proxy_set_header, a script's edit or our own rules replace, the
 * forwarding fields, the framing of the body as it will be sent, the
 * attempt number, the time the client still waits and a minted key. */
void ric_upstream_request_build(ric_request_t *r, int attempt, ric_buf_t *out);

#endif /* RIC_UPSTREAM_REQUEST_H */
