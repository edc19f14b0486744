/* route.c: server selection by Host and location matching by path. */
#include "route.h"

ric_str_t
ric_route_host_name(ric_str_t host)
{
    size_t n = host.len;

    if (n == 0) {
        return host;
    }
    if (host.data[0] == '[') {
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
    host.len = n;
    return host;
}

/* Lowercased host without port or trailing dot, into buf; returns its length. */
static size_t
normalize_host(ric_str_t host, char *buf, size_t size)
{
    size_t n, i;

    host = ric_route_host_name(host);
    n = host.len;
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

/* RFC 3986 §2.3: the characters whose escape means the character itself */
static int
is_unreserved(u_char ch)
{
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')
           || ch == '-' || ch == '.' || ch == '_' || ch == '~';
}

/* Is the escape of byte v decoded in a normalized path? Those of unreserved
 * characters, which mean the character itself, and of bytes beyond ASCII
 * (UTF-8: no upstream splits or reads a path on them, and a location may
 * be written in them). Reserved characters, '%', space and controls stay
 * escaped: decoded, they could change what the path means. */
static int
decoded(int v)
{
    return v >= 0x80 || is_unreserved((u_char) v);
}

/* The escape at p[0] ('%') of a path of len bytes left: its byte, or -1
 * for one a path may not carry (bad hex, NUL, or '/', which upstreams
 * split on or not as they please). */
static int
escape_value(const u_char *p, size_t len)
{
    int hi, lo, v;

    if (len < 3 || (hi = hex_value(p[1])) < 0 || (lo = hex_value(p[2])) < 0) {
        return -1;
    }
    v = hi << 4 | lo;
    return v == '\0' || v == '/' ? -1 : v;
}

/* Does out[0..o) end with a segment "." or ".." (after its '/')? Returns
 * its length (1 or 2), else 0; *seg is where it starts. */
static size_t
dot_segment(const u_char *out, size_t o, size_t *seg)
{
    size_t s = o;

    while (s > 0 && out[s - 1] != '/') {
        s--;
    }
    *seg = s;
    if (o - s == 1 && out[s] == '.') {
        return 1;
    }
    return o - s == 2 && out[s] == '.' && out[s + 1] == '.' ? 2 : 0;
}

int
ric_route_path_normal(const u_char *path, size_t len)
{
    size_t i;
    int v;

    if (len == 0 || path[0] != '/') {
        return 1;
    }
    for (i = 0; i < len; i++) {
        switch (path[i]) {
        case '%':
            v = escape_value(path + i, len - i);
            if (v < 0 || decoded(v) || path[i + 1] > 'F' || path[i + 2] > 'F') {
                return 0; /* refused, decoded, or its hex in lowercase */
            }
            i += 2;
            break;
        case '\\':
            return 0;
        case '/':
            /* "//", "/." and "/.." segments */
            if (i + 1 < len && path[i + 1] == '/') {
                return 0;
            }
            if (i + 1 < len && path[i + 1] == '.'
                && (i + 2 == len || path[i + 2] == '/'
                    || (path[i + 2] == '.' && (i + 3 == len || path[i + 3] == '/'))))
            {
                return 0;
            }
            break;
        }
    }
    return 1;
}

int
ric_route_normalize(const u_char *path, size_t len, u_char *out, size_t *out_len)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t i, o = 0, seg;
    int v;
    u_char ch;

    if (len == 0 || path[0] != '/') {
        /* "*" (OPTIONS) and the like match no location: keep them as they are */
        memcpy(out, path, len);
        *out_len = len;
        return RIC_OK;
    }
    for (i = 0; i <= len; i++) {
        ch = i < len ? path[i] : '/'; /* the end closes the last segment */
        if (ch == '\\') {
            return RIC_ERROR; /* not a URI character; WHATWG URL parsers read it as '/' */
        }
        if (ch == '%') {
            if ((v = escape_value(path + i, len - i)) < 0) {
                return RIC_ERROR;
            }
            i += 2;
            if (!decoded(v)) {
                /* kept escaped, in one spelling (RFC 3986 §6.2.2.1) */
                out[o++] = '%';
                out[o++] = (u_char) hex[v >> 4];
                out[o++] = (u_char) hex[v & 0xf];
                continue;
            }
            ch = (u_char) v;
        }
        if (ch != '/') {
            out[o++] = ch;
            continue;
        }
        /* a segment ended: resolve "." and ".." (RFC 3986 §5.2.4) */
        switch (dot_segment(out, o, &seg)) {
        case 1:
            o = seg;
            break;
        case 2:
            if (seg <= 1) {
                return RIC_ERROR; /* above the root */
            }
            o = seg - 1;
            while (out[o - 1] != '/') {
                o--;
            }
            break;
        }
        if (i < len && (o == 0 || out[o - 1] != '/')) {
            out[o++] = '/'; /* "//" merged */
        }
    }
    *out_len = o;
    return RIC_OK;
}
