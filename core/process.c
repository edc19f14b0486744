/* process.c: the master: binds listeners, forks workers, replaces dead ones, handles signals. */
#include "io.h"
#include "process.h"
#include "access_log.h"
#include "idem_store.h"
#include "log.h"
#include "metrics.h"
#include "script.h"
#include "shared_dict.h"
#include "shm.h"
#include "status.h"
#include "upstream.h"
#include "watchdog.h"
#include "worker.h"

#include <errno.h>
#include <systemd/sd-daemon.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LISTEN_BACKLOG 511
#define RESPAWN_MIN_INTERVAL_MS 1000 /* a worker that keeps dying restarts at most this often */
#define FAST_STOP_GRACE_MS 5000      /* after SIGTERM, workers get this long before SIGKILL */
#define RELOAD_START_MS 30000        /* a new generation's workers must be serving by then */
#define MAX_ASKERS 16                /* -s reload at once, each told the outcome */
#define RIC_ENV_LISTEN_FDS "RICOCHET_LISTEN_FDS"     /* an upgrade's sockets, "3,4,..." */
#define RIC_ENV_UPGRADE_FROM "RICOCHET_UPGRADE_FROM" /* ...and the old master's pid */

typedef struct {
    pid_t pid;          /* 0: the slot is empty */
    int64_t started_ms;
    int64_t respawn_at; /* when an empty slot is to be filled; 0: now */
    int ready;          /* it said it serves (RIC_SIG_WORKER_READY) */
} worker_slot_t;

/* A listening socket: the master's, by address, whatever config uses it,
 * so that a new configuration can take over the sockets the old one had
 * instead of closing and binding them again. */
typedef struct listen_socket_s listen_socket_t;
struct listen_socket_s {
    struct sockaddr_storage addr;
    socklen_t addrlen;
    int fd;
    listen_socket_t *next;
};

static listen_socket_t *sockets;

static listen_socket_t *
socket_find(const struct sockaddr_storage *addr, socklen_t addrlen)
{
    listen_socket_t *s;

    for (s = sockets; s; s = s->next) {
        if (s->addrlen == addrlen && memcmp(&s->addr, addr, addrlen) == 0) {
            return s;
        }
    }
    return NULL;
}

static int
socket_open(const ric_listener_t *ls, char *err, size_t errlen)
{
    const char *what;
    int fd = ric_io_listen((const struct sockaddr *) &ls->addr, ls->addrlen, LISTEN_BACKLOG, &what);

    if (fd == -1) {
        snprintf(err, errlen, "%s:%d: %s() %s %s failed (%s)", ls->listens->file, ls->listens->line, what,
                 what[0] == 's' ? "for" : what[0] == 'b' ? "to" : "on", ls->text,
                 strerror(errno));
    }
    return fd;
}

/* The listening sockets an old binary handed over (a binary upgrade): in
 * RICOCHET_LISTEN_FDS, "3,4,...". They join the master's own, so the
 * addresses the configuration names find them instead of binding again. */
static void
adopt_inherited(void)
{
    static int done;
    const char *v = getenv(RIC_ENV_LISTEN_FDS);
    struct sockaddr_storage ss;
    socklen_t len;
    listen_socket_t *s;
    char *end;
    long fd;

    if (done) {
        return;
    }
    done = 1;
    while (v != NULL && *v != '\0') {
        fd = strtol(v, &end, 10);
        if (end == v) {
            break;
        }
        v = *end == ',' ? end + 1 : end;
        if (fd < 3 || ric_io_listen_adopt((int) fd, &ss, &len) != RIC_OK) {
            continue;
        }
        s = ric_xcalloc(1, sizeof(*s));
        memcpy(&s->addr, &ss, len);
        s->addrlen = len;
        s->fd = (int) fd;
        s->next = sockets;
        sockets = s;
    }
    unsetenv(RIC_ENV_LISTEN_FDS);
}

/* Gives every listener of conf its socket (ls->fd): the master's open one
 * for that address, or a newly bound one. The sockets belong to the
 * master, not to conf, so a later generation keeps them: a socket is
 * never closed and bound again while it listens, and no connection
 * waiting in its queue is lost. RIC_OK, or RIC_ERROR with err (sockets
 * this call opened are closed). */
static int
process_bind(ric_conf_t *conf, char *err, size_t errlen)
{
    listen_socket_t *s, *known;
    ric_listener_t *ls;
    int fd;

    adopt_inherited();
    known = sockets;
    for (ls = conf->listeners; ls; ls = ls->next) {
        s = socket_find(&ls->addr, ls->addrlen);
        if (s == NULL) {
            fd = socket_open(ls, err, errlen);
            if (fd == -1) {
                goto failed;
            }
            s = ric_xcalloc(1, sizeof(*s));
            memcpy(&s->addr, &ls->addr, ls->addrlen);
            s->addrlen = ls->addrlen;
            s->fd = fd;
            s->next = sockets;
            sockets = s;
        }
        ls->fd = s->fd;
    }
    return RIC_OK;

failed:
    /* only what this call opened goes */
    while (sockets != known) {
        s = sockets;
        sockets = s->next;
        close(s->fd);
        free(s);
    }
    for (ls = conf->listeners; ls; ls = ls->next) {
        ls->fd = -1;
    }
    return RIC_ERROR;
}

/* Whether a listener of conf has the socket fd. */
static int
listens_on(const ric_conf_t *conf, int fd)
{
    const ric_listener_t *ls;

    for (ls = conf->listeners; ls && ls->fd != fd; ls = ls->next) {
    }
    return ls != NULL;
}

/* The sockets no listener of conf uses are closed (a reload removed their
 * address: the workers that still accept on them have their own copy). */
static void
close_unused(const ric_conf_t *conf)
{
    listen_socket_t **sp = &sockets, *s;

    while ((s = *sp) != NULL) {
        if (!listens_on(conf, s->fd)) {
            *sp = s->next;
            close(s->fd);
            free(s);
        } else {
            sp = &s->next;
        }
    }
}

/* conf's entries in the shared zone, found by name or made. */
static int
share(ric_conf_t *conf, ric_shm_t *zone, char *err, size_t errlen)
{
    if (ric_upstream_share(conf, zone, err, errlen) != RIC_OK
        || ric_idem_store_share(conf, zone, err, errlen) != RIC_OK
        || ric_shared_dict_share(conf, zone, err, errlen) != RIC_OK
        || ric_script_share(conf, zone, err, errlen) != RIC_OK
        || ric_metrics_share(conf, zone, err, errlen) != RIC_OK
        || ric_watchdog_share(zone, err, errlen) != RIC_OK) {
        return RIC_ERROR;
    }
    return RIC_OK;
}

int
ric_process_generation(ric_conf_t *conf, ric_shm_t *zone, char *err, size_t errlen)
{
    if (ric_idem_store_recover_all(conf, 0, err, errlen) != RIC_OK
        || ric_access_log_open(conf, err, errlen) != RIC_OK
        || process_bind(conf, err, errlen) != RIC_OK) {
        return RIC_ERROR;
    }
    return share(conf, zone, err, errlen);
}

size_t
ric_process_zone_size(const ric_conf_t *conf)
{
    size_t need = ric_upstream_zone_size(conf) + ric_shared_dict_zone_size(conf)
                  + ric_script_zone_size(conf) + ric_metrics_zone_size(conf)
                  + ric_watchdog_zone_size();

    /* room for what reloads add (untouched pages cost no memory) */
    return need * 4 + ((size_t) 4 << 20);
}

static void
close_listeners(void)
{
    listen_socket_t *s;

    while ((s = sockets) != NULL) {
        sockets = s->next;
        close(s->fd);
        free(s);
    }
}

static void
master_signals(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGCHLD);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGQUIT);
    sigaddset(set, SIGHUP);
    sigaddset(set, SIGUSR1);
    sigaddset(set, SIGUSR2);
    sigaddset(set, RIC_SIG_WORKER_READY);
    sigaddset(set, RIC_SIG_UPGRADED);
    sigaddset(set, RIC_SIG_RELOAD);
    sigaddset(set, RIC_SIG_UPGRADE);
}

/* In a new worker: the master's sockets its configuration does not listen
 * on are closed (another generation's), so it never accepts on them. */
static void
close_others(const ric_conf_t *conf)
{
    const listen_socket_t *s;

    for (s = sockets; s; s = s->next) {
        if (!listens_on(conf, s->fd)) {
            close(s->fd);
        }
    }
}

static pid_t
spawn_worker(ric_conf_t *conf, worker_slot_t *slot, int index, int64_t gen, ric_log_t *log)
{
    sigset_t set;
    pid_t master = getpid(), pid;
    int watched = ric_watchdog_claim();

    pid = fork();
    if (pid == -1) {
        ric_log_error(RIC_LOG_ALERT, errno, "fork() failed while spawning a worker");
        ric_watchdog_started(watched, 0);
        return -1;
    }
    if (pid == 0) {
        /* the worker must die with the master, even when the master is killed */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != master) {
            _exit(0);
        }
        if (log != NULL) {
            ric_log_use(log); /* its generation's error log */
        }
        close_others(conf);
        signal(SIGHUP, SIG_IGN);
        signal(SIGPIPE, SIG_IGN);
        /* the stop signals stay held until the worker's loop has its
         * handlers (ric_worker_run): a SIGTERM the master sends a worker
         * still starting must stop it gracefully, not kill it */
        sigemptyset(&set);
        sigaddset(&set, SIGTERM);
        sigaddset(&set, SIGINT);
        sigaddset(&set, SIGQUIT);
        sigaddset(&set, SIGUSR1);
        sigprocmask(SIG_SETMASK, &set, NULL);
        ric_metrics_worker_begin(index, gen); /* its shard of the counters, its gauges */
        ric_watchdog_worker_begin(watched);   /* its heartbeat */
        exit(ric_worker_run(conf));
    }
    ric_watchdog_started(watched, pid);
    slot->pid = pid;
    slot->started_ms = ric_now_ms();
    slot->respawn_at = 0;
    ric_log_error(RIC_LOG_NOTICE, 0, "started worker process %d", (int) pid);
    return pid;
}

static void
signal_workers(worker_slot_t *slots, int n, int sig)
{
    int i;

    for (i = 0; i < n; i++) {
        if (slots[i].pid > 0) {
            kill(slots[i].pid, sig);
        }
    }
}

static int
workers_alive(worker_slot_t *slots, int n)
{
    int i, alive = 0;

    for (i = 0; i < n; i++) {
        alive += slots[i].pid > 0;
    }
    return alive;
}

/* The pid file, kept open and locked while the master lives (its workers
 * share the lock): `-s` tells a live master from a stale file by it. */
static int
write_pid_file(const char *path)
{
    static int held = -1;
    char buf[32];
    int fd, n;

    fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd == -1) {
        ric_log_error(RIC_LOG_EMERG, errno, "cannot write the pid file \"%s\"", path);
        return RIC_ERROR;
    }
    /* locked before the pid is in it: a `-s` that reads this pid finds
     * it held (locked after, a `-s reload` at that moment called it stale) */
    flock(fd, LOCK_EX | LOCK_NB);
    n = snprintf(buf, sizeof(buf), "%d\n", (int) getpid());
    if (ftruncate(fd, 0) != 0 || write(fd, buf, (size_t) n) != n) {
        ric_log_error(RIC_LOG_EMERG, errno, "cannot write the pid file \"%s\"", path);
        close(fd);
        return RIC_ERROR;
    }
    if (held != -1) {
        close(held);
    }
    held = fd;
    return RIC_OK;
}

/* The pid a pid file names: > 0; 0 when it names none; -1 (errno) when it
 * cannot be opened. */
static long
pid_file_read(const char *path)
{
    char buf[32];
    ssize_t n;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd == -1) {
        return -1;
    }
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    buf[n > 0 ? n : 0] = '\0';
    n = (ssize_t) strtol(buf, NULL, 10);
    return n > 0 ? (long) n : 0;
}

/* At exit: the pid file goes if it still names this master (an upgrade's
 * old master may have put its own back meanwhile). */
static void
pid_file_remove(const char *path)
{
    if (pid_file_read(path) == (long) getpid()) {
        unlink(path);
    }
}

static int
daemonize(void)
{
    pid_t pid = fork();
    int fd;

    if (pid == -1) {
        ric_log_error(RIC_LOG_EMERG, errno, "fork() failed while becoming a daemon");
        return RIC_ERROR;
    }
    if (pid > 0) {
        _exit(0);
    }
    setsid();
    fd = open("/dev/null", O_RDWR);
    if (fd != -1) {
        dup2(fd, 0);
        dup2(fd, 1);
        if (ric_log->fd != 2) {
            dup2(fd, 2);
        }
        if (fd > 2) {
            close(fd);
        }
    }
    return RIC_OK;
}

/* The master's workers: the generation serving, one starting (a reload
 * under way), and older ones draining. */
typedef struct {
    ric_conf_t *conf;          /* the generation serving */
    unsigned gen;
    worker_slot_t *slots;      /* its workers */
    int n;
    ric_conf_t *next_conf;     /* a reload's, until its workers all serve */
    ric_log_t next_log;        /* ...its error log, when it names another one */
    int next_log_open;
    worker_slot_t *next;
    int next_n;
    int64_t next_deadline;
    pid_t askers[MAX_ASKERS];  /* the -s reload (or upgrade) waiting for the one under way */
    int naskers;
    pid_t waiting[MAX_ASKERS]; /* ...asked while one was under way: told after the next one */
    int nwaiting;
    int again;                 /* a reload was asked while one was under way: one more follows */
    int sweep;                 /* the zone has entries no generation may need: sweep once drained */
    int told_ready;            /* its first workers serve, and it said so */
    pid_t *draining;           /* workers of older generations, finishing */
    int ndraining, draining_cap;
    const char *prefix, *file; /* as the command line gave them, to read the config again */
    ric_shm_t *zone;
    char *const *argv;         /* the command line, for a binary upgrade */
    char exe[4096];            /* the binary's path on disk, read at start */
    pid_t upgrade_pid;         /* a new binary's master, until its workers serve */
    int64_t upgrade_deadline;
    pid_t old_master;          /* (a new binary's master) the one to tell once we serve */
    int handed_over;           /* the new binary serves: this master drains and goes */
    int stopping;              /* told to stop: a worker that goes is not replaced */
} master_t;

static void
drain_add(master_t *m, pid_t pid)
{
    if (m->ndraining == m->draining_cap) {
        m->draining_cap = m->draining_cap ? m->draining_cap * 2 : 8;
        m->draining = ric_xrealloc(m->draining, (size_t) m->draining_cap * sizeof(pid_t));
    }
    m->draining[m->ndraining++] = pid;
}

/* Tells one -s reload (or upgrade) how it went: a line in
 * PIDFILE.reload.PID, then RIC_SIG_RELOADED (value 0: serving). */
static void
reply_one(const master_t *m, pid_t asker, int ok, const char *line)
{
    char path[4200], tmp[4210];
    union sigval v;
    int fd;
    ssize_t w;

    if (m->conf->pid_path != NULL && strcmp(m->conf->pid_path, "off") != 0) {
        snprintf(path, sizeof(path), "%s.reload.%d", m->conf->pid_path, (int) asker);
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd != -1) {
            w = write(fd, line, strlen(line));
            close(fd);
            if (w == (ssize_t) strlen(line)) {
                rename(tmp, path);
            } else {
                unlink(tmp);
            }
        }
    }
    v.sival_int = ok ? 0 : 1;
    sigqueue(asker, RIC_SIG_RELOADED, v);
}

/* Every asker of the reload (or upgrade) that ended is told. */
static void
reload_reply(master_t *m, int ok, const char *line)
{
    int i;

    for (i = 0; i < m->naskers; i++) {
        reply_one(m, m->askers[i], ok, line);
    }
    m->naskers = 0;
}

static void
ask_add(const master_t *m, pid_t *list, int *n, pid_t asker)
{
    if (asker <= 0) {
        return;
    }
    if (*n < MAX_ASKERS) {
        list[(*n)++] = asker;
    } else {
        reply_one(m, asker, 0, "refused: too many reloads wait already; ask again");
    }
}

static void
reload_fail(master_t *m, const char *reason)
{
    char line[1200];

    snprintf(line, sizeof(line), "reload refused: %s; configuration generation %u keeps serving",
             reason, m->gen);
    ric_log_error(RIC_LOG_ERR, 0, "%s", line);
    /* reading the refused config set what is process-wide: the running one's again */
    ric_script_limits(m->conf);
    ric_shared_dict_declare(m->conf->http ? m->conf->http->shared_dicts : NULL);
    m->sweep = 1; /* what the refused one made in the zone */
    sd_notifyf(0, "READY=1\nSTATUS=%s", line);
    reload_reply(m, 0, line);
}

/* A reload: the config read again and checked as -t does, its listeners
 * bound (those it shares with the running one are the same sockets), its
 * shared state found by name, and its workers started beside the running
 * ones. Any error leaves the running generation as it was. */
static void
reload_begin(master_t *m, pid_t asker)
{
    char err[1024];
    ric_conf_t *c;
    int i;

    if (m->next_n > 0 || m->upgrade_pid > 0) {
        /* one at a time: a new one follows, reading the file as it is then */
        ask_add(m, m->waiting, &m->nwaiting, asker);
        m->again = 1;
        return;
    }
    ask_add(m, m->askers, &m->naskers, asker);
    ric_log_error(RIC_LOG_NOTICE, 0, "reloading the configuration");
    sd_notify(0, "RELOADING=1"); /* systemd, when it runs the master (Type=notify) */
    c = ric_conf_load(m->prefix, m->file, err, sizeof(err));
    if (c == NULL) {
        reload_fail(m, err);
        return;
    }
    if (ric_process_generation(c, m->zone, err, sizeof(err)) != RIC_OK) {
        ric_conf_free(c);
        close_unused(m->conf); /* what this generation alone had bound */
        reload_fail(m, err);
        return;
    }
    m->next_log_open = 0;
    if (strcmp(c->error_log, ric_log->path ? ric_log->path : "stderr") != 0
        || c->error_log_level != ric_log->level) {
        if (ric_log_open(&m->next_log, c->error_log, (int) c->error_log_level) != RIC_OK) {
            snprintf(err, sizeof(err), "cannot open the error log \"%s\": %s", c->error_log,
                     strerror(errno));
            ric_conf_free(c);
            close_unused(m->conf);
            reload_fail(m, err);
            return;
        }
        m->next_log_open = 1;
    }
    m->next_conf = c;
    m->next_n = (int) c->worker_processes;
    m->next = ric_xcalloc((size_t) m->next_n, sizeof(worker_slot_t));
    m->next_deadline = ric_now_ms() + RELOAD_START_MS;
    for (i = 0; i < m->next_n; i++) {
        spawn_worker(c, &m->next[i], i, (int64_t) m->gen + 1, m->next_log_open ? &m->next_log : NULL);
    }
}

/* The starting generation failed: its workers go, the running one stays. */
static void
reload_abort(master_t *m, const char *reason)
{
    int i;

    for (i = 0; i < m->next_n; i++) {
        if (m->next[i].pid > 0) {
            /* it may have accepted clients already: they get their answers */
            kill(m->next[i].pid, SIGQUIT);
            drain_add(m, m->next[i].pid);
        }
    }
    free(m->next);
    m->next = NULL;
    m->next_n = 0;
    ric_conf_free(m->next_conf);
    m->next_conf = NULL;
    if (m->next_log_open) {
        if (m->next_log.fd > 2) {
            close(m->next_log.fd);
        }
        free(m->next_log.path);
        m->next_log_open = 0;
    }
    close_unused(m->conf);
    reload_fail(m, reason);
}

/* Every worker of the starting generation serves: it takes over, the old
 * one stops accepting, finishes what it has and exits. */
static void
reload_check(master_t *m, int64_t now)
{
    char line[256];
    int i, ready = 0;

    if (m->next_n == 0) {
        return;
    }
    for (i = 0; i < m->next_n; i++) {
        ready += m->next[i].ready;
    }
    if (ready < m->next_n) {
        if (now >= m->next_deadline) {
            reload_abort(m, "the new workers did not start serving in time");
        }
        return;
    }
    for (i = 0; i < m->n; i++) {
        if (m->slots[i].pid > 0) {
            kill(m->slots[i].pid, SIGQUIT);
            drain_add(m, m->slots[i].pid);
        }
    }
    free(m->slots);
    ric_conf_free(m->conf);
    if (m->next_log_open) {
        ric_log_use(&m->next_log); /* the old one closes */
        m->next_log_open = 0;
    }
    m->conf = m->next_conf;
    m->slots = m->next;
    m->n = m->next_n;
    m->next_conf = NULL;
    m->next = NULL;
    m->next_n = 0;
    m->gen++;
    ric_metrics_instance->generation = m->gen;
    m->sweep = 1; /* what only the old generation named, once it has gone */
    close_unused(m->conf);
    snprintf(line, sizeof(line), "configuration generation %u serving: %d worker%s", m->gen, m->n,
             m->n == 1 ? "" : "s");
    ric_log_error(RIC_LOG_NOTICE, 0, "%s", line);
    sd_notifyf(0, "READY=1\nSTATUS=%s", line);
    reload_reply(m, 1, line);
}

static void
pid_file_move(const master_t *m, int aside)
{
    char old[4200];

    if (m->conf->pid_path == NULL || strcmp(m->conf->pid_path, "off") == 0) {
        return;
    }
    snprintf(old, sizeof(old), "%s.oldbin", m->conf->pid_path);
    if (aside) {
        rename(m->conf->pid_path, old);
    } else {
        rename(old, m->conf->pid_path);
    }
}

static void
upgrade_failed(master_t *m, const char *reason, int pid_moved)
{
    char line[600];

    m->upgrade_pid = 0;
    if (pid_moved) {
        pid_file_move(m, 0);
    }
    snprintf(line, sizeof(line), "upgrade failed: %s; the running binary keeps serving", reason);
    ric_log_error(RIC_LOG_ERR, 0, "%s", line);
    reload_reply(m, 0, line);
}

/* A binary upgrade: the binary on disk runs as a new master, with this
 * one's listening sockets (RICOCHET_LISTEN_FDS) and told whom to tell once
 * its workers serve (RICOCHET_UPGRADE_FROM). Until then this master serves
 * on; if the new one exits first, or does not serve in time, it stays. */
static void
upgrade_begin(master_t *m, pid_t asker)
{
    char fds[1024], from[32];
    listen_socket_t *s;
    size_t len = 0;
    sigset_t none;
    pid_t pid;

    if (m->upgrade_pid > 0 || m->next_n > 0 || m->handed_over) {
        if (asker > 0) {
            reply_one(m, asker, 0, "upgrade refused: a reload or an upgrade is under way");
        }
        return;
    }
    ask_add(m, m->askers, &m->naskers, asker);
    if (m->exe[0] == '\0') {
        upgrade_failed(m, "the path of the running binary is unknown (/proc/self/exe)", 0);
        return;
    }
    fds[0] = '\0';
    for (s = sockets; s && len + 16 < sizeof(fds); s = s->next) {
        len += (size_t) snprintf(fds + len, sizeof(fds) - len, "%s%d", len ? "," : "", s->fd);
    }
    snprintf(from, sizeof(from), "%d", (int) getpid());
    ric_log_error(RIC_LOG_NOTICE, 0, "upgrading: starting %s", m->exe);
    pid_file_move(m, 1);
    pid = fork();
    if (pid == -1) {
        upgrade_failed(m, "fork() failed", 1);
        return;
    }
    if (pid == 0) {
        for (s = sockets; s; s = s->next) {
            ric_io_listen_inherit(s->fd); /* this copy of the table only */
        }
        setenv(RIC_ENV_LISTEN_FDS, fds, 1);
        setenv(RIC_ENV_UPGRADE_FROM, from, 1);
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execv(m->exe, m->argv);
        ric_log_error(RIC_LOG_ALERT, errno, "execv(\"%s\") failed", m->exe);
        _exit(127);
    }
    m->upgrade_pid = pid;
    m->upgrade_deadline = ric_now_ms() + RELOAD_START_MS;
}

static worker_slot_t *
slot_of(worker_slot_t *slots, int n, pid_t pid)
{
    int i;

    for (i = 0; i < n; i++) {
        if (slots[i].pid == pid) {
            return &slots[i];
        }
    }
    return NULL;
}

static void
why_exited(pid_t pid, int status, const char *whose)
{
    if (WIFSIGNALED(status)) {
        ric_log_error(RIC_LOG_ALERT, 0, "%sworker process %d exited on signal %d", whose,
                      (int) pid, WTERMSIG(status));
    } else {
        ric_log_error(RIC_LOG_ALERT, 0, "%sworker process %d exited with code %d", whose,
                      (int) pid, WEXITSTATUS(status));
    }
}

static void
master_reap(master_t *m, int stopping)
{
    worker_slot_t *slot;
    pid_t pid;
    int status, i;
    int64_t now;

    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        ric_metrics_worker_gone(pid);
        ric_watchdog_gone(pid);
        if (pid == m->upgrade_pid) {
            char why[128];

            if (WIFSIGNALED(status)) {
                snprintf(why, sizeof(why), "the new binary's master %d exited on signal %d before "
                         "it served", (int) pid, WTERMSIG(status));
            } else {
                snprintf(why, sizeof(why), "the new binary's master %d exited with code %d before "
                         "it served (its error log says why)", (int) pid, WEXITSTATUS(status));
            }
            upgrade_failed(m, why, 1);
            continue;
        }
        for (i = 0; i < m->ndraining && m->draining[i] != pid; i++) {
        }
        if (i < m->ndraining) {
            m->draining[i] = m->draining[--m->ndraining];
            ric_log_error(RIC_LOG_NOTICE, 0, "worker process %d of an older generation exited",
                          (int) pid);
            continue;
        }
        if ((slot = slot_of(m->next, m->next_n, pid)) != NULL) {
            slot->pid = 0;
            why_exited(pid, status, "a new generation's ");
            reload_abort(m, "a worker of the new configuration exited before it served");
            continue;
        }
        if ((slot = slot_of(m->slots, m->n, pid)) == NULL) {
            continue;
        }
        slot->pid = 0;
        slot->ready = 0;
        if (stopping && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
            ric_log_error(RIC_LOG_NOTICE, 0, "worker process %d exited", (int) pid);
            continue;
        }
        why_exited(pid, status, "");
        if (stopping) {
            continue;
        }
        now = ric_now_ms();
        slot->respawn_at = now - slot->started_ms < RESPAWN_MIN_INTERVAL_MS
                               ? slot->started_ms + RESPAWN_MIN_INTERVAL_MS
                               : now;
    }
}

/* No worker of an older generation lives: the zone's entries the serving
 * generation does not name (removed upstreams, changed budget rules,
 * resized or removed dictionaries, a refused generation's) are freed. */
static void
master_sweep(master_t *m)
{
    char err[512];
    size_t freed;

    m->sweep = 0;
    ric_shm_sweep_begin(m->zone);
    if (share(m->conf, m->zone, err, sizeof(err)) != RIC_OK) {
        /* nothing is freed when what is kept is not known for sure */
        ric_log_error(RIC_LOG_ALERT, 0, "cannot sweep the shared memory zone: %s", err);
        return;
    }
    freed = ric_shm_sweep_end(m->zone);
    if (freed > 0) {
        ric_log_error(RIC_LOG_INFO, 0, "freed %zu bytes of the shared memory zone that no "
                      "generation names any more", freed);
    }
}

/* The master stops (sig, to the workers): a reload or an upgrade under way
 * ends with it (an upgrade's new master is told the same), and whoever
 * waits for one is told. */
static void
master_stopping(master_t *m, int sig)
{
    int i;

    ric_metrics_instance->stopping = 1; /* /readyz says 503 from now */
    m->stopping = 1;
    if (m->next_n > 0) {
        reload_abort(m, "the master is stopping");
    }
    if (m->upgrade_pid > 0) {
        kill(m->upgrade_pid, sig);
        drain_add(m, m->upgrade_pid);
        upgrade_failed(m, "the master is stopping", 1);
    }
    for (i = 0; i < m->nwaiting; i++) {
        reply_one(m, m->waiting[i], 0, "refused: the master is stopping");
    }
    m->nwaiting = 0;
    m->again = 0;
}

/* The watchdog found pid's loop stalled: it is killed and the log says
 * where it was; master_reap replaces it as any worker that died (a
 * worker of the serving generation, while the master runs). */
static void
on_stalled(pid_t pid, const char *what, int in_script, void *ctx)
{
    master_t *m = ctx;
    int64_t ms = m->conf->worker_watchdog;
    const char *fate = m->stopping ? "; the instance is stopping: not replaced"
                       : slot_of(m->slots, m->n, pid) != NULL ? " and replaced"
                       : slot_of(m->next, m->next_n, pid) != NULL
                       ? "; the reload under way is abandoned"
                       : "; it was draining after a reload: not replaced";

    kill(pid, SIGKILL);
    ric_log_error(RIC_LOG_ALERT, 0, "worker %d %s: killed by the watchdog (worker_watchdog "
                  "%lld%s)%s; its requests in flight are lost; %s", (int) pid, what,
                  (long long) (ms % 1000 == 0 ? ms / 1000 : ms), ms % 1000 == 0 ? "s" : "ms",
                  fate, in_script ? "fix the script"
                  : "it ran no route script's hook: report it (a loop of the gateway's own, or a "
                    "call that blocked)");
}

static void
master_signal_all(master_t *m, int sig)
{
    int i;

    signal_workers(m->slots, m->n, sig);
    signal_workers(m->next, m->next_n, sig);
    for (i = 0; i < m->ndraining; i++) {
        kill(m->draining[i], sig);
    }
}

static int
master_alive(const master_t *m)
{
    return workers_alive(m->slots, m->n) + workers_alive(m->next, m->next_n) + m->ndraining;
}

static void
mark_ready(master_t *m, pid_t pid)
{
    worker_slot_t *slot = slot_of(m->next, m->next_n, pid);

    if (slot == NULL) {
        slot = slot_of(m->slots, m->n, pid);
    }
    if (slot != NULL) {
        slot->ready = 1;
    }
}

void
ric_process_hold_signals(void)
{
    sigset_t set;

    master_signals(&set);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
}

int
ric_process_master(ric_conf_t **confp, const char *prefix, const char *file, ric_shm_t *zone,
                   char *const *argv)
{
    enum { RUNNING, STOP_FAST, STOP_GRACEFUL } stopping = RUNNING;
    ric_conf_t *conf = *confp;
    master_t m = { .conf = conf, .gen = 1, .prefix = prefix, .file = file, .zone = zone,
                   .argv = argv };
    int i, sig, ready, has_pid = strcmp(conf->pid_path, "off") != 0;
    const char *from = getenv(RIC_ENV_UPGRADE_FROM);
    char pid_path[4096];
    ssize_t n;
    int64_t now, kill_at = 0, wake, sample_at = 0, watch_at = 0;
    struct timespec ts;
    sigset_t set;
    siginfo_t info;

    /* the path on disk, read now: an upgrade runs what is there then */
    n = readlink("/proc/self/exe", m.exe, sizeof(m.exe) - 1);
    m.exe[n > 0 ? n : 0] = '\0';
    if (from != NULL) {
        m.old_master = (pid_t) strtol(from, NULL, 10);
        unsetenv(RIC_ENV_UPGRADE_FROM);
    }
    m.n = (int) conf->worker_processes;
    m.slots = ric_xcalloc((size_t) m.n, sizeof(worker_slot_t));
    close_unused(conf); /* sockets an upgrade handed over that this config does not name */
    snprintf(pid_path, sizeof(pid_path), "%s", conf->pid_path);
    ric_process_hold_signals();
    master_signals(&set);

    if (conf->daemon && m.old_master == 0 && daemonize() != RIC_OK) {
        free(m.slots);
        return 1;
    }
    if (has_pid && write_pid_file(pid_path) != RIC_OK) {
        free(m.slots);
        return 1;
    }
    ric_metrics_instance->master_pid = getpid(); /* after daemonize: this process */
    ric_log_stderr_too = 0; /* start-up is over: the error log alone from here */
    for (i = 0; i < m.n; i++) {
        spawn_worker(conf, &m.slots[i], i, m.gen, NULL);
    }
    ric_log_error(RIC_LOG_NOTICE, 0, "ricochet/%s started: master %d, %d worker%s", RIC_VERSION,
                  (int) getpid(), m.n, m.n == 1 ? "" : "s");

    ric_metrics_instance->generation = m.gen;
    for (;;) {
        now = ric_now_ms();
        if (now >= sample_at) {
            ric_status_sample(m.conf, ric_wall_ms()); /* the status page's second */
            sample_at = ric_max(sample_at + 1000, now + 500);
        }
        wake = ric_min(now + 1000, sample_at);
        if (m.conf->worker_watchdog > 0) {
            if (now >= watch_at) {
                ric_watchdog_check(ric_now_us(), m.conf->worker_watchdog, on_stalled, &m);
                watch_at = now + RIC_WATCHDOG_TICK_MS;
            }
            wake = ric_min(wake, watch_at);
        }
        for (i = 0; i < m.n && stopping == RUNNING; i++) {
            if (m.slots[i].pid == 0) {
                if (m.slots[i].respawn_at <= now) {
                    spawn_worker(m.conf, &m.slots[i], i, m.gen, NULL);
                } else {
                    wake = ric_min(wake, m.slots[i].respawn_at);
                }
            }
        }
        if (stopping == RUNNING) {
            reload_check(&m, now);
            if (m.next_n > 0) {
                wake = ric_min(wake, m.next_deadline);
            }
            if (m.upgrade_pid > 0 && now >= m.upgrade_deadline) {
                kill(m.upgrade_pid, SIGTERM);
                drain_add(&m, m.upgrade_pid); /* reaped as any old worker */
                upgrade_failed(&m, "the new binary's workers did not start serving in time", 1);
            } else if (m.upgrade_pid > 0) {
                wake = ric_min(wake, m.upgrade_deadline);
            }
            if (m.sweep && m.ndraining == 0 && m.next_n == 0 && m.upgrade_pid == 0) {
                master_sweep(&m);
            }
            if (m.again && m.next_n == 0 && m.upgrade_pid == 0 && !m.handed_over) {
                /* asked while another ran: once more, with the file as it is now */
                m.again = 0;
                memcpy(m.askers, m.waiting, (size_t) m.nwaiting * sizeof(pid_t));
                m.naskers = m.nwaiting;
                m.nwaiting = 0;
                reload_begin(&m, 0);
            }
            for (i = 0, ready = 0; i < m.n && !m.told_ready; i++) {
                ready += m.slots[i].ready;
            }
            if (!m.told_ready && ready == m.n) {
                /* every worker serves: systemd hears it (the main process is this
                 * one, also after an upgrade), and an upgrade's old master may go */
                m.told_ready = 1;
                sd_notifyf(0, "MAINPID=%d\nREADY=1\nSTATUS=ricochet/%s serving: %d worker%s",
                           (int) getpid(), RIC_VERSION, m.n, m.n == 1 ? "" : "s");
                if (m.old_master > 0) {
                    kill(m.old_master, RIC_SIG_UPGRADED);
                    m.old_master = 0;
                }
            }
        } else {
            if (master_alive(&m) == 0) {
                break;
            }
            if (now >= kill_at) {
                ric_log_error(RIC_LOG_WARN, 0, "workers did not stop in time: killing them");
                master_signal_all(&m, SIGKILL);
                kill_at = now + 1000;
            }
            wake = ric_min(wake, kill_at);
        }

        wake = ric_max(wake, now);
        ts.tv_sec = (time_t) ((wake - now) / 1000);
        ts.tv_nsec = (long) ((wake - now) % 1000) * 1000000;
        sig = sigtimedwait(&set, &info, &ts);
        if (sig == RIC_SIG_WORKER_READY) {
            mark_ready(&m, info.si_pid);
            continue;
        }
        if (sig == RIC_SIG_RELOAD || sig == RIC_SIG_UPGRADE) {
            /* a -s reload or -s upgrade: queued, so none is lost, and it waits to be told */
            if (stopping != RUNNING || m.handed_over) {
                reply_one(&m, info.si_pid, 0, "refused: the master is stopping");
            } else if (sig == RIC_SIG_RELOAD) {
                reload_begin(&m, info.si_pid);
            } else {
                upgrade_begin(&m, info.si_pid);
            }
            continue;
        }
        if (sig == RIC_SIG_UPGRADED && info.si_pid == m.upgrade_pid && m.upgrade_pid > 0) {
            char line[128];

            snprintf(line, sizeof(line), "upgraded: the new binary's master %d serves; this one "
                     "(%d) stops gracefully", (int) m.upgrade_pid, (int) getpid());
            ric_log_error(RIC_LOG_NOTICE, 0, "%s", line);
            reload_reply(&m, 1, line);
            m.upgrade_pid = 0;
            m.handed_over = 1;
            ric_metrics_instance->handed_over = 1; /* the new one answers the admin address */
            ric_metrics_instance->stopping = 1;    /* this instance goes: not ready */
            for (i = 0; i < m.nwaiting; i++) {
                reply_one(&m, m.waiting[i], 0, "reload refused: the binary was upgraded meanwhile; "
                          "the new master read the configuration as it started");
            }
            m.nwaiting = 0;
            m.again = 0;
            has_pid = 0; /* the pid file is the new master's */
            if (strcmp(pid_path, "off") != 0) {
                char old[4200];

                snprintf(old, sizeof(old), "%s.oldbin", pid_path);
                unlink(old);
            }
            sig = SIGQUIT; /* and drain, as a graceful stop does */
        }
        switch (sig) {
        case SIGCHLD:
            master_reap(&m, stopping != RUNNING);
            break;
        case SIGTERM:
        case SIGINT:
            ric_log_error(RIC_LOG_NOTICE, 0, "signal %d received, stopping", sig);
            sd_notify(0, "STOPPING=1");
            master_stopping(&m, SIGTERM);
            stopping = STOP_FAST;
            master_signal_all(&m, SIGTERM);
            kill_at = ric_now_ms() + FAST_STOP_GRACE_MS;
            break;
        case SIGQUIT:
            ric_log_error(RIC_LOG_NOTICE, 0, "signal %d received, shutting down gracefully",
                          sig);
            if (!m.handed_over) {
                sd_notify(0, "STOPPING=1"); /* (after an upgrade, the new master is the service) */
            }
            master_stopping(&m, SIGQUIT);
            if (stopping == RUNNING) {
                stopping = STOP_GRACEFUL;
                kill_at = ric_now_ms() + m.conf->worker_shutdown_timeout + FAST_STOP_GRACE_MS;
                /* new clients are refused at once and can go elsewhere,
                 * instead of waiting in a backlog nobody will accept */
                close_listeners();
            }
            master_signal_all(&m, SIGQUIT);
            break;
        case SIGUSR2:
            if (stopping == RUNNING) {
                upgrade_begin(&m, info.si_code == SI_QUEUE
                                      && info.si_value.sival_int == RIC_RELOAD_ASK
                                      ? info.si_pid : 0);
            }
            break;
        case SIGHUP:
            if (stopping == RUNNING && !m.handed_over) {
                /* a -s reload says who it is, and waits for the outcome */
                reload_begin(&m, info.si_code == SI_QUEUE
                                     && info.si_value.sival_int == RIC_RELOAD_ASK
                                     ? info.si_pid : 0);
            }
            break;
        case SIGUSR1:
            ric_log_reopen();
            ric_log_error(RIC_LOG_NOTICE, 0, "reopened the error log; telling the workers");
            master_signal_all(&m, SIGUSR1);
            break;
        }
    }

    if (has_pid) {
        pid_file_remove(pid_path);
    }
    ric_log_error(RIC_LOG_NOTICE, 0, "exit");
    free(m.slots);
    free(m.draining);
    *confp = m.conf;
    return 0;
}

/* Whether a master holds the pid file (its lock, write_pid_file's). */
static int
pid_file_held(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC), held;

    if (fd == -1) {
        return 0;
    }
    held = flock(fd, LOCK_SH | LOCK_NB) == -1 && errno == EWOULDBLOCK;
    close(fd);
    return held;
}

/* -s reload and -s upgrade: SIGHUP or SIGUSR2, queued with RIC_RELOAD_ASK,
 * then the master's word. */
static int
reload_and_wait(const ric_conf_t *conf, pid_t pid, int how)
{
    char path[4200], line[1400];
    union sigval v;
    sigset_t set;
    siginfo_t info;
    struct timespec ts;
    int64_t deadline = ric_now_ms() + RIC_RELOAD_WAIT_MS, left;
    ssize_t n;
    int fd, sig;

    snprintf(path, sizeof(path), "%s.reload.%d", conf->pid_path, (int) getpid());
    unlink(path);
    sigemptyset(&set);
    sigaddset(&set, RIC_SIG_RELOADED);
    sigprocmask(SIG_BLOCK, &set, NULL);
    v.sival_int = RIC_RELOAD_ASK;
    if (sigqueue(pid, how == SIGHUP ? RIC_SIG_RELOAD : RIC_SIG_UPGRADE, v) == -1) {
        fprintf(stderr, "ricochet: cannot signal the master %ld: %s\n", (long) pid,
                strerror(errno));
        return 1;
    }
    for (;;) {
        left = deadline - ric_now_ms();
        if (left <= 0) {
            fprintf(stderr, "ricochet: the master %ld did not say within %d s whether the %s "
                    "took; see its error log\n", (long) pid, RIC_RELOAD_WAIT_MS / 1000,
                    how == SIGHUP ? "reload" : "upgrade");
            return 1;
        }
        ts.tv_sec = (time_t) (left / 1000);
        ts.tv_nsec = (long) (left % 1000) * 1000000;
        sig = sigtimedwait(&set, &info, &ts);
        if (sig == RIC_SIG_RELOADED && info.si_pid == pid) {
            break;
        }
    }
    line[0] = '\0';
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd != -1) {
        n = read(fd, line, sizeof(line) - 1);
        line[n > 0 ? n : 0] = '\0';
        close(fd);
        unlink(path);
    }
    if (info.si_value.sival_int == 0) {
        printf("ricochet: %s\n", line[0] ? line : "reloaded");
        return 0;
    }
    fprintf(stderr, "ricochet: %s\n", line[0] ? line : "reload refused; see the error log");
    return 1;
}

int
ric_process_signal(ric_conf_t *conf, const char *name)
{
    static const struct { const char *name; int sig; } names[] = {
        { "stop", SIGTERM }, { "quit", SIGQUIT }, { "reopen", SIGUSR1 }, { "reload", SIGHUP },
        { "upgrade", SIGUSR2 }
    };
    size_t i;
    long pid;

    for (i = 0; i < ric_nelems(names) && strcmp(names[i].name, name) != 0; i++) {
    }
    if (i == ric_nelems(names)) {
        fprintf(stderr, "ricochet: invalid option: \"-s %s\"; expected stop, quit, reopen, "
                "reload or upgrade\n", name);
        return 1;
    }
    if (strcmp(conf->pid_path, "off") == 0) {
        fprintf(stderr, "ricochet: %s: no pid file; set the \"pid\" directive to use -s\n",
                conf->file);
        return 1;
    }
    pid = pid_file_read(conf->pid_path);
    if (pid == -1) {
        char old[4200];
        struct stat st;

        snprintf(old, sizeof(old), "%s.oldbin", conf->pid_path);
        if (errno == ENOENT && stat(old, &st) == 0 && pid_file_held(old)) {
            fprintf(stderr, "ricochet: an upgrade is under way (\"%s\" names the old master): "
                    "ask again once it ends\n", old);
        } else {
            fprintf(stderr, "ricochet: cannot open the pid file \"%s\": %s (no master runs?)\n",
                    conf->pid_path, strerror(errno));
        }
        return 1;
    }
    if (pid == 0) {
        fprintf(stderr, "ricochet: invalid pid in \"%s\"\n", conf->pid_path);
        return 1;
    }
    if ((kill((pid_t) pid, 0) == -1 && errno == ESRCH) || !pid_file_held(conf->pid_path)) {
        fprintf(stderr, "ricochet: no master runs: the pid file \"%s\" names %ld, which is not "
                "a running ricochet master (a stale pid file)\n", conf->pid_path, pid);
        return 1;
    }
    if (names[i].sig == SIGHUP || names[i].sig == SIGUSR2) {
        return reload_and_wait(conf, (pid_t) pid, names[i].sig);
    }
    if (kill((pid_t) pid, names[i].sig) == -1) {
        fprintf(stderr, "ricochet: kill(%ld, %s) failed: %s\n", pid, name, strerror(errno));
        return 1;
    }
    return 0;
}
