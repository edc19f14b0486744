/* process.c: the master: binds listeners, forks workers, replaces dead ones, handles signals. */
#include "io.h"
#include "process.h"
#include "log.h"
#include "worker.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LISTEN_BACKLOG 511
#define RESPAWN_MIN_INTERVAL_MS 1000 /* a worker that keeps dying restarts at most this often */
#define FAST_STOP_GRACE_MS 5000      /* after SIGTERM, workers get this long before SIGKILL */

typedef struct {
    pid_t pid;          /* 0: the slot is empty */
    int64_t started_ms;
    int64_t respawn_at; /* when an empty slot is to be filled; 0: now */
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
socket_open(const ric_listener_t *ls)
{
    const char *what;
    int fd = ric_io_listen((const struct sockaddr *) &ls->addr, ls->addrlen, LISTEN_BACKLOG, &what);

    if (fd == -1) {
        ric_log_error(RIC_LOG_EMERG, errno, "%s() %s %s failed", what,
                      what[0] == 's' ? "for" : what[0] == 'b' ? "to" : "on", ls->text);
    }
    return fd;
}

int
ric_process_bind(ric_conf_t *conf)
{
    listen_socket_t *s, *known = sockets;
    ric_listener_t *ls;
    int fd;

    for (ls = conf->listeners; ls; ls = ls->next) {
        s = socket_find(&ls->addr, ls->addrlen);
        if (s == NULL) {
            fd = socket_open(ls);
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
}

static pid_t
spawn_worker(ric_conf_t *conf, worker_slot_t *slot)
{
    sigset_t set;
    pid_t master = getpid(), pid;

    pid = fork();
    if (pid == -1) {
        ric_log_error(RIC_LOG_ALERT, errno, "fork() failed while spawning a worker");
        return -1;
    }
    if (pid == 0) {
        /* the worker must die with the master, even when the master is killed */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != master) {
            _exit(0);
        }
        signal(SIGHUP, SIG_IGN);
        signal(SIGPIPE, SIG_IGN);
        sigemptyset(&set);
        sigprocmask(SIG_SETMASK, &set, NULL);
        exit(ric_worker_run(conf));
    }
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

static void
reap_workers(worker_slot_t *slots, int n, int stopping)
{
    pid_t pid;
    int status, i;
    int64_t now;

    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
        for (i = 0; i < n && slots[i].pid != pid; i++) {
        }
        if (i == n) {
            continue;
        }
        slots[i].pid = 0;
        if (stopping && WIFEXITED(status) && WEXITSTATUS(status) == 0) {
            ric_log_error(RIC_LOG_NOTICE, 0, "worker process %d exited", (int) pid);
            continue;
        }
        if (WIFSIGNALED(status)) {
            ric_log_error(RIC_LOG_ALERT, 0, "worker process %d exited on signal %d",
                          (int) pid, WTERMSIG(status));
        } else {
            ric_log_error(RIC_LOG_ALERT, 0, "worker process %d exited with code %d",
                          (int) pid, WEXITSTATUS(status));
        }
        if (stopping) {
            continue;
        }
        now = ric_now_ms();
        slots[i].respawn_at = now - slots[i].started_ms < RESPAWN_MIN_INTERVAL_MS
                                  ? slots[i].started_ms + RESPAWN_MIN_INTERVAL_MS
                                  : now;
    }
}

static int
write_pid_file(const char *path)
{
    char buf[32];
    int fd, n;

    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd == -1) {
        ric_log_error(RIC_LOG_EMERG, errno, "cannot write the pid file \"%s\"", path);
        return RIC_ERROR;
    }
    n = snprintf(buf, sizeof(buf), "%d\n", (int) getpid());
    if (write(fd, buf, (size_t) n) != n) {
        ric_log_error(RIC_LOG_EMERG, errno, "cannot write the pid file \"%s\"", path);
        close(fd);
        return RIC_ERROR;
    }
    close(fd);
    return RIC_OK;
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

int
ric_process_master(ric_conf_t *conf)
{
    enum { RUNNING, STOP_FAST, STOP_GRACEFUL } stopping = RUNNING;
    int n = (int) conf->worker_processes, i, sig, has_pid = strcmp(conf->pid_path, "off") != 0;
    worker_slot_t *slots = ric_xcalloc((size_t) n, sizeof(*slots));
    int64_t now, kill_at = 0, wake;
    struct timespec ts;
    sigset_t set;
    siginfo_t info;

    master_signals(&set);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (conf->daemon && daemonize() != RIC_OK) {
        free(slots);
        return 1;
    }
    if (has_pid && write_pid_file(conf->pid_path) != RIC_OK) {
        free(slots);
        return 1;
    }
    ric_log_stderr_too = 0; /* start-up is over: the error log alone from here */
    for (i = 0; i < n; i++) {
        spawn_worker(conf, &slots[i]);
    }
    ric_log_error(RIC_LOG_NOTICE, 0, "ricochet/%s started: master %d, %d worker%s", RIC_VERSION,
                  (int) getpid(), n, n == 1 ? "" : "s");

    for (;;) {
        now = ric_now_ms();
        wake = now + 1000;
        for (i = 0; i < n && stopping == RUNNING; i++) {
            if (slots[i].pid == 0) {
                if (slots[i].respawn_at <= now) {
                    spawn_worker(conf, &slots[i]);
                } else {
                    wake = ric_min(wake, slots[i].respawn_at);
                }
            }
        }
        if (stopping != RUNNING) {
            if (workers_alive(slots, n) == 0) {
                break;
            }
            if (now >= kill_at) {
                ric_log_error(RIC_LOG_WARN, 0, "workers did not stop in time: killing them");
                signal_workers(slots, n, SIGKILL);
                kill_at = now + 1000;
            }
            wake = ric_min(wake, kill_at);
        }

        ts.tv_sec = (time_t) ((wake - now) / 1000);
        ts.tv_nsec = (long) ((wake - now) % 1000) * 1000000;
        sig = sigtimedwait(&set, &info, &ts);
        switch (sig) {
        case SIGCHLD:
            reap_workers(slots, n, stopping != RUNNING);
            break;
        case SIGTERM:
        case SIGINT:
            ric_log_error(RIC_LOG_NOTICE, 0, "signal %d received, stopping", sig);
            stopping = STOP_FAST;
            signal_workers(slots, n, SIGTERM);
            kill_at = ric_now_ms() + FAST_STOP_GRACE_MS;
            break;
        case SIGQUIT:
            ric_log_error(RIC_LOG_NOTICE, 0, "signal %d received, shutting down gracefully",
                          sig);
            if (stopping == RUNNING) {
                stopping = STOP_GRACEFUL;
                kill_at = ric_now_ms() + conf->worker_shutdown_timeout + FAST_STOP_GRACE_MS;
                /* new clients are refused at once and can go elsewhere,
                 * instead of waiting in a backlog nobody will accept */
                close_listeners();
            }
            signal_workers(slots, n, SIGQUIT);
            break;
        case SIGHUP:
            ric_log_error(RIC_LOG_NOTICE, 0, "SIGHUP received: configuration reload is not "
                          "available in this version; the running configuration stays");
            break;
        case SIGUSR1:
            ric_log_reopen();
            ric_log_error(RIC_LOG_NOTICE, 0, "reopened the error log; telling the workers");
            signal_workers(slots, n, SIGUSR1);
            break;
        }
    }

    if (has_pid) {
        unlink(conf->pid_path);
    }
    ric_log_error(RIC_LOG_NOTICE, 0, "exit");
    free(slots);
    return 0;
}

int
ric_process_signal(ric_conf_t *conf, const char *name)
{
    static const struct { const char *name; int sig; } names[] = {
        { "stop", SIGTERM }, { "quit", SIGQUIT }, { "reopen", SIGUSR1 }, { "reload", SIGHUP }
    };
    char buf[32];
    ssize_t n;
    size_t i;
    long pid;
    int fd;

    for (i = 0; i < ric_nelems(names) && strcmp(names[i].name, name) != 0; i++) {
    }
    if (i == ric_nelems(names)) {
        fprintf(stderr, "ricochet: invalid option: \"-s %s\"; expected stop, quit or reopen\n",
                name);
        return 1;
    }
    if (strcmp(name, "reload") == 0) {
        fprintf(stderr, "ricochet: reload is not available in this version\n");
        return 1;
    }
    if (strcmp(conf->pid_path, "off") == 0) {
        fprintf(stderr, "ricochet: %s: no pid file; set the \"pid\" directive to use -s\n",
                conf->file);
        return 1;
    }
    fd = open(conf->pid_path, O_RDONLY | O_CLOEXEC);
    if (fd == -1) {
        fprintf(stderr, "ricochet: cannot open the pid file \"%s\": %s\n", conf->pid_path,
                strerror(errno));
        return 1;
    }
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    buf[n > 0 ? n : 0] = '\0';
    pid = strtol(buf, NULL, 10);
    if (pid <= 0) {
        fprintf(stderr, "ricochet: invalid pid in \"%s\"\n", conf->pid_path);
        return 1;
    }
    if (kill((pid_t) pid, names[i].sig) == -1) {
        fprintf(stderr, "ricochet: kill(%ld, %s) failed: %s\n", pid, name, strerror(errno));
        return 1;
    }
    return 0;
}
