/* headers.h: field names and values of a parsed message: lookups, and which fields are hop-by-hop. */
#ifndef RIC_HEADERS_H
#define RIC_HEADERS_H

#include "ric_core.h"
#include "http_parse.h"

/* Case-insensitive equality of two spans (ASCII). */
int ric_str_eq_nocase(ric_str_t a, ric_str_t b);

/* The name and the value of field i of m, parsed from buf. */
static inline ric_str_t
ric_field_name(const u_char *buf, const ric_http_msg_t *m, unsigned i)
{
    return ric_http_span(buf, m->fields[i].name_off, m->fields[i].name_len);
}

static inline ric_str_t
ric_field_value(const u_char *buf, const ric_http_msg_t *m, unsigned i)
{
    return ric_http_span(buf, m->fields[i].value_off, m->fields[i].value_len);
}

/* The first field named name (any case; NULL or "" finds nothing);
 * .data == NULL when absent. */
ric_str_t ric_headers_find(const u_char *buf, const ric_http_msg_t *m, const char *name);

/* How many fields are named name (any case). */
int ric_headers_count(const u_char *buf, const ric_http_msg_t *m, const char *name);

/* Copies m's end-to-end fields as "Name: value\r\n" each, through
 * put(ctx, bytes, n), in order: never a hop-by-hop one (RFC 9110 §7.6.1:
 * the fixed names, and every name m's Connection fields list, however many
 * they are), nor one skip(ctx, name) refuses (skip may be NULL). The one
 * field copy of the gateway: the request sent upstream, the answer sent
 * back, the answer kept for an idempotency key. */
void ric_headers_copy(const u_char *buf, const ric_http_msg_t *m,
                      int (*skip)(void *ctx, ric_str_t name),
                      void (*put)(void *ctx, const void *p, size_t n), void *ctx);

/* Fields kept as text, "Name: value\r\n" each (the gateway's own answers,
 * a stored answer, the head as sent): the next one of *rest, which moves
 * past it; 0 at the end. */
int ric_lines_next(ric_str_t *rest, ric_str_t *name, ric_str_t *value);

/* The first of those lines named name (any case); .data == NULL when absent. */
ric_str_t ric_lines_find(ric_str_t lines, const char *name);

#endif /* RIC_HEADERS_H */
