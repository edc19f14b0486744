/* http_parse.h: strict, incremental, zero-copy HTTP/1.1 message parser (RFC 9112). */
#ifndef RIC_HTTP_PARSE_H
#define RIC_HTTP_PARSE_H

#include "ric_core.h"

/* Limits from the edge's point of view. */
#define RIC_HTTP_MAX_REQUEST_LINE (8 * 1024)   /* longer: 414 */
#define RIC_HTTP_MAX_HEADER_BYTES (32 * 1024)  /* field section longer: 431 */
#define RIC_HTTP_MAX_FIELDS 100                /* more fields: 431 */
#define RIC_HTTP_MAX_CHUNK_LINE 4096           /* chunk-size line incl. extensions */
#define RIC_HTTP_MAX_TRAILER_BYTES (8 * 1024)  /* trailer section */

/* A field as offsets into the buffer the message was parsed from, so the
 * buffer may be grown (moved) between calls without invalidating them. */
typedef struct {
    uint32_t name_off;
    uint32_t name_len;
    uint32_t value_off; /* leading/trailing OWS already stripped */
    uint32_t value_len;
} ric_http_field_t;

typedef enum {
    RIC_HTTP_METHOD_OTHER = 0, /* a valid token we do not know: forwarded as is */
    RIC_HTTP_GET,
    RIC_HTTP_HEAD,
    RIC_HTTP_POST,
    RIC_HTTP_PUT,
    RIC_HTTP_DELETE,
    RIC_HTTP_OPTIONS,
    RIC_HTTP_TRACE,
    RIC_HTTP_CONNECT,
    RIC_HTTP_PATCH
} ric_http_method_t;

/* How the body of a message is delimited (RFC 9112 §6.3). */
typedef enum {
    RIC_BODY_NONE = 0, /* no body */
    RIC_BODY_LENGTH,   /* Content-Length bytes */
    RIC_BODY_CHUNKED,  /* chunked transfer coding */
    RIC_BODY_CLOSE     /* responses only: until the connection closes */
} ric_http_body_t;

struct ric_http_msg_s {
    /* --- parser state: private, zeroed by ric_http_msg_init --- */
    int state;
    uint32_t pos;        /* next byte to examine */
    uint32_t line_start; /* start of the current line */
    uint32_t tok_start;  /* start of the current token */
    uint32_t section_start; /* start of the field section (for its limit) */

    /* --- results, valid once a parse returned RIC_OK --- */
    int is_response;
    int version; /* 10 or 11 */

    /* request line */
    ric_http_method_t method;
    uint32_t method_off, method_len;
    uint32_t target_off, target_len; /* as received */
    uint32_t path_len;               /* target bytes before '?' */

    /* status line */
    int status;
    uint32_t reason_off, reason_len;

    unsigned nfields;
    uint32_t head_len; /* bytes of the whole head, final CRLF included */

    /* semantics derived from the fields */
    ric_http_body_t body;
    uint64_t content_length; /* when body == RIC_BODY_LENGTH */
    /* a response's Content-Length came more than once (fields, or a list),
     * every time with the value content_length_value (RFC 9110 §8.6
     * allows it; a proxy sends it once) */
    int content_length_repeated;
    uint64_t content_length_value;
    int keep_alive;          /* after version and Connection */
    int close_asked;         /* Connection: close (a client then sends no more, RFC 9112 §9.6) */
    int expect_continue;     /* request had "Expect: 100-continue" */
    int host_index;          /* index into fields, -1 if none */
    int upgrade;             /* Connection: upgrade with an Upgrade field */

    /* on RIC_ERROR: the status to answer with (400, 414, 431, 501, 505) and
     * a short static reason for the log */
    int error_status;
    const char *error_reason;

    /* the first nfields are valid; last, so that a new message zeroes
     * everything but them (ric_http_msg_init) */
    ric_http_field_t fields[RIC_HTTP_MAX_FIELDS];
};

/* Prepare msg for a new message (the fields array is not cleared: only
 * its first nfields, 0 now, are ever read). */
void ric_http_msg_init(ric_http_msg_t *m);

/* Parse a request head from buf[0..len), where buf holds the message from its
 * first byte (leading empty lines before the request line are skipped, as RFC
 * 9112 §2.2 allows). Call again with the same message and a longer buffer after
 * RIC_AGAIN; parsing resumes where it stopped. The buffer may move between
 * calls (everything is kept as offsets).
 * Returns RIC_OK when the head is complete and valid (m->head_len bytes used),
 * RIC_AGAIN when more bytes are needed, RIC_ERROR with m->error_status and
 * m->error_reason set. After RIC_ERROR nothing more on the connection is to be
 * trusted. Limits: request line > 8 KiB → 414; field section > 32 KiB or
 * > 100 fields → 431. */
int ric_http_parse_request(ric_http_msg_t *m, const u_char *buf, size_t len);

/* Parse a response head, same contract. request_method is the method of the
 * request this answers: it decides the framing (HEAD, CONNECT 2xx, 1xx, 204
 * and 304 have no body). On RIC_ERROR error_status is 502. */
int ric_http_parse_response(ric_http_msg_t *m, const u_char *buf, size_t len,
                            ric_http_method_t request_method);

/* Returns a field value (borrowed from buf) by case-insensitive name, the
 * first if repeated; .data == NULL when absent. */
ric_str_t ric_http_field(const ric_http_msg_t *m, const u_char *buf, const char *lower_name);

static inline ric_str_t
ric_http_span(const u_char *buf, uint32_t off, uint32_t len)
{
    ric_str_t s = { buf + off, len };
    return s;
}

/* An absolute-form target ("http://host:8080/path?q", which the parser
 * accepted) split into its authority and the rest ("/path?q", "?q" or
 * ""); 0 for any other form (origin-form, "*"), target unsplit. */
int ric_http_absolute_form(ric_str_t target, ric_str_t *authority, ric_str_t *rest);

/* Incremental chunked-body decoder. Zero-copy: it hands out spans of the
 * caller's input. */
struct ric_http_chunked_s {
    int state;
    uint64_t remaining; /* data bytes left in the current chunk */
    uint32_t line_len;  /* bytes of the current size line or trailer */
    uint32_t trailer_len; /* bytes of the trailer section so far, its closing CRLF
                             included once done; 0 before the last chunk */
    unsigned ndigits;
};

void ric_http_chunked_init(ric_http_chunked_t *c);

/* Advance over input [*p, end). On RIC_OK *data and *data_len are the next
 * span of chunk data (inside the input) and *p is past it; call again for more. On
 * RIC_AGAIN all input was consumed (framing only, or data already returned)
 * and more is needed. On RIC_DONE the last chunk and trailer section ended and
 * *p points just past the body (pipelined bytes may follow). RIC_ERROR: bad
 * framing (bad size, sign, prefix, spaces, overflow, missing CRLF after data,
 * bare CR or control bytes in an extension, overlong line or trailers). */
int ric_http_chunked_next(ric_http_chunked_t *c, const u_char **p, const u_char *end,
                          const u_char **data, size_t *data_len);

/* Method name → enum for a token; RIC_HTTP_METHOD_OTHER when unknown. */
ric_http_method_t ric_http_method_parse(const u_char *p, size_t len);

/* Reason phrase for a status code ("Not Found"), "" when unknown. */
const char *ric_http_status_text(int status);

#endif /* RIC_HTTP_PARSE_H */
