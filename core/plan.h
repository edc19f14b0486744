/* plan.h: `ricochet plan`: each route's retry schedule, for design reviews. */
#ifndef RIC_PLAN_H
#define RIC_PLAN_H

#include "ric_core.h"
#include "conf.h"

#include <stdio.h>

/* Prints the plan of every proxied location of conf whose path starts with
 * filter (NULL: all). Returns the number of routes printed. */
int ric_plan_print(const ric_conf_t *conf, const char *filter, FILE *out);

#endif /* RIC_PLAN_H */
