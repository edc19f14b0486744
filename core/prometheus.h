/* prometheus.h: the instance's metrics as Prometheus text (GET /metrics on the admin listener). */
#ifndef RIC_PROMETHEUS_H
#define RIC_PROMETHEUS_H

#include "ric_core.h"
#include "conf.h"

/* Appends every metric of the instance, as conf (this worker's
 * generation) names its routes, upstreams, stores, scripts and servers, to
 * b in the text exposition format 0.0.4. */
void ric_prometheus_write(const ric_conf_t *conf, ric_buf_t *b);

#endif /* RIC_PROMETHEUS_H */
