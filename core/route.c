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

static int
hex_value(u_char ch)
{
    if (ch >= '0' && ch <= '9') {
        return ch - '0';
    }
    ch |= 0x20;
    if (ch >= 'a' && ch <= 'f') {
        return ch - 'a' + 10;
    }
    return -1;
}

int
ric_route_normalize(const u_char *path, size_t len, u_char *out, size_t *out_len)
{
    size_t i, o = 0, seg;
    int hi, lo;
    u_char ch;

    if (len == 0 || path[0] != '/') {
        /* "*" (OPTIONS) and the like match no location: keep them as they are */
        memcpy(out, path, len);
        *out_len = len;
        return RIC_OK;
    }
    for (i = 0; i < len; i++) {
        ch = path[i];
        if (ch == '%') {
            if (i + 2 >= len || (hi = hex_value(path[i + 1])) < 0
                || (lo = hex_value(path[i + 2])) < 0) {
                return RIC_ERROR;
            }
            ch = (u_char) (hi << 4 | lo);
            if (ch == '\0') {
                return RIC_ERROR;
            }
            i += 2;
        }
        if (ch == '/' && o > 0 && out[o - 1] == '/') {
            continue; /* merge "//" */
        }
        out[o++] = ch;
        if (ch != '/') {
            continue;
        }
        /* a segment just ended at out[o - 1]: resolve "." and ".." */
        seg = o - 1;
        while (seg > 0 && out[seg - 1] != '/') {
            seg--;
        }
        if (o - 1 - seg == 1 && out[seg] == '.') {
            o = seg;
        } else if (o - 1 - seg == 2 && out[seg] == '.' && out[seg + 1] == '.') {
            if (seg <= 1) {
                return RIC_ERROR; /* above the root */
            }
            o = seg - 1;
            while (o > 0 && out[o - 1] != '/') {
                o--;
            }
        }
    }
    /* a final "." or ".." segment without its slash */
    seg = o;
    while (seg > 0 && out[seg - 1] != '/') {
        seg--;
    }
    if (o - seg == 1 && out[seg] == '.') {
        o = seg;
    } else if (o - seg == 2 && out[seg] == '.' && out[seg + 1] == '.') {
        if (seg <= 1) {
            return RIC_ERROR;
        }
        o = seg - 1;
        while (o > 0 && out[o - 1] != '/') {
            o--;
        }
    }
    *out_len = o;
    return RIC_OK;
}
