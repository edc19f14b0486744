/* idem.h: gateway-side dedupe of keyed requests: the idempotency phase (claim, replay, 409, 422) and the settle at finalize. */
#ifndef RIC_IDEM_H
#define RIC_IDEM_H

#include "ric_core.h"

/* The idempotency phase (request.c). For a request that is not
 * idempotent by method and carries a key (the client's, or its script's):
 * with a store, claims the key, or answers from what the store holds
 * (the stored answer with Idempotent-Replayed: true, 409 while it is in
 * flight or when its answer was not kept, 422 for another request under
 * the same key); without a key, idempotency_required answers 400. Once
 * the key is claimed, the answer is copied as it is relayed, and a
 * finalize cleanup stores it, or releases the key after a retryable
 * failure. RIC_OK, RIC_AGAIN (the store answers later) or RIC_DONE. */
int ric_idem_phase(ric_request_t *r);

/* Whether a body that streams through (too large to hold) needs its
 * digest taken as it passes: the route has a store, and the method is
 * unsafe or a route script may say so. */
int ric_idem_digests(const ric_request_t *r);

/* The names of idempotency_store_failure's values. */
#define RIC_IDEM_FAIL_CLOSED 0
#define RIC_IDEM_FAIL_OPEN 1

#endif /* RIC_IDEM_H */
