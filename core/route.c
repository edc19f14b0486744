/* route.c: server selection by Host and location matching by path. */
#include "route.h"

/* Lowercased host without port or trailing dot, into buf; returns its length. */
static size_t
normalize_host(ric_str_t host, char *buf, size_t size)
{
    size_t n = host.len, i;

    if (n > 0 && host.data[0] == '[') {
        /* IPv6 literal: keep up to the bracket */
        const u_char *end = memchr(host.data, ']', n);
        n = end ? (size_t) (end - host.data) + 1 : n;
    } else {
        const u_char *colon = memchr(host.data, ':', n);
        n = colon ? (size_t) (colon - host.data) : n;
    }
    if (n > 0 && host.data[n - 1] == '.') {
        n--;
    }
    if (n >= size) {
        return 0;
    }
    for (i = 0; i < n; i++) {
        u_char ch = host.data[i];
        buf[i] = (char) ((ch >= 'A' && ch <= 'Z') ? ch | 0x20 : ch);
    }
    buf[n] = '\0';
    return n;
}

ric_server_conf_t *
ric_route_server(const ric_listener_t *ls, ric_str_t host)
{
    char name[256];
    size_t n, best_len = 0, nl;
    ric_server_conf_t *best = NULL;
    const ric_listen_t *l;
    int i;

    if (host.data == NULL || (n = normalize_host(host, name, sizeof(name))) == 0) {
        return ls->default_server;
    }
    for (l = ls->listens; l; l = l->addr_next) {
        for (i = 0; i < l->server->nnames; i++) {
            const char *sn = l->server->names[i];
            if (sn[0] != '*') {
                if (strcmp(sn, name) == 0) {
                    return l->server;
                }
                continue;
            }
            /* "*.example.com" matches "a.example.com", not "example.com" */
            nl = strlen(sn + 1);
            if (n > nl && nl > best_len && strcmp(name + n - nl, sn + 1) == 0) {
                best = l->server;
                best_len = nl;
            }
        }
    }
    return best ? best : ls->default_server;
}

ric_location_conf_t *
ric_route_location(const ric_server_conf_t *s, ric_str_t path)
{
    ric_location_conf_t *l, *best = NULL;
    size_t best_len = 0, n;

    for (l = s->locations; l; l = l->next) {
        n = strlen(l->path);
        if (l->exact) {
            if (n == path.len && memcmp(l->path, path.data, n) == 0) {
                return l;
            }
            continue;
        }
        if (n <= path.len && n >= best_len && memcmp(l->path, path.data, n) == 0) {
            best = l;
            best_len = n;
        }
    }
    return best;
}
