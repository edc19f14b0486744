/* pipeline.c: the request's phases, in order, each with what it does when the body, the client or the worker has news. */
#include "pipeline.h"
#include "admin.h"
#include "attempt.h"
#include "idem.h"
#include "respond.h"
#include "script.h"

const ric_phase_t ric_pipeline_phases[] = {
    { .run = ric_request_phase_route },  /* server and location */
    { .run = ric_request_phase_body },   /* held for replay, or streaming */
    { .run = ric_script_on_request },    /* the route script's on_request, the body held */
    { .run = ric_idem_phase,             /* claim the key, or answer from the store */
      .body_digest = ric_idem_body_digest },
    { .run = ric_attempts_phase,         /* tries, waits, the answer chosen */
      .flags = RIC_PHASE_OUTLIVES,
      .upload_kick = ric_attempts_upload_kick,
      .body_broke = ric_attempts_stop,
      .drain = ric_attempts_shutdown },
    { .run = ric_respond_phase,          /* the answer goes to the client */
      .flags = RIC_PHASE_ANSWERS | RIC_PHASE_OUTLIVES,
      .writable = ric_respond_relay },
};

const unsigned ric_pipeline_nphases = ric_nelems(ric_pipeline_phases);

/* The admin listener's: the route (its refused heads, its limits), the
 * admin's answer, the respond phase that writes it. */
const ric_phase_t ric_pipeline_admin_phases[] = {
    { .run = ric_request_phase_route },
    { .run = ric_admin_phase },
    { .run = ric_respond_phase,
      .flags = RIC_PHASE_ANSWERS,
      .writable = ric_respond_relay },
};

const unsigned ric_pipeline_admin_nphases = ric_nelems(ric_pipeline_admin_phases);
