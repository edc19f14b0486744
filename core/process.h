/* process.h: the master process: listeners, workers, signals. */
#ifndef RIC_PROCESS_H
#define RIC_PROCESS_H

#include "ric_core.h"
#include "conf.h"

/* Gives every listener of conf its socket (ls->fd): the master's open one
 * for that address, or a newly bound one. The sockets belong to the
 * master, not to conf, so a later configuration can keep them. Returns
 * RIC_OK, or RIC_ERROR after logging which address failed; sockets this
 * call opened are closed. */
int ric_process_bind(ric_conf_t *conf);

/* Runs the master: writes the pid file, forks the workers, restarts those
 * that die, and handles signals until told to stop. Returns the exit code. */
int ric_process_master(ric_conf_t *conf);

/* Sends the signal named by name (stop, quit, reopen, reload) to the master
 * whose pid file conf names. Returns the exit code; prints errors. */
int ric_process_signal(ric_conf_t *conf, const char *name);

#endif /* RIC_PROCESS_H */
