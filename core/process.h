/* process.h: the master process: listeners, workers, signals. */
#ifndef RIC_PROCESS_H
#define RIC_PROCESS_H

#include "ric_core.h"
#include "conf.h"

#include <signal.h>

struct ric_shm_s;

/* `ricochet -s reload` and `-s upgrade` queue RIC_SIG_RELOAD or
 * RIC_SIG_UPGRADE (real-time signals queue: two at once are two) with
 * RIC_RELOAD_ASK, so that the master knows whom to tell the outcome:
 * RIC_SIG_RELOADED (value 0: the new generation serves; 1: refused), with
 * the line in PIDFILE.reload.PID. A plain SIGHUP or SIGUSR2 (kill) does the
 * same, untold. */
#define RIC_RELOAD_ASK 0x52454c44
#define RIC_SIG_RELOADED (SIGRTMIN + 2)
#define RIC_SIG_RELOAD (SIGRTMIN + 4)
#define RIC_SIG_UPGRADE (SIGRTMIN + 5)
#define RIC_RELOAD_WAIT_MS 60000 /* how long -s reload waits for it */
/* A binary upgrade's new master tells the old one its workers serve. */
#define RIC_SIG_UPGRADED (SIGRTMIN + 3)

/* Makes conf a generation the master can run: checks its idempotency
 * stores (as -t does), opens its access logs, gives every listener its
 * socket (the master's open one for the address, or a newly bound one:
 * the sockets belong to the master, so a generation that keeps an
 * address keeps its socket and the connections waiting in its queue), and
 * finds its shared state in zone by name (a budget whose rule did not
 * change keeps its tokens, a server its health). RIC_OK, or RIC_ERROR with
 * "FILE:LINE: reason" in err. */
int ric_process_generation(ric_conf_t *conf, struct ric_shm_s *zone, char *err, size_t errlen);

/* The size of the shared zone for conf, with room for what reloads add. */
size_t ric_process_zone_size(const ric_conf_t *conf);

/* Runs the master: writes the pid file, forks the workers, restarts those
 * that die, reloads on SIGHUP (reading prefix and file again, as the
 * command line gave them; a new generation of workers takes over once it
 * serves, the old one drains), upgrades on SIGUSR2 (the binary on disk
 * runs again with argv and this master's listening sockets; once its
 * workers serve, this master drains and exits), and handles signals until
 * told to stop. *confp is the generation serving at the end. Returns the
 * exit code. */
/* Blocks the master's signals (reload, stop, the workers' word): they stay
 * pending until ric_process_master's loop takes them, so one sent as soon
 * as the listening sockets accept is acted on, not fatal. */
void ric_process_hold_signals(void);

int ric_process_master(ric_conf_t **confp, const char *prefix, const char *file,
                       struct ric_shm_s *zone, char *const *argv);

/* Sends the signal named by name (stop, quit, reopen, reload, upgrade) to
 * the master whose pid file conf names. For reload and upgrade, waits
 * (RIC_RELOAD_WAIT_MS) for the outcome and prints it: 0 when the new
 * generation (or binary) serves, 1 when it was refused (the reason).
 * Returns the exit code; prints errors. */
int ric_process_signal(ric_conf_t *conf, const char *name);

#endif /* RIC_PROCESS_H */
