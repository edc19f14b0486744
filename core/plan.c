/* plan.c: prints each route's wait windows, worst case and impossible attempts against retry_timeout. */
#include "plan.h"
#include "idem.h"
#include "idem_store.h"
#include "backoff.h"
#include "budget.h"
#include "retry.h"

#include <strings.h>

#define PLAN_UNBOUNDED_SHOWN 10 /* retries listed when retry_attempts is 0 */
#define PLAN_LISTED 20          /* longer schedules list this many, then the last */

static const char *
fmt_ms(int64_t ms, char *buf, size_t size)
{
    if ((ms % 1000 == 0 && ms >= 1000) || ms >= 100000) {
        snprintf(buf, size, "%llds", (long long) ((ms + 500) / 1000));
    } else if (ms >= 1000) {
        snprintf(buf, size, "%.3gs", (double) ms / 1000.0);
    } else {
        snprintf(buf, size, "%lldms", (long long) ms);
    }
    return buf;
}


/* The location's idempotency store, when it has one. */
static void
print_idempotency(const ric_server_conf_t *s, const ric_location_conf_t *l, FILE *out)
{
    const ric_http_settings_t *st = &l->settings;
    const ric_idem_store_conf_t *sc = l->refs.idempotency_store;
    const char *scope;
    char a[32], b[32];
    int i;

    if (sc == NULL || sc->kind == RIC_IDEM_STORE_OFF) {
        if (st->idempotency_required) {
            fprintf(out, "  idempotency: no store; a POST or PATCH without a key gets 400 "
                    "(idempotency_required)\n");
        }
        return;
    }
    fprintf(out, "  idempotency: keyed POST/PATCH deduped in %s (first named %s:%d); answers kept "
            "%s, a lock lapses %s after its gateway is gone; store unreachable: %s%s%s\n",
            sc->spec, sc->file, sc->line, fmt_ms(st->idempotency_ttl, a, sizeof(a)),
            fmt_ms(ric_max(st->idempotency_lock_ttl, st->retry_timeout), b, sizeof(b)),
            st->idempotency_store_failure == RIC_IDEM_FAIL_OPEN ? "passed on without dedupe"
                                                                : "503",
            st->idempotency_required ? "; a request without a key gets 400" : "",
            st->idempotency_key == RIC_IDEMPOTENCY_OFF ? "; sent POSTs are not retried (idempotency_key off)"
                                                : "");
    fprintf(out, "  idempotency records keyed by: server_name \"%s\", location %s%s",
            s->nnames > 0 ? s->names[0] : "", l->exact ? "= " : "", l->path);
    if (l->idem_route != NULL) {
        fprintf(out, ", %s (another route has that server_name and location)", l->idem_route);
    }
    fprintf(out, "; the client's scope; the key\n");
    scope = l->refs.idempotency_scope;
    if (scope == NULL || scope[0] == '\0') {
        fprintf(out, "  idempotency scope: off (every client of the route shares one key space)\n");
    } else if (strcmp(scope, "$remote_addr") == 0) {
        fprintf(out, "  idempotency scope: $remote_addr (a key is the client address's own)\n");
    } else {
        fprintf(out, "  idempotency scope: the %s field, hashed, when sent (clients with another "
                "%s never see each other's answers)%s\n", scope, scope,
                strcasecmp(scope, "Authorization") == 0
                    ? "; without it, every Cookie field, hashed; without both, none"
                    : "; without it, none");
    }
    fprintf(out, "  idempotency: answers not stored (the key is released):");
    for (i = 100; i < 500 && l->refs.idempotency_release != NULL; i++) {
        if (ric_retry_on_match(l->refs.idempotency_release, RIC_CLASS_STATUS, i)) {
            fprintf(out, " %d", i);
        }
    }
    fprintf(out, " 5xx, and no answer\n");
}

static void
print_route(const ric_server_conf_t *s, const ric_location_conf_t *l, FILE *out)
{
    const ric_http_settings_t *st = &l->settings;
    ric_backoff_t b;
    char a[32], c[32], d[32], e[32];
    int64_t lo, hi, earliest = 0, latest = 0, timeout = st->retry_timeout;
    int64_t per_try = ric_min(st->per_try_timeout, timeout);
    int n, attempts = (int) st->retry_attempts, shown, never = 0;

    b.initial_ms = st->retry_backoff_initial;
    b.max_ms = st->retry_backoff_max;
    b.factor = (double) st->retry_backoff_factor_milli / 1000.0;
    b.jitter = (ric_jitter_t) st->retry_backoff_jitter;

    fprintf(out, "location %s%s", l->exact ? "= " : "", l->path);
    if (s->nnames > 0 && s->names[0][0] != '\0') {
        fprintf(out, " (server %s)", s->names[0]);
    }
    fprintf(out, " -> upstream %s (%s:%d)\n", l->upstream->name, l->file, l->line);

    if (st->retries != 1 || ric_retry_killed) {
        fprintf(out, "  retries off%s: every request is one attempt of at most %s\n\n",
                ric_retry_killed ? " (RICOCHET_NO_RETRY=1 in the environment)" : "",
                fmt_ms(per_try, a, sizeof(a)));
        return;
    }
    fprintf(out, "  retry_attempts %d, retry_backoff %s %s %g jitter=%s adaptive=%s, per_try_timeout "
            "%s, retry_timeout %s\n", attempts, fmt_ms(b.initial_ms, a, sizeof(a)),
            fmt_ms(b.max_ms, c, sizeof(c)), b.factor, ric_backoff_jitter_name(b.jitter),
            st->retry_backoff_adaptive == 1 ? "on" : "off",
            fmt_ms(st->per_try_timeout, d, sizeof(d)), fmt_ms(timeout, e, sizeof(e)));
    if (st->retry_backoff_adaptive == 1) {
        fprintf(out, "  adaptive backoff (chosen by upstream %s's retries, shared by every worker): "
                "while the moving average of its recent retries' outcomes is at or above %d%% "
                "(failures look independent), a retry goes at once (\"fast\"); at or below %d%% "
                "(they look correlated: 34 failed retries in a row from a steady 30%% failure "
                "rate)%s, it waits as listed below (\"backoff\"); in between, a share of it "
                "(\"scaled\"). A 429 and a Retry-After above retry_after_max always wait as "
                "listed; a valid Retry-After or a script's delay is waited as given\n",
                l->upstream->name, RIC_BACKOFF_SCORE_FAST / 10, RIC_BACKOFF_SCORE_SLOW / 10,
                l->upstream->budget->kind == RIC_BUDGET_ADAPTIVE
                    ? ", or while its retry budget holds less than half of the tokens it starts with"
                    : "");
    } else {
        fprintf(out, "  adaptive=off: every retry waits as listed below\n");
    }
    fprintf(out, "  attempt 1: starts at once, lasts up to %s\n", fmt_ms(per_try, a, sizeof(a)));
    latest = per_try;

    shown = attempts > 0 ? attempts - 1 : PLAN_UNBOUNDED_SHOWN;
    for (n = 1; n <= shown; n++) {
        ric_backoff_range(&b, n, &lo, &hi);
        /* the earliest an attempt can start: every earlier one failed at
         * once and every wait was the shortest */
        earliest += lo;
        latest += hi;
        if (earliest >= timeout) {
            never++;
        }
        if (n > PLAN_LISTED && n < shown) {
            if (n == PLAN_LISTED + 1) {
                fprintf(out, "  ... %d more retries ...\n", shown - PLAN_LISTED - 1);
            }
            latest += per_try;
            continue;
        }
        if (b.jitter == RIC_JITTER_NONE) {
            fprintf(out, "  retry %d (attempt %d): wait %s", n, n + 1, fmt_ms(lo, a, sizeof(a)));
        } else {
            fprintf(out, "  retry %d (attempt %d): wait [%s, %s)", n, n + 1,
                    fmt_ms(lo, a, sizeof(a)), fmt_ms(hi, c, sizeof(c)));
        }
        fprintf(out, ", starts %s to %s after the request", fmt_ms(earliest, d, sizeof(d)),
                fmt_ms(latest, e, sizeof(e)));
        if (earliest >= timeout) {
            fprintf(out, "  -- can never happen: retry_timeout %s has passed\n",
                    fmt_ms(timeout, a, sizeof(a)));
        } else if (latest >= timeout) {
            fprintf(out, "  -- may be cut short by retry_timeout\n");
        } else {
            fprintf(out, "\n");
        }
        latest += per_try;
    }
    if (attempts == 0) {
        fprintf(out, "  ... and so on: with retry_attempts 0, attempts go on until retry_timeout\n"
                "  worst case: retry_timeout %s, the only bound\n", fmt_ms(timeout, a, sizeof(a)));
        fprintf(out, "\n");
        return;
    }
    fprintf(out, "  worst case: %s if every attempt times out and every wait is the longest; "
            "retry_timeout %s %s\n", fmt_ms(latest, a, sizeof(a)),
            fmt_ms(timeout, c, sizeof(c)),
            latest > timeout ? "ends it first" : "is never reached");
    if (never > 0) {
        fprintf(out, "  warning: %d of the %d retries can never happen within retry_timeout; "
                "lower retry_attempts or retry_backoff, or raise retry_timeout\n", never, shown);
    }
    print_idempotency(s, l, out);
    fprintf(out, "\n");
}

/* An upstream's budget rule, in words. */
static void
print_budget(const ric_upstream_conf_t *u, FILE *out)
{
    const ric_budget_conf_t *b = u->budget;
    char rule[64], where[512], a[32];

    if (b->file != NULL) {
        snprintf(where, sizeof(where), "%s:%d", b->file, b->line);
    } else {
        snprintf(where, sizeof(where), "the default");
    }
    fprintf(out, "upstream %s: retry_budget %s (%s), one budget shared by all workers\n", u->name,
            ric_budget_rule_text(b, rule, sizeof(rule)), where);
    switch (b->kind) {
    case RIC_BUDGET_ADAPTIVE:
        fprintf(out, "  a bucket of tokens: starts with %lld, holds at most %lld; an attempt answered "
                "well earns %g\n", (long long) ric_min(b->max_tokens,
                (int64_t) (RIC_BUDGET_START / RIC_BUDGET_MILLI)), (long long) b->max_tokens,
                (double) RIC_BUDGET_EARN / RIC_BUDGET_MILLI);
        fprintf(out, "  a retry pays %g token (%g after a timeout) when it is sent, refunded when it "
                "succeeds\n", (double) RIC_BUDGET_COST / RIC_BUDGET_MILLI,
                (double) RIC_BUDGET_COST_TIMEOUT / RIC_BUDGET_MILLI);
        fprintf(out, "  bucket empty: the retry waits and asks again (one goes unpaid every %dms, a "
                "probe) while the bucket was at least half full within the last %s, else it is "
                "refused (\"budget\")\n\n", RIC_BUDGET_PROBE_MS, fmt_ms(b->wait_ms, a, sizeof(a)));
        break;
    case RIC_BUDGET_RATIO:
        fprintf(out, "  retries in any 10 s <= max(%g%% of its requests, %lld)\n\n",
                b->ratio * 100.0, (long long) (b->min_per_sec * RIC_BUDGET_BUCKETS));
        break;
    default:
        fprintf(out, "  no budget: every retry the route allows is made\n\n");
    }
}

int
ric_plan_print(const ric_conf_t *conf, const char *filter, FILE *out)
{
    const ric_server_conf_t *s;
    const ric_location_conf_t *l;
    const ric_upstream_conf_t *u;
    int n = 0, used;

    if (conf->http == NULL) {
        return 0;
    }
    for (s = conf->http->servers; s; s = s->next) {
        for (l = s->locations; l; l = l->next) {
            if (l->upstream == NULL
                || (filter != NULL && strncmp(l->path, filter, strlen(filter)) != 0)) {
                continue;
            }
            print_route(s, l, out);
            n++;
        }
    }
    for (u = conf->http->upstreams; u && n > 0; u = u->next) {
        used = 0;
        for (s = conf->http->servers; s && !used; s = s->next) {
            for (l = s->locations; l && !used; l = l->next) {
                used = l->upstream == u
                       && (filter == NULL || strncmp(l->path, filter, strlen(filter)) == 0);
            }
        }
        if (used) {
            print_budget(u, out);
        }
    }
    return n;
}
