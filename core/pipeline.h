/* pipeline.h: the phases every request goes through, in order, as the worker hands them to the request layer. */
#ifndef RIC_PIPELINE_H
#define RIC_PIPELINE_H

#include "request.h"

/* route -> body -> on_request -> idempotency -> attempts -> respond; the
 * finalize (cleanups, the access log) follows the last. */
extern const ric_phase_t ric_pipeline_phases[];
extern const unsigned ric_pipeline_nphases;

/* The admin listener's phases (admin.c answers). */
extern const ric_phase_t ric_pipeline_admin_phases[];
extern const unsigned ric_pipeline_admin_nphases;

#endif /* RIC_PIPELINE_H */
