/* respond.h: the respond phase: the gateway's own answer, or the upstream's head rewritten and its body relayed. */
#ifndef RIC_RESPOND_H
#define RIC_RESPOND_H

#include "ric_core.h"

/* The phase (pipeline.c's table): writes r's answer to the client with
 * backpressure. RIC_OK when all of it went out; RIC_AGAIN while waiting
 * for the client or the upstream. */
int ric_respond_phase(ric_request_t *r);

/* The upstream's answer has more bytes (or ended), or the client can take
 * more (the phase's writable): written at once, with no detour through
 * the request's phases; only the end of the answer, or of the client,
 * goes back to them. */
void ric_respond_relay(ric_request_t *r);

/* The upstream broke off after the answer began: the client's answer is
 * cut short and its connection closes. */
void ric_respond_broken(ric_request_t *r, int err, const char *what);

#endif /* RIC_RESPOND_H */
