/* idem_route.c: what names a route in the idempotency store's record keys, so that two routes never share a record. */
#include "idem_route.h"
#include "conf.h"
#include "idem_store.h"

#include <stdio.h>

typedef struct {
    const ric_server_conf_t *server;
    ric_location_conf_t *location;
    char *listens; /* "listen A B", for a route that shares its name */
} route_t;

static int
keyed(const ric_location_conf_t *l)
{
    const ric_idem_store_conf_t *sc = l->refs.idempotency_store;

    return l->upstream != NULL && sc != NULL && sc->kind != RIC_IDEM_STORE_OFF;
}

static const char *
first_name(const ric_server_conf_t *s)
{
    return s->nnames > 0 ? s->names[0] : "";
}

/* What the record key has always named a route by: alike, two routes
 * would share their records. */
static int
same_name(const route_t *a, const route_t *b)
{
    return strcmp(first_name(a->server), first_name(b->server)) == 0
           && strcmp(a->location->path, b->location->path) == 0
           && a->location->exact == b->location->exact;
}

static int
by_text(const void *a, const void *b)
{
    return strcmp(*(const char *const *) a, *(const char *const *) b);
}

/* "listen A B": the server's addresses, sorted, so that the order of its
 * listen lines does not change its keys. */
static char *
listens_text(const ric_server_conf_t *s, ric_pool_t *pool)
{
    const ric_listen_t *l;
    const char **texts;
    size_t n = 0, len = sizeof("listen"), i, tlen;
    char *out, *p;

    for (l = s->listens; l; l = l->next) {
        n++;
        len += strlen(l->text) + 1;
    }
    texts = ric_xcalloc(n + 1, sizeof(*texts));
    n = 0;
    for (l = s->listens; l; l = l->next) {
        texts[n++] = l->text;
    }
    qsort(texts, n, sizeof(*texts), by_text);
    out = ric_palloc(pool, len);
    memcpy(out, "listen", sizeof("listen") - 1);
    p = out + sizeof("listen") - 1;
    for (i = 0; i < n; i++) {
        tlen = strlen(texts[i]);
        *p++ = ' ';
        memcpy(p, texts[i], tlen);
        p += tlen;
    }
    *p = '\0';
    free(texts);
    return out;
}

void
ric_idem_route_names(ric_http_conf_t *http, ric_pool_t *pool)
{
    const ric_server_conf_t *s;
    ric_location_conf_t *l;
    const ric_upstream_conf_t *u;
    route_t *routes;
    size_t n = 0, i, j;
    int tie;

    for (s = http->servers; s; s = s->next) {
        for (l = s->locations; l; l = l->next) {
            n += (size_t) keyed(l);
        }
    }
    routes = ric_xcalloc(n + 1, sizeof(*routes));
    n = 0;
    for (s = http->servers; s; s = s->next) {
        for (l = s->locations; l; l = l->next) {
            if (keyed(l)) {
                routes[n].server = s;
                routes[n++].location = l;
            }
        }
    }
    for (i = 0; i < n; i++) {
        for (j = 0; j < n && routes[i].listens == NULL; j++) {
            if (j != i && same_name(&routes[i], &routes[j])) {
                routes[i].listens = listens_text(routes[i].server, pool);
            }
        }
    }
    for (i = 0; i < n; i++) {
        if (routes[i].listens == NULL) {
            continue; /* alone under its name: the key it always had */
        }
        tie = 0;
        for (j = 0; j < n && !tie; j++) {
            tie = j != i && routes[j].listens != NULL && same_name(&routes[i], &routes[j])
                  && strcmp(routes[i].listens, routes[j].listens) == 0;
        }
        l = routes[i].location;
        if (!tie) {
            l->idem_route = routes[i].listens;
            continue;
        }
        /* unnamed servers on the same addresses: what they proxy to tells
         * them apart (alike in that too, they are one route) */
        u = l->upstream;
        l->idem_route = ric_palloc(pool, strlen(routes[i].listens) + strlen(u->name)
                                             + sizeof(" upstream https://"));
        sprintf(l->idem_route, "%s upstream %s%s", routes[i].listens,
                u->tls ? "https://" : "http://", u->name);
    }
    free(routes);
}
