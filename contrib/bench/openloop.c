/* openloop.c: an open-loop HTTP/1.1 load generator for contrib/bench/faults.sh.
 *
 * usage: openloop -r RATE -d SECONDS [-c MAXCONNS] [-t TIMEOUT_S] URL
 *
 * Request i is due at t0 + i / RATE, whatever happened to the earlier ones:
 * a timer issues every due request, on an idle keep-alive connection when
 * there is one, else on a new connection (at most MAXCONNS, default 4000,
 * open at once; a request due when all of them are busy is refused and
 * counted as a failure, never queued). After SECONDS no more are issued;
 * the answers still outstanding get until TIMEOUT_S (default 30) after
 * that, and the rest count as timeouts, as does any answer that took
 * longer than TIMEOUT_S. Latency runs from the time a request was due (not
 * when it was sent, so a late generator or a full connection count against
 * the server: no coordinated omission) to the last byte of its response.
 * Loopback only: the URL's host must be 127.0.0.1 or localhost.
 *
 * Output: a summary for people, then one line for scripts:
 * openloop: due=N sent=N refused=N done=N ok2xx=N non2xx=N errors=N
 *   timeouts=N p50_ms=X p99_ms=X max_ms=X maxconns=N peakconns=N opened=N
 * due = sent + refused, sent = done + errors + timeouts, done = ok2xx + non2xx.
 */
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/util.h>

#define MAX_LINE 16384 /* longest status, header or chunk-size line */

enum state { IDLE, STATUS, FIELDS, BODY_LEN, BODY_EOF, CHUNK_SIZE, CHUNK_DATA, CHUNK_END, TRAILERS };

struct conn {
    struct bufferevent *bev;
    struct conn *prev, *next; /* in the idle list, while listed */
    int listed, connected;
    enum state st;
    long req;                 /* the request in flight (its index), or -1 */
    int status;               /* of the response being read */
    int keep;                 /* the connection may carry another request */
    int chunked;
    long long len;            /* Content-Length (-1: none), then the bytes left */
};

static struct {
    struct event_base *base;
    struct event *tick;
    struct sockaddr_in addr;
    char request[1024];
    size_t request_len;
    double rate, duration, timeout, t0;
    long due, next;           /* requests due in all; the next one to issue */
    long outstanding;         /* sent, not yet answered */
    int maxconns, nconns, peak, draining;
    long opened;
    struct conn *idle;        /* idle connections, the most recently used first */
    double *lat;              /* latencies (ms) of the answers counted as done */
    long sent, refused, done, ok2xx, non2xx, timeouts;
    long err_connect, err_closed, err_protocol;
    double max_lag;           /* the latest the generator itself issued a request */
} g;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double due_at(long i)
{
    return g.t0 + i / g.rate;
}

static void check_finished(void)
{
    if (g.draining && g.outstanding == 0)
        event_base_loopbreak(g.base);
}

static void idle_push(struct conn *c)
{
    c->prev = NULL;
    c->next = g.idle;
    if (g.idle)
        g.idle->prev = c;
    g.idle = c;
    c->listed = 1;
}

static void idle_remove(struct conn *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        g.idle = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
    c->listed = 0;
}

/* Closes c; a request still in flight on it fails, counted in *counter. */
static void conn_close(struct conn *c, long *counter)
{
    if (c->listed)
        idle_remove(c);
    if (c->req >= 0) {
        (*counter)++;
        g.outstanding--;
    }
    bufferevent_free(c->bev);
    free(c);
    g.nconns--;
    check_finished();
}

/* The response to c's request is complete: count it, then reuse or close c. */
static void finish(struct conn *c)
{
    double ms = (now() - due_at(c->req)) * 1000;
    if (ms > g.timeout * 1000) {
        g.timeouts++;
    } else {
        g.lat[g.done++] = ms;
        if (c->status >= 200 && c->status < 300)
            g.ok2xx++;
        else
            g.non2xx++;
    }
    g.outstanding--;
    c->req = -1;
    c->st = IDLE;
    /* bytes nobody asked for make the connection useless */
    if (!c->keep || evbuffer_get_length(bufferevent_get_input(c->bev)) > 0) {
        conn_close(c, NULL);
        return;
    }
    idle_push(c);
    check_finished();
}

/* Whether the comma-separated list value holds token (any case). */
static int has_token(const char *value, const char *token)
{
    size_t n = strlen(token);
    for (const char *p = value; *p;) {
        while (*p == ' ' || *p == '\t' || *p == ',')
            p++;
        const char *e = p;
        while (*e && *e != ',')
            e++;
        const char *t = e;
        while (t > p && (t[-1] == ' ' || t[-1] == '\t'))
            t--;
        if ((size_t)(t - p) == n && strncasecmp(p, token, n) == 0)
            return 1;
        p = e;
    }
    return 0;
}

/* One header field; 0 when it makes the response unreadable. */
static int field(struct conn *c, char *line)
{
    char *colon = strchr(line, ':');
    if (!colon || colon == line)
        return 0;
    *colon = '\0';
    char *v = colon + 1;
    while (*v == ' ' || *v == '\t')
        v++;
    if (strcasecmp(line, "Content-Length") == 0) {
        char *end;
        errno = 0;
        long long n = strtoll(v, &end, 10);
        while (*end == ' ' || *end == '\t')
            end++;
        if (*v < '0' || *v > '9' || *end || errno || (c->len >= 0 && c->len != n))
            return 0;
        c->len = n;
    } else if (strcasecmp(line, "Transfer-Encoding") == 0) {
        /* chunked wins over Content-Length; another coding runs to the close */
        c->chunked = has_token(v, "chunked");
        if (!c->chunked)
            c->keep = 0;
    } else if (strcasecmp(line, "Connection") == 0) {
        if (has_token(v, "close"))
            c->keep = 0;
        else if (has_token(v, "keep-alive"))
            c->keep = 1;
    }
    return 1;
}

/* Reads what has arrived on c; 0 on a protocol error. c may be gone after. */
static int parse(struct conn *c, struct evbuffer *in)
{
    for (;;) {
        if (c->st == IDLE)
            return evbuffer_get_length(in) == 0;
        if (c->st == BODY_LEN || c->st == CHUNK_DATA || c->st == BODY_EOF) {
            size_t have = evbuffer_get_length(in);
            size_t n = c->st == BODY_EOF || (long long)have < c->len ? have : (size_t)c->len;
            evbuffer_drain(in, n);
            if (c->st == BODY_EOF)
                return 1; /* it ends at the close */
            c->len -= n;
            if (c->len > 0)
                return 1;
            if (c->st == BODY_LEN) {
                finish(c);
                return 1;
            }
            c->st = CHUNK_END;
            continue;
        }
        size_t n;
        char *line = evbuffer_readln(in, &n, EVBUFFER_EOL_CRLF);
        if (!line)
            return evbuffer_get_length(in) <= MAX_LINE;
        int ok = 1;
        switch (c->st) {
        case STATUS: {
            int minor = 0;
            if (n == 0)
                break; /* an empty line before the status line is tolerated */
            ok = sscanf(line, "HTTP/1.%d %3d", &minor, &c->status) == 2 && c->status >= 100;
            c->keep = minor >= 1;
            c->chunked = 0;
            c->len = -1;
            c->st = FIELDS;
            break;
        }
        case FIELDS:
            if (n > 0) {
                ok = field(c, line);
                break;
            }
            if (c->status < 200) {
                c->st = STATUS; /* an interim answer: the real one follows */
                break;
            }
            if (c->status == 204 || c->status == 304) {
                free(line);
                finish(c); /* no body */
                return 1;
            }
            c->st = c->chunked ? CHUNK_SIZE : c->len >= 0 ? BODY_LEN : BODY_EOF;
            if (c->st == BODY_EOF)
                c->keep = 0;
            break;
        case CHUNK_SIZE: {
            char *end;
            errno = 0;
            c->len = strtoll(line, &end, 16);
            ok = end != line && !errno && c->len >= 0 &&
                 (*end == '\0' || *end == ';' || *end == ' ' || *end == '\t');
            c->st = c->len == 0 ? TRAILERS : CHUNK_DATA;
            break;
        }
        case CHUNK_END:
            ok = n == 0;
            c->st = CHUNK_SIZE;
            break;
        case TRAILERS:
            if (n == 0) {
                free(line);
                finish(c);
                return 1;
            }
            break;
        default:
            ok = 0;
        }
        free(line);
        if (!ok)
            return 0;
    }
}

static void on_read(struct bufferevent *bev, void *arg)
{
    struct conn *c = arg;
    if (!parse(c, bufferevent_get_input(bev)))
        conn_close(c, &g.err_protocol);
}

static void on_event(struct bufferevent *bev, short what, void *arg)
{
    struct conn *c = arg;
    (void)bev;
    if (what & BEV_EVENT_CONNECTED) {
        c->connected = 1;
        return;
    }
    if (c->st == BODY_EOF && (what & BEV_EVENT_EOF)) {
        finish(c); /* the body ran to the close; keep is 0: finish closes c */
        return;
    }
    /* a failed connect, a close or a reset: fatal to a request in flight */
    conn_close(c, c->connected ? &g.err_closed : &g.err_connect);
}

/* A new connection to the target, connecting; NULL when the connect failed at once. */
static struct conn *conn_new(void)
{
    int one = 1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return NULL;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct conn *c = calloc(1, sizeof *c);
    if (!c || (connect(fd, (struct sockaddr *)&g.addr, sizeof g.addr) < 0 && errno != EINPROGRESS)) {
        free(c);
        close(fd);
        return NULL;
    }
    c->bev = bufferevent_socket_new(g.base, fd, BEV_OPT_CLOSE_ON_FREE);
    if (!c->bev) {
        free(c);
        close(fd);
        return NULL;
    }
    /* no address: the socket is connecting already, report when it is done */
    bufferevent_socket_connect(c->bev, NULL, 0);
    bufferevent_setcb(c->bev, on_read, NULL, on_event, c);
    bufferevent_enable(c->bev, EV_READ | EV_WRITE);
    c->req = -1;
    g.opened++;
    if (++g.nconns > g.peak)
        g.peak = g.nconns;
    return c;
}

/* Request i is due: on an idle connection, else on a new one, else refused. */
static void issue(long i)
{
    struct conn *c = g.idle;
    if (c) {
        idle_remove(c);
    } else if (g.nconns >= g.maxconns) {
        g.refused++;
        return;
    } else if (!(c = conn_new())) {
        g.sent++;
        g.err_connect++;
        return;
    }
    g.sent++;
    g.outstanding++;
    c->req = i;
    c->st = STATUS;
    bufferevent_write(c->bev, g.request, g.request_len);
}

/* Issues every request due by now, then sleeps until the next one; once all
 * are out, it waits for the outstanding answers until the deadline. */
static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what, (void)arg;
    if (g.draining) {
        event_base_loopbreak(g.base); /* the deadline */
        return;
    }
    double t;
    while (g.next < g.due && due_at(g.next) <= (t = now())) {
        if (t - due_at(g.next) > g.max_lag)
            g.max_lag = t - due_at(g.next);
        issue(g.next++);
    }
    double wait;
    if (g.next < g.due) {
        wait = due_at(g.next) - now();
    } else {
        g.draining = 1;
        wait = g.t0 + g.duration + g.timeout - now();
    }
    struct timeval tv;
    wait = wait > 0 ? wait : 0;
    tv.tv_sec = (time_t)wait;
    tv.tv_usec = (suseconds_t)((wait - tv.tv_sec) * 1e6);
    evtimer_add(g.tick, &tv);
    check_finished();
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The nearest-rank percentile p of the sorted latencies; 0 without any. */
static double pct(double p)
{
    if (g.done == 0)
        return 0;
    long k = (long)ceil(p / 100 * g.done);
    return g.lat[k < 1 ? 0 : k - 1];
}

static void usage(void)
{
    fprintf(stderr, "usage: openloop -r RATE -d SECONDS [-c MAXCONNS] [-t TIMEOUT_S] URL\n"
                    "  GETs URL (http://127.0.0.1 or localhost only) RATE times a second for SECONDS,\n"
                    "  on at most MAXCONNS connections (4000); waits up to TIMEOUT_S (30) for answers\n");
    exit(2);
}

static double number(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v > 0) || !isfinite(v))
        usage();
    return v;
}

/* Sets g.addr and the request from URL; exits when it is not a loopback http URL. */
static void target(const char *url)
{
    struct evhttp_uri *u = evhttp_uri_parse(url);
    const char *scheme = u ? evhttp_uri_get_scheme(u) : NULL, *host = u ? evhttp_uri_get_host(u) : NULL;
    if (!scheme || strcmp(scheme, "http") != 0 || !host) {
        fprintf(stderr, "openloop: want an http:// URL, not %s\n", url);
        exit(2);
    }
    if (strcmp(host, "127.0.0.1") != 0 && strcasecmp(host, "localhost") != 0) {
        fprintf(stderr, "openloop: %s is not loopback: only 127.0.0.1 and localhost are allowed\n", host);
        exit(2);
    }
    int port = evhttp_uri_get_port(u) > 0 ? evhttp_uri_get_port(u) : 80;
    const char *path = evhttp_uri_get_path(u), *query = evhttp_uri_get_query(u);
    int n = snprintf(g.request, sizeof g.request,
                     "GET %s%s%s HTTP/1.1\r\nHost: %s:%d\r\nUser-Agent: openloop\r\n\r\n",
                     path && *path ? path : "/", query ? "?" : "", query ? query : "", host, port);
    if (n < 0 || (size_t)n >= sizeof g.request) {
        fprintf(stderr, "openloop: the URL is too long\n");
        exit(2);
    }
    g.request_len = (size_t)n;
    g.addr.sin_family = AF_INET;
    g.addr.sin_port = htons((uint16_t)port);
    g.addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    evhttp_uri_free(u);
}

int main(int argc, char **argv)
{
    int opt;
    g.maxconns = 4000;
    g.timeout = 30;
    while ((opt = getopt(argc, argv, "r:d:c:t:")) != -1) {
        switch (opt) {
        case 'r': g.rate = number(optarg); break;
        case 'd': g.duration = number(optarg); break;
        case 'c': g.maxconns = (int)number(optarg); break;
        case 't': g.timeout = number(optarg); break;
        default: usage();
        }
    }
    if (optind != argc - 1 || g.rate == 0 || g.duration == 0 || g.maxconns < 1)
        usage();
    target(argv[optind]);
    g.due = (long)floor(g.rate * g.duration + 1e-9);
    if (g.due < 1 || !(g.lat = malloc(g.due * sizeof *g.lat))) {
        fprintf(stderr, "openloop: cannot run %.0f requests\n", g.rate * g.duration);
        exit(2);
    }

    /* one descriptor a connection, and a few to spare */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rlim_t want = (rlim_t)g.maxconns + 64;
        rl.rlim_cur = rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want ? rl.rlim_max : want;
        setrlimit(RLIMIT_NOFILE, &rl);
        if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < want) {
            fprintf(stderr, "openloop: only %ld descriptors: at most %ld connections\n",
                    (long)rl.rlim_cur, (long)rl.rlim_cur - 64);
            g.maxconns = (int)rl.rlim_cur - 64;
            if (g.maxconns < 1)
                exit(1);
        }
    }
    signal(SIGPIPE, SIG_IGN);

    struct event_config *cfg = event_config_new();
    event_config_set_flag(cfg, EVENT_BASE_FLAG_PRECISE_TIMER);
    g.base = event_base_new_with_config(cfg);
    event_config_free(cfg);
    if (!g.base || !(g.tick = evtimer_new(g.base, on_tick, NULL))) {
        fprintf(stderr, "openloop: cannot set up libevent\n");
        exit(1);
    }
    g.t0 = now();
    on_tick(-1, 0, NULL);
    event_base_dispatch(g.base);
    double took = now() - g.t0;
    g.timeouts += g.outstanding; /* never answered (connections left to exit) */

    qsort(g.lat, g.done, sizeof *g.lat, cmp_double);
    long errors = g.err_connect + g.err_closed + g.err_protocol;
    printf("openloop: %s at %g/s for %g s: %ld requests due, up to %d connections, %g s timeout\n",
           argv[optind], g.rate, g.duration, g.due, g.maxconns, g.timeout);
    printf("  sent %ld, refused at the connection limit %ld; the generator was at most %.2f ms late\n",
           g.sent, g.refused, g.max_lag * 1000);
    printf("  answered in time %ld: 2xx %ld, other %ld; errors %ld (connect %ld, closed %ld, protocol %ld); "
           "timeouts %ld\n",
           g.done, g.ok2xx, g.non2xx, errors, g.err_connect, g.err_closed, g.err_protocol, g.timeouts);
    printf("  latency from the due time, over the answers in time: p50 %.2f ms, p90 %.2f ms, p99 %.2f ms, "
           "p99.9 %.2f ms, max %.2f ms\n",
           pct(50), pct(90), pct(99), pct(99.9), pct(100));
    printf("  connections: %ld opened, at most %d open at once; %.2f s in all\n", g.opened, g.peak, took);
    printf("openloop: due=%ld sent=%ld refused=%ld done=%ld ok2xx=%ld non2xx=%ld errors=%ld timeouts=%ld "
           "p50_ms=%.3f p99_ms=%.3f max_ms=%.3f maxconns=%d peakconns=%d opened=%ld\n",
           g.due, g.sent, g.refused, g.done, g.ok2xx, g.non2xx, errors, g.timeouts, pct(50), pct(99),
           pct(100), g.maxconns, g.peak, g.opened);
    return 0;
}
