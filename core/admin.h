/* admin.h: the admin listener (admin_listen): metrics, health, readiness and the live status page. */
#ifndef RIC_ADMIN_H
#define RIC_ADMIN_H

#include "ric_core.h"
#include "request.h"

/* The admin listener's phase: a client admin_allow does not list gets
 * 403, an unknown path 404, a method but GET and HEAD 405; then
 * /metrics (Prometheus text), /healthz, /readyz, /status (the page) and
 * /status.json ([?seq=N]); / redirects to /status. */
int ric_admin_phase(ric_request_t *r);

#endif /* RIC_ADMIN_H */
