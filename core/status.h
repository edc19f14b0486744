/* status.h: the live status page's figures (GET /status.json on the admin listener), sampled by the master once a second. */
#ifndef RIC_STATUS_H
#define RIC_STATUS_H

#include "ric_core.h"
#include "conf.h"

/* The master, once a second: every route's and upstream's running totals
 * (and budget tokens, servers up) into the next sample of their rings,
 * taken at wall_ms (the wall clock; tests give their own). */
void ric_status_sample(const ric_conf_t *conf, int64_t wall_ms);

/* Appends sample seq (-1: the latest) as JSON to b: for each upstream and
 * route the totals, the rates, success and latency over the last ten
 * seconds, and five minutes of history. RIC_OK; RIC_DECLINED: no sample
 * yet; RIC_ERROR: seq is not (or no longer) kept. */
int ric_status_json(const ric_conf_t *conf, int64_t seq, ric_buf_t *b);

#endif /* RIC_STATUS_H */
