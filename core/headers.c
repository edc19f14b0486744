/* headers.c: field lookups and the one copy of a message's end-to-end fields (the hop-by-hop rule), shared by the request sent upstream and the response sent back. */
#include "headers.h"

int
ric_str_eq_nocase(ric_str_t a, ric_str_t b)
{
    size_t i;

    if (a.len != b.len) {
        return 0;
    }
    for (i = 0; i < a.len; i++) {
        if ((a.data[i] | 0x20) != (b.data[i] | 0x20)) {
            return 0;
        }
    }
    return 1;
}

static ric_str_t
cstr(const char *s)
{
    ric_str_t v = { (const u_char *) s, s ? strlen(s) : 0 };
    return v;
}

ric_str_t
ric_headers_find(const u_char *buf, const ric_http_msg_t *m, const char *name)
{
    ric_str_t want = cstr(name), none = ric_null_string;
    unsigned i;

    if (want.len == 0) {
        return none;
    }
    for (i = 0; i < m->nfields; i++) {
        if (ric_str_eq_nocase(ric_field_name(buf, m, i), want)) {
            return ric_field_value(buf, m, i);
        }
    }
    return none;
}

int
ric_headers_count(const u_char *buf, const ric_http_msg_t *m, const char *name)
{
    ric_str_t want = cstr(name);
    unsigned i;
    int n = 0;

    for (i = 0; i < m->nfields; i++) {
        n += ric_str_eq_nocase(ric_field_name(buf, m, i), want);
    }
    return n;
}

/* Whether the comma-separated list v names name. */
static int
list_has(ric_str_t v, ric_str_t name)
{
    const u_char *s = v.data, *e = v.data + v.len, *start;
    ric_str_t tok;

    while (s < e) {
        while (s < e && (*s == ',' || *s == ' ' || *s == '\t')) {
            s++;
        }
        start = s;
        while (s < e && *s != ',' && *s != ' ' && *s != '\t') {
            s++;
        }
        tok.data = start;
        tok.len = (size_t) (s - start);
        if (tok.len > 0 && ric_str_eq_nocase(tok, name)) {
            return 1;
        }
    }
    return 0;
}

/* The names no proxy forwards, whatever the message says (RFC 9110 §7.6.1). */
static int
hop_by_hop_name(ric_str_t name)
{
    return ric_str_eq_lower(name, "connection") || ric_str_eq_lower(name, "keep-alive")
           || ric_str_eq_lower(name, "te") || ric_str_eq_lower(name, "trailer")
           || ric_str_eq_lower(name, "upgrade") || ric_str_eq_lower(name, "proxy-connection")
           || ric_str_eq_lower(name, "proxy-authenticate")
           || ric_str_eq_lower(name, "proxy-authorization");
}

void
ric_headers_copy(const u_char *buf, const ric_http_msg_t *m,
                 int (*skip)(void *ctx, ric_str_t name),
                 void (*put)(void *ctx, const void *p, size_t n), void *ctx)
{
    unsigned i, j, conn[RIC_HTTP_MAX_FIELDS], nconn = 0;
    ric_str_t name, value;
    int listed;

    /* the Connection fields, found once: each may name more hop-by-hop fields */
    for (i = 0; i < m->nfields; i++) {
        if (ric_str_eq_lower(ric_field_name(buf, m, i), "connection")) {
            conn[nconn++] = i;
        }
    }
    for (i = 0; i < m->nfields; i++) {
        name = ric_field_name(buf, m, i);
        if (hop_by_hop_name(name)) {
            continue;
        }
        for (j = 0, listed = 0; j < nconn && !listed; j++) {
            listed = list_has(ric_field_value(buf, m, conn[j]), name);
        }
        if (listed || (skip != NULL && skip(ctx, name))) {
            continue;
        }
        value = ric_field_value(buf, m, i);
        if (value.data == name.data + name.len + 2 && name.data[name.len] == ':'
            && name.data[name.len + 1] == ' ' && value.data[value.len] == '\r'
            && value.data[value.len + 1] == '\n') {
            put(ctx, name.data, name.len + value.len + 4); /* as it came: one piece */
            continue;
        }
        put(ctx, name.data, name.len);
        put(ctx, ": ", 2);
        put(ctx, value.data, value.len);
        put(ctx, "\r\n", 2);
    }
}

int
ric_lines_next(ric_str_t *rest, ric_str_t *name, ric_str_t *value)
{
    const u_char *p = rest->data, *end = p + rest->len, *colon, *eol, *v;

    if (rest->len == 0 || (eol = memchr(p, '\n', rest->len)) == NULL
        || (colon = memchr(p, ':', (size_t) (eol - p))) == NULL) {
        return 0;
    }
    for (v = colon + 1; v < eol && (*v == ' ' || *v == '\t'); v++) {
    }
    name->data = p;
    name->len = (size_t) (colon - p);
    value->data = v;
    value->len = (size_t) (eol - v) - (eol > v && eol[-1] == '\r');
    rest->data = eol + 1;
    rest->len = (size_t) (end - rest->data);
    return 1;
}

ric_str_t
ric_lines_find(ric_str_t lines, const char *name)
{
    ric_str_t want = cstr(name), n, v, none = ric_null_string;

    while (want.len > 0 && ric_lines_next(&lines, &n, &v)) {
        if (ric_str_eq_nocase(n, want)) {
            return v;
        }
    }
    return none;
}
