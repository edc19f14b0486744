/* idem_route.h: what names a route in the idempotency store's record keys, so that two routes never share a record. */
#ifndef RIC_IDEM_ROUTE_H
#define RIC_IDEM_ROUTE_H

#include "ric_core.h"
#include "pool.h"

/* Sets idem_route on every location of http that proxies with an
 * idempotency store. A route is named in its record keys by its server's
 * first server_name and its location; when another such route has the
 * same two, both are told apart by their servers' listen addresses
 * (sorted), and, when those are the same too, by the upstream each
 * proxies to (http:// or https:// and its name): idem_route holds those
 * ("listen A B" or "listen A B upstream http://NAME"). It stays NULL for
 * a route nothing else shares its name and location with, so its keys
 * are the ones it always had (a binary upgrade or a reload keeps them).
 * Allocates from pool; never fails (a small allocation aborts). */
void ric_idem_route_names(ric_http_conf_t *http, ric_pool_t *pool);

#endif /* RIC_IDEM_ROUTE_H */
