/* idem.h: gateway-side dedupe of keyed requests: the idempotency phase (claim, replay, 409, 422) and the settle at finalize. */
#ifndef RIC_IDEM_H
#define RIC_IDEM_H

#include "ric_core.h"
#include "body.h"

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

/* For a body that begins to stream through (too large to hold): the
 * running digest of the request's fingerprint, its method and target and
 * the body's held part taken in, that the body's every other byte goes
 * into as it passes (the same SHA-256 a held body's fingerprint is). Owned
 * by the caller (ric_body_digest_free). NULL when the request needs none
 * (no store, or an idempotent method and no route script to say
 * otherwise), or when it cannot be made. */
ric_body_digest_t *ric_idem_body_digest(const ric_request_t *r);

/* The names of idempotency_store_failure's values. */
#define RIC_IDEM_FAIL_CLOSED 0
#define RIC_IDEM_FAIL_OPEN 1

#endif /* RIC_IDEM_H */
