/* http_parse.c: strict, incremental, zero-copy HTTP/1.1 head parser and chunked decoder. */
#include "http_parse.h"

/*
 * The parser is a byte-at-a-time state machine in the manner of nginx's: it
 * keeps its state and the offset of the next byte in the message, so a call
 * after RIC_AGAIN continues exactly where the previous one stopped and never
 * looks at a byte twice. Everything it records is an offset, which lets the
 * caller grow (move) the buffer between calls.
 *
 * It is deliberately stricter than RFC 9112 requires of a general recipient.
 * We sit in front of other servers, and every leniency one side has and the
 * other lacks is a request-smuggling or desync vector, so:
 *   - lines end in CRLF only; a bare LF or a CR not followed by LF anywhere
 *     in a head is an error (RFC 9112 §2.2 allows treating bare LF as a line
 *     end, and we choose not to);
 *   - obs-fold, whitespace before the colon and whitespace before the first
 *     field are errors (§5.1, §5.2, §2.2);
 *   - framing fields (Content-Length, Transfer-Encoding) that are malformed,
 *     repeated with different values or combined are errors (§6.1, §6.3).
 */

/* Character classes, one bit each, looked up through char_class[]. */
#define CH_TCHAR 0x01  /* token character (RFC 9110 §5.6.2) */
#define CH_FIELD 0x02  /* field-vchar: VCHAR / obs-text */
#define CH_TARGET 0x04 /* request-target byte: VCHAR only */
#define CH_HEX 0x08    /* HEXDIG */
#define CH_HOST 0x10   /* uri-host / port: unreserved, pct, sub-delims, ":[]" */
#define CH_QDTEXT 0x20 /* qdtext of a quoted-string (RFC 9110 §5.6.4) */
#define CH_DIGIT 0x40  /* DIGIT */
#define CH_WS 0x80     /* OWS byte: SP / HTAB */

static const uint8_t char_class[256] = {
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xa0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  /* 0x00 .. 0x0f */
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  /* 0x10 .. 0x1f */
    0xa0, 0x37, 0x06, 0x27, 0x37, 0x37, 0x37, 0x37, 0x36, 0x36, 0x37, 0x37, 0x36, 0x37, 0x37, 0x26,  /* SP .. / */
    0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x7f, 0x36, 0x36, 0x26, 0x36, 0x26, 0x26,  /* 0 .. ? */
    0x26, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37,  /* @ .. O */
    0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x36, 0x06, 0x36, 0x27, 0x37,  /* P .. _ */
    0x27, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x3f, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37,  /* ` .. o */
    0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x37, 0x26, 0x27, 0x26, 0x37, 0x00,  /* p .. DEL */
    0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22,  /* 0x80 .. 0x8f */
    0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22,  /* 0x90 .. 0x9f */
    0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22,  /* 0xa0 .. 0xaf */
    0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22,  /* 0xb0 .. 0xbf */
    0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22,  /* 0xc0 .. 0xcf */
    0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22,  /* 0xd0 .. 0xdf */
    0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22,  /* 0xe0 .. 0xef */
    0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22, 0x22,  /* 0xf0 .. 0xff */
};

#define is_class(ch, cls) (char_class[(u_char) (ch)] & (cls))

#define CR '\r'
#define LF '\n'
#define SP ' '

/* Empty lines before a request line are tolerated (RFC 9112 §2.2), but only
 * this many bytes of them: a peer streaming CRLFs forever is not a client. */
#define MAX_LEADING_EMPTY 256

enum {
    S_START = 0,    /* before the request or status line */
    S_START_LF,     /* CR of a leading empty line seen */
    S_METHOD,       /* the request-line states run from here ... */
    S_TARGET_START,
    S_TARGET,
    S_VERSION,      /* shared: "HTTP/x.y" of request and status line */
    S_STATUS,
    S_REASON,       /* ... to here; all are limited in length */
    S_LINE_LF,      /* CR ending the first line seen */
    S_FIELD_START,  /* the field-section states run from here ... */
    S_NAME,
    S_VALUE_OWS,
    S_VALUE,
    S_FIELD_LF,
    S_HEAD_LF,      /* ... to here */
    S_DONE,
    S_ERROR
};

/* Everything we learn from the fields in one pass over them. */
typedef struct {
    int host_count;
    int te_count;
    int te_index;          /* the first Transfer-Encoding field */
    int cl_count;          /* Content-Length fields, valid or not */
    int cl_seen;           /* a valid Content-Length value was seen */
    int cl_values;         /* valid values seen (a list counts each) */
    uint64_t cl;
    const char *cl_error;  /* why Content-Length is unusable, or NULL */
    int conn_close;
    int conn_keep_alive;
    int conn_upgrade;
    int upgrade_field;
    int expect_count;
    int expect_other;      /* an expectation other than 100-continue */
} head_info_t;

/* Result of reading a Transfer-Encoding value. */
enum {
    TE_CHUNKED,       /* chunked is the only and final coding */
    TE_CODED_CHUNKED, /* other codings, then chunked */
    TE_NOT_CHUNKED,   /* chunked absent or not final */
    TE_INVALID
};

static int parse_head(ric_http_msg_t *m, const u_char *buf, size_t len);
static int finish_request(ric_http_msg_t *m, const u_char *buf);
static int finish_response(ric_http_msg_t *m, const u_char *buf,
                           ric_http_method_t request_method);

void
ric_http_msg_init(ric_http_msg_t *m)
{
    memset(m, 0, offsetof(ric_http_msg_t, fields));
    m->host_index = -1;
}

/* Responses always answer 502 to our client: the status we would have used
 * for a bad request says nothing useful about a bad upstream. */
static int
fail(ric_http_msg_t *m, int status, const char *reason)
{
    m->state = S_ERROR;
    m->error_status = m->is_response ? 502 : status;
    m->error_reason = reason;
    return RIC_ERROR;
}

int
ric_http_parse_request(ric_http_msg_t *m, const u_char *buf, size_t len)
{
    int rc;

    if (m->state == S_DONE) {
        return RIC_OK;
    }
    if (m->state == S_ERROR) {
        return RIC_ERROR;
    }

    m->is_response = 0;
    rc = parse_head(m, buf, len);
    if (rc != RIC_OK) {
        return rc;
    }
    return finish_request(m, buf);
}

int
ric_http_parse_response(ric_http_msg_t *m, const u_char *buf, size_t len,
                        ric_http_method_t request_method)
{
    int rc;

    if (m->state == S_DONE) {
        return RIC_OK;
    }
    if (m->state == S_ERROR) {
        return RIC_ERROR;
    }

    if (!m->is_response) {
        /* a status line starts at the first byte: unlike a server reading
         * requests, we do not skip empty lines from an upstream */
        m->is_response = 1;
        m->state = S_VERSION;
        m->line_start = 0;
        m->tok_start = 0;
    }

    rc = parse_head(m, buf, len);
    if (rc != RIC_OK) {
        return rc;
    }
    return finish_response(m, buf, request_method);
}

/* Is the target "<scheme>://authority[/path][?query]" for this lowercase
 * scheme, with a non-empty authority of host characters only (so no
 * "http:///x", and no userinfo, which RFC 9110 §4.2.4 says to refuse)? */
static int
has_scheme(const u_char *t, size_t n, const char *scheme)
{
    ric_str_t s;
    size_t i;

    s.data = t;
    s.len = strlen(scheme);
    if (n <= s.len || !ric_str_eq_lower(s, scheme)) {
        return 0;
    }
    for (i = s.len; i < n && t[i] != '/' && t[i] != '?' && t[i] != '#'; i++) {
        if (!is_class(t[i], CH_HOST)) {
            return 0;
        }
    }
    return i > s.len;
}

/* Checks a target once its end is known: its form must suit the method
 * (RFC 9112 §3.2). */
static int
check_target(ric_http_msg_t *m, const u_char *buf)
{
    const u_char *t = buf + m->target_off;
    size_t n = m->target_len, i, colon;

    if (m->method == RIC_HTTP_CONNECT) {
        /* authority-form: host ":" port, both non-empty */
        for (colon = n; colon > 0 && t[colon - 1] != ':'; colon--) {
            /* find the last colon: an IPv6 literal has its own */
        }
        if (colon < 2 || colon == n) {
            return RIC_ERROR;
        }
        for (i = colon; i < n; i++) {
            if (!is_class(t[i], CH_DIGIT)) {
                return RIC_ERROR;
            }
        }
        for (i = 0; i < colon - 1; i++) {
            if (!is_class(t[i], CH_HOST)) {
                return RIC_ERROR;
            }
        }
        return RIC_OK;
    }

    /* a fragment is the client's own (RFC 9112 §3.2 has none in a
     * request-target): "/admin#" would match no location written "/admin"
     * and reach an upstream that cuts it there */
    if (memchr(t, '#', n) != NULL) {
        return RIC_ERROR;
    }

    if (t[0] == '/') {
        return RIC_OK;
    }

    if (n == 1 && t[0] == '*') {
        return m->method == RIC_HTTP_OPTIONS ? RIC_OK : RIC_ERROR;
    }

    /* absolute-form, which a server must accept (RFC 9112 §3.2.2); we only
     * speak http and https, and the authority must at least begin */
    if (has_scheme(t, n, "https://") || has_scheme(t, n, "http://")) {
        return RIC_OK;
    }

    return RIC_ERROR;
}

int
ric_http_absolute_form(ric_str_t target, ric_str_t *authority, ric_str_t *rest)
{
    const u_char *p = target.data, *end = p + target.len, *auth;

    if (target.len == 0 || p[0] == '/' || p[0] == '*') {
        return 0;
    }
    auth = memchr(p, ':', target.len);
    if (auth == NULL || end - auth < 3 || auth[1] != '/' || auth[2] != '/') {
        return 0;
    }
    auth += 3;
    for (p = auth; p < end && *p != '/' && *p != '?'; p++) {
    }
    authority->data = auth;
    authority->len = (size_t) (p - auth);
    rest->data = p;
    rest->len = (size_t) (end - p);
    return 1;
}

static int
parse_head(ric_http_msg_t *m, const u_char *buf, size_t len)
{
    uint32_t pos = m->pos;
    int state = m->state;
    ric_http_field_t *f;
    u_char ch;
    const char *reason;
    int major, minor, status;
    /* a run of bytes of one class is taken at once, up to where the
     * limits are checked again byte by byte */
#define LINE_RUN_END ric_min((size_t) len, (size_t) m->line_start + RIC_HTTP_MAX_REQUEST_LINE)
#define SECTION_RUN_END ric_min((size_t) len, (size_t) m->section_start + RIC_HTTP_MAX_HEADER_BYTES)
#define RUN(end, cond) \
    do { \
        size_t run_end_ = (end); \
        while (pos + 1 < run_end_ && (cond)) { \
            pos++; \
        } \
    } while (0)

    for (; pos < len; pos++) {
        ch = buf[pos];

        /* Limits are checked per byte so that an overlong line or section is
         * refused as soon as it is overlong, not when (or if) it ends. */
        if (state >= S_METHOD && state <= S_REASON
            && pos - m->line_start >= RIC_HTTP_MAX_REQUEST_LINE && ch != CR)
        {
            m->pos = pos;
            return fail(m, 414, "request line too long");
        }
        if (state >= S_FIELD_START && state <= S_HEAD_LF
            && pos - m->section_start >= RIC_HTTP_MAX_HEADER_BYTES)
        {
            m->pos = pos;
            return fail(m, 431, "header section too large");
        }

        switch (state) {

        case S_START:
            if (pos >= MAX_LEADING_EMPTY) {
                goto bad_empty;
            }
            if (ch == CR) {
                state = S_START_LF;
                break;
            }
            if (!is_class(ch, CH_TCHAR)) {
                if (ch == LF) {
                    goto bad_eol;
                }
                goto bad_method;
            }
            m->line_start = pos;
            m->method_off = pos;
            state = S_METHOD;
            break;

        case S_START_LF:
            if (ch != LF) {
                goto bad_eol;
            }
            state = S_START;
            break;

        case S_METHOD:
            if (is_class(ch, CH_TCHAR)) {
                break;
            }
            if (ch != SP) {
                goto bad_method;
            }
            m->method_len = pos - m->method_off;
            m->method = ric_http_method_parse(buf + m->method_off, m->method_len);
            m->target_off = pos + 1;
            state = S_TARGET_START;
            break;

        case S_TARGET_START:
            if (!is_class(ch, CH_TARGET)) {
                goto bad_target;
            }
            m->path_len = UINT32_MAX;
            state = S_TARGET;
            /* fall through */

        case S_TARGET:
            if (ch == '?' && m->path_len == UINT32_MAX) {
                m->path_len = pos - m->target_off;
                break;
            }
            if (is_class(ch, CH_TARGET)) {
                RUN(LINE_RUN_END, is_class(buf[pos + 1], CH_TARGET)
                                  && (buf[pos + 1] != '?' || m->path_len != UINT32_MAX));
                break;
            }
            if (ch != SP) {
                if (ch == CR) {
                    goto bad_version;
                }
                goto bad_target;
            }
            m->target_len = pos - m->target_off;
            if (m->path_len == UINT32_MAX) {
                m->path_len = m->target_len;
            }
            if (check_target(m, buf) != RIC_OK) {
                goto bad_target;
            }
            m->tok_start = pos + 1;
            state = S_VERSION;
            break;

        case S_VERSION:
            /* "HTTP/" DIGIT "." DIGIT, case-sensitive (RFC 9112 §2.3) */
            switch (pos - m->tok_start) {
            case 0: case 1: case 2: case 3: case 4:
                if (ch != (u_char) "HTTP/"[pos - m->tok_start]) {
                    goto bad_version;
                }
                break;
            case 5: case 7:
                if (!is_class(ch, CH_DIGIT)) {
                    goto bad_version;
                }
                break;
            case 6:
                if (ch != '.') {
                    goto bad_version;
                }
                break;
            default:
                if (ch != (m->is_response ? SP : CR)) {
                    if (ch == LF) {
                        goto bad_eol;
                    }
                    goto bad_version;
                }
                major = buf[m->tok_start + 5] - '0';
                minor = buf[m->tok_start + 7] - '0';
                if (major != 1) {
                    m->pos = pos;
                    return fail(m, 505, "HTTP version not supported");
                }
                /* a higher 1.x minor is to be handled as 1.1 (RFC 9110 §6.2) */
                m->version = minor == 0 ? 10 : 11;
                if (m->is_response) {
                    m->tok_start = pos + 1;
                    state = S_STATUS;
                } else {
                    state = S_LINE_LF;
                }
                break;
            }
            break;

        case S_STATUS:
            /* 3DIGIT in 100..599, then SP reason; the SP and reason may be
             * missing altogether, which too many servers send to refuse */
            if (pos - m->tok_start < 3) {
                if (!is_class(ch, CH_DIGIT)
                    || (pos == m->tok_start && (ch < '1' || ch > '5')))
                {
                    goto bad_status;
                }
                m->status = m->status * 10 + (ch - '0');
                break;
            }
            if (ch == SP) {
                m->reason_off = pos + 1;
                state = S_REASON;
                break;
            }
            if (ch != CR) {
                if (ch == LF) {
                    goto bad_eol;
                }
                goto bad_status;
            }
            m->reason_off = pos;
            m->reason_len = 0;
            state = S_LINE_LF;
            break;

        case S_REASON:
            if (ch == CR) {
                m->reason_len = pos - m->reason_off;
                state = S_LINE_LF;
                break;
            }
            if (!is_class(ch, CH_FIELD | CH_WS)) {
                if (ch == LF) {
                    goto bad_eol;
                }
                goto bad_status;
            }
            RUN(LINE_RUN_END, is_class(buf[pos + 1], CH_FIELD | CH_WS));
            break;

        case S_LINE_LF:
            if (ch != LF) {
                goto bad_eol;
            }
            m->section_start = pos + 1;
            state = S_FIELD_START;
            break;

        case S_FIELD_START:
            if (ch == CR) {
                state = S_HEAD_LF;
                break;
            }
            if (is_class(ch, CH_TCHAR)) {
                if (m->nfields == RIC_HTTP_MAX_FIELDS) {
                    m->pos = pos;
                    return fail(m, 431, "too many header fields");
                }
                m->fields[m->nfields].name_off = pos;
                state = S_NAME;
                break;
            }
            if (ch == LF) {
                goto bad_eol;
            }
            if (is_class(ch, CH_WS)) {
                /* obs-fold, or whitespace between the start line and the
                 * first field (RFC 9112 §2.2, §5.2) */
                m->pos = pos;
                return fail(m, 400, m->nfields ? "obsolete line folding"
                                               : "whitespace before first field");
            }
            goto bad_name;

        case S_NAME:
            if (is_class(ch, CH_TCHAR)) {
                RUN(SECTION_RUN_END, is_class(buf[pos + 1], CH_TCHAR));
                break;
            }
            if (ch != ':') {
                if (is_class(ch, CH_WS)) {
                    m->pos = pos;
                    return fail(m, 400, "whitespace before colon");
                }
                if (ch == CR || ch == LF) {
                    m->pos = pos;
                    return fail(m, 400, "header line without colon");
                }
                goto bad_name;
            }
            f = &m->fields[m->nfields];
            f->name_len = pos - f->name_off;
            state = S_VALUE_OWS;
            break;

        case S_VALUE_OWS:
            f = &m->fields[m->nfields];
            if (is_class(ch, CH_WS)) {
                break;
            }
            if (ch == CR) {
                f->value_off = pos;
                f->value_len = 0;
                state = S_FIELD_LF;
                break;
            }
            if (!is_class(ch, CH_FIELD)) {
                if (ch == LF) {
                    goto bad_eol;
                }
                goto bad_value;
            }
            f->value_off = pos;
            state = S_VALUE;
            break;

        case S_VALUE:
            /* spaces inside a value ("Thu, 03 Dec 2026 ...") are taken in
             * the run; the trailing ones are trimmed at its end */
            if (is_class(ch, CH_FIELD | CH_WS)) {
                RUN(SECTION_RUN_END, is_class(buf[pos + 1], CH_FIELD | CH_WS));
                break;
            }
            if (ch != CR) {
                if (ch == LF) {
                    goto bad_eol;
                }
                goto bad_value;
            }
            f = &m->fields[m->nfields];
            f->value_len = pos - f->value_off;
            while (is_class(buf[f->value_off + f->value_len - 1], CH_WS)) {
                f->value_len--; /* stops at the first byte: S_VALUE_OWS took no space */
            }
            state = S_FIELD_LF;
            break;

        case S_FIELD_LF:
            if (ch != LF) {
                goto bad_eol;
            }
            m->nfields++;
            state = S_FIELD_START;
            break;

        case S_HEAD_LF:
            if (ch != LF) {
                goto bad_eol;
            }
            m->head_len = pos + 1;
            m->pos = pos + 1;
            m->state = S_DONE;
            return RIC_OK;

        default:
            /* S_DONE and S_ERROR never reach the loop */
            ric_assert(0);
        }
    }

    m->pos = pos;
    m->state = state;
    return RIC_AGAIN;

    /* one exit per error, so that each gets its own reason */
bad_empty:
    status = 400;
    reason = "too many empty lines before request line";
    goto failed;
bad_method:
    status = 400;
    reason = "invalid method";
    goto failed;
bad_target:
    status = 400;
    reason = "invalid request target";
    goto failed;
bad_version:
    status = 400;
    reason = "invalid HTTP version";
    goto failed;
bad_status:
    status = 502;
    reason = "invalid status line";
    goto failed;
bad_eol:
    status = 400;
    reason = "line not ended by CRLF";
    goto failed;
bad_name:
    status = 400;
    reason = "invalid header name";
    goto failed;
bad_value:
    status = 400;
    reason = "invalid header value";
failed:
    m->pos = pos;
    return fail(m, status, reason);
}

/* Returns the next element of a comma-separated list (RFC 9110 §5.6.1) with
 * OWS trimmed, empty elements included; 0 once the list is exhausted. *i is
 * the cursor, 0 to start. Only for lists of tokens: a quoted comma would
 * split an element. */
static int
next_element(ric_str_t list, size_t *i, ric_str_t *item)
{
    size_t s = *i, e;

    if (s > list.len) {
        return 0;
    }
    for (e = s; e < list.len && list.data[e] != ','; e++) {
        /* find the end of this element */
    }
    *i = e + 1;
    while (s < e && is_class(list.data[s], CH_WS)) {
        s++;
    }
    while (e > s && is_class(list.data[e - 1], CH_WS)) {
        e--;
    }
    item->data = list.data + s;
    item->len = e - s;
    return 1;
}

/* Content-Length = 1*DIGIT; a list of identical values counts as one
 * (RFC 9110 §8.6). Returns NULL or the reason the value is unusable. */
static const char *
parse_content_length(ric_str_t v, int *seen, int *count, uint64_t *length)
{
    ric_str_t item;
    uint64_t n;
    size_t i = 0, k;

    while (next_element(v, &i, &item)) {
        /* 19 digits cannot overflow uint64_t; INT64_MAX is the real cap, so
         * the length stays representable as an off_t everywhere downstream */
        if (item.len == 0 || item.len > 19) {
            return "invalid Content-Length";
        }
        n = 0;
        for (k = 0; k < item.len; k++) {
            if (!is_class(item.data[k], CH_DIGIT)) {
                return "invalid Content-Length";
            }
            n = n * 10 + (uint64_t) (item.data[k] - '0');
        }
        if (n > (uint64_t) INT64_MAX) {
            return "invalid Content-Length";
        }
        if (*seen && *length != n) {
            return "conflicting Content-Length";
        }
        *seen = 1;
        (*count)++;
        *length = n;
    }
    return NULL;
}

static size_t
skip_ows(ric_str_t v, size_t i)
{
    while (i < v.len && is_class(v.data[i], CH_WS)) {
        i++;
    }
    return i;
}

static size_t
skip_token(ric_str_t v, size_t i)
{
    while (i < v.len && is_class(v.data[i], CH_TCHAR)) {
        i++;
    }
    return i;
}

/* Skips a quoted-string starting at v.data[i] == '"'; returns the index past
 * the closing quote, or 0 when it is malformed (0 cannot be a valid end). */
static size_t
skip_quoted(ric_str_t v, size_t i)
{
    for (i++; i < v.len; i++) {
        if (v.data[i] == '"') {
            return i + 1;
        }
        if (v.data[i] == '\\') {
            if (++i == v.len || !is_class(v.data[i], CH_FIELD | CH_WS)) {
                return 0;
            }
            continue;
        }
        if (!is_class(v.data[i], CH_QDTEXT)) {
            return 0;
        }
    }
    return 0;
}

/*
 * Transfer-Encoding = #transfer-coding (RFC 9112 §6.1), where
 *   transfer-coding = token *( OWS ";" OWS token BWS "=" BWS
 *                              ( token / quoted-string ) )
 * Empty elements, chunked with parameters and chunked applied twice are
 * errors: each is a way for two parsers to disagree about the framing.
 */
static int
parse_transfer_encoding(ric_str_t v)
{
    size_t i = 0, start;
    ric_str_t name;
    int chunked = 0, last_chunked = 0, codings = 0, params;

    for (;;) {
        start = skip_ows(v, i);
        i = skip_token(v, start);
        if (i == start) {
            return TE_INVALID;
        }
        name.data = v.data + start;
        name.len = i - start;

        params = 0;
        i = skip_ows(v, i);
        while (i < v.len && v.data[i] == ';') {
            params = 1;
            start = skip_ows(v, i + 1);
            i = skip_token(v, start);
            if (i == start) {
                return TE_INVALID;
            }
            i = skip_ows(v, i);
            if (i == v.len || v.data[i] != '=') {
                return TE_INVALID;
            }
            start = skip_ows(v, i + 1);
            if (start < v.len && v.data[start] == '"') {
                i = skip_quoted(v, start);
                if (i == 0) {
                    return TE_INVALID;
                }
            } else {
                i = skip_token(v, start);
                if (i == start) {
                    return TE_INVALID;
                }
            }
            i = skip_ows(v, i);
        }

        last_chunked = ric_str_eq_lower(name, "chunked");
        if (last_chunked) {
            if (chunked || params) {
                return TE_INVALID;
            }
            chunked = 1;
        }
        codings++;

        if (i == v.len) {
            break;
        }
        if (v.data[i] != ',') {
            return TE_INVALID;
        }
        i++;
    }

    if (!last_chunked) {
        return TE_NOT_CHUNKED;
    }
    return codings > 1 ? TE_CODED_CHUNKED : TE_CHUNKED;
}

/* Host = uri-host [ ":" port ]; empty is allowed (RFC 9110 §7.2). We check
 * the alphabet only: enough to refuse userinfo, paths and whitespace. */
static int
valid_host(ric_str_t v)
{
    size_t i;

    for (i = 0; i < v.len; i++) {
        if (!is_class(v.data[i], CH_HOST)) {
            return 0;
        }
    }
    return 1;
}

/* One pass over the fields, collecting what the framing and connection
 * decisions need. */
static void
scan_fields(ric_http_msg_t *m, const u_char *buf, head_info_t *h)
{
    ric_http_field_t *f;
    ric_str_t name, value, item;
    const char *error;
    unsigned n;
    size_t i;

    memset(h, 0, sizeof(*h));
    h->te_index = -1;

    for (n = 0; n < m->nfields; n++) {
        f = &m->fields[n];
        name = ric_http_span(buf, f->name_off, f->name_len);
        value = ric_http_span(buf, f->value_off, f->value_len);

        /* the length picks the one name it can be before comparing */
        switch (f->name_len) {
        case 4:
            if (ric_str_eq_lower(name, "host")) {
                if (h->host_count++ == 0) {
                    m->host_index = (int) n;
                }
            }
            break;

        case 6:
            if (ric_str_eq_lower(name, "expect")) {
                h->expect_count++;
                if (!ric_str_eq_lower(value, "100-continue")) {
                    h->expect_other = 1;
                }
            }
            break;

        case 7:
            if (ric_str_eq_lower(name, "upgrade")) {
                h->upgrade_field = 1;
            }
            break;

        case 10:
            if (ric_str_eq_lower(name, "connection")) {
                i = 0;
                while (next_element(value, &i, &item)) {
                    if (ric_str_eq_lower(item, "close")) {
                        h->conn_close = 1;
                    } else if (ric_str_eq_lower(item, "keep-alive")) {
                        h->conn_keep_alive = 1;
                    } else if (ric_str_eq_lower(item, "upgrade")) {
                        h->conn_upgrade = 1;
                    }
                }
            }
            break;

        case 14:
            if (ric_str_eq_lower(name, "content-length")) {
                h->cl_count++;
                if (h->cl_error == NULL) {
                    error = parse_content_length(value, &h->cl_seen, &h->cl_values, &h->cl);
                    h->cl_error = error;
                }
            }
            break;

        case 17:
            if (ric_str_eq_lower(name, "transfer-encoding")) {
                if (h->te_count++ == 0) {
                    h->te_index = (int) n;
                }
            }
            break;

        default:
            break;
        }
    }
}

static ric_str_t
field_value(const ric_http_msg_t *m, const u_char *buf, int index)
{
    const ric_http_field_t *f = &m->fields[index];

    return ric_http_span(buf, f->value_off, f->value_len);
}

/* Request semantics once the head is complete (RFC 9112 §3.2, §6, §9.3). */
/* Transfer-Encoding that makes the framing ambiguous, in requests and
 * responses alike: NULL when it is acceptable, else why not. */
static const char *
te_framing_error(const head_info_t *h, int version)
{
    if (h->te_count > 1) {
        return "repeated Transfer-Encoding";
    }
    if (version == 10) {
        /* RFC 9112 §6.1: framing is faulty by definition */
        return "Transfer-Encoding in HTTP/1.0";
    }
    if (h->cl_count) {
        return "both Transfer-Encoding and Content-Length";
    }
    return NULL;
}

static int
finish_request(ric_http_msg_t *m, const u_char *buf)
{
    head_info_t h;
    const char *reason;

    scan_fields(m, buf, &h);

    if (h.host_count > 1) {
        return fail(m, 400, "duplicate Host");
    }
    if (h.host_count == 0 && m->version == 11) {
        return fail(m, 400, "missing Host");
    }
    if (h.host_count == 1 && !valid_host(field_value(m, buf, m->host_index))) {
        return fail(m, 400, "invalid Host");
    }

    if (h.te_count) {
        if ((reason = te_framing_error(&h, m->version)) != NULL) {
            return fail(m, 400, reason);
        }
        switch (parse_transfer_encoding(field_value(m, buf, h.te_index))) {
        case TE_CHUNKED:
            m->body = RIC_BODY_CHUNKED;
            break;
        case TE_CODED_CHUNKED:
            /* valid, but we would have to decode it to retry the body */
            return fail(m, 501, "unsupported transfer coding");
        default:
            return fail(m, 400, "invalid Transfer-Encoding");
        }

    } else if (h.cl_error) {
        return fail(m, 400, h.cl_error);

    } else if (h.cl_seen && h.cl > 0) {
        m->body = RIC_BODY_LENGTH;
        m->content_length = h.cl;

    } else {
        m->body = RIC_BODY_NONE;
    }

    if (h.expect_count) {
        if (h.expect_other) {
            return fail(m, 417, "unsupported expectation");
        }
        /* 100-continue in HTTP/1.0 is to be ignored (RFC 9110 §10.1.1) */
        m->expect_continue = m->version == 11;
    }

    if (m->version == 11) {
        m->keep_alive = !h.conn_close;
    } else {
        m->keep_alive = h.conn_keep_alive && !h.conn_close;
    }
    m->close_asked = h.conn_close;
    m->upgrade = h.conn_upgrade && h.upgrade_field;

    return RIC_OK;
}

/* Response framing (RFC 9112 §6.3, in its order). */
static int
finish_response(ric_http_msg_t *m, const u_char *buf, ric_http_method_t request_method)
{
    head_info_t h;
    const char *reason;

    scan_fields(m, buf, &h);
    if (h.cl_error == NULL && h.cl_values > 1) {
        m->content_length_repeated = 1;
        m->content_length_value = h.cl;
    }

    if (request_method == RIC_HTTP_HEAD || m->status < 200 || m->status == 204
        || m->status == 304
        || (request_method == RIC_HTTP_CONNECT && m->status < 300))
    {
        /* any Content-Length here describes another message, not this one */
        m->body = RIC_BODY_NONE;

    } else if (h.te_count) {
        /* a list spread over several fields would be legal, but we are as
         * strict with upstreams as with clients */
        if ((reason = te_framing_error(&h, m->version)) != NULL) {
            return fail(m, 502, reason);
        }
        switch (parse_transfer_encoding(field_value(m, buf, h.te_index))) {
        case TE_CHUNKED:
        case TE_CODED_CHUNKED:
            m->body = RIC_BODY_CHUNKED;
            break;
        case TE_NOT_CHUNKED:
            m->body = RIC_BODY_CLOSE;
            break;
        default:
            return fail(m, 502, "invalid Transfer-Encoding");
        }

    } else if (h.cl_error) {
        return fail(m, 502, h.cl_error);

    } else if (h.cl_seen) {
        m->body = h.cl ? RIC_BODY_LENGTH : RIC_BODY_NONE;
        m->content_length = h.cl;

    } else {
        m->body = RIC_BODY_CLOSE;
    }

    if (m->version == 11) {
        m->keep_alive = !h.conn_close;
    } else {
        m->keep_alive = h.conn_keep_alive && !h.conn_close;
    }
    if (m->body == RIC_BODY_CLOSE) {
        m->keep_alive = 0;
    }
    m->upgrade = h.conn_upgrade && h.upgrade_field;

    return RIC_OK;
}

ric_str_t
ric_http_field(const ric_http_msg_t *m, const u_char *buf, const char *lower_name)
{
    const ric_http_field_t *f;
    ric_str_t none = ric_null_string;
    unsigned n;

    for (n = 0; n < m->nfields; n++) {
        f = &m->fields[n];
        if (ric_str_eq_lower(ric_http_span(buf, f->name_off, f->name_len), lower_name)) {
            return ric_http_span(buf, f->value_off, f->value_len);
        }
    }
    return none;
}

enum {
    C_SIZE_START = 0, /* first HEXDIG of a chunk-size */
    C_SIZE,
    C_EXT_NAME_START, /* the size-line states run from C_SIZE_START ... */
    C_EXT_NAME,
    C_EXT_VALUE_START,
    C_EXT_TOKEN,
    C_EXT_QUOTED,
    C_EXT_QUOTED_PAIR,
    C_EXT_QUOTED_END, /* ... to here */
    C_SIZE_LF,
    C_DATA,
    C_DATA_CR,
    C_DATA_LF,
    C_TRAILER_START,  /* the trailer states run from here ... */
    C_TRAILER_NAME,
    C_TRAILER_VALUE,
    C_TRAILER_LF,
    C_END_LF,         /* ... to here */
    C_DONE,
    C_ERROR
};

void
ric_http_chunked_init(ric_http_chunked_t *c)
{
    memset(c, 0, sizeof(*c));
}

static int
hex_value(u_char ch)
{
    return ch <= '9' ? ch - '0' : (ch | 0x20) - 'a' + 10;
}

/*
 * chunked-body = *chunk last-chunk trailer-section CRLF      (RFC 9112 §7.1)
 *
 * Stricter than the grammar in two places, on purpose: no BWS anywhere in
 * the size line (chunk-ext without whitespace around ";" and "="), and a
 * chunk-size of at most 16 digits whose value fits an int64_t. Trailer
 * fields are checked like header fields and then dropped: the gateway
 * never forwards them (a body relayed chunked ends before them:
 * http1_client.c), so nobody downstream can be told anything by them.
 */
int
ric_http_chunked_next(ric_http_chunked_t *c, const u_char **p, const u_char *end,
                      const u_char **data, size_t *data_len)
{
    const u_char *s = *p;
    size_t n;
    int state = c->state, v;
    u_char ch;

    *data = NULL;
    *data_len = 0;

    if (state == C_DONE) {
        return RIC_DONE;
    }
    if (state == C_ERROR) {
        return RIC_ERROR;
    }

    for (; s < end; s++) {
        if (state == C_DATA) {
            n = (size_t) (end - s);
            if (n > c->remaining) {
                n = (size_t) c->remaining;
            }
            c->remaining -= n;
            if (c->remaining == 0) {
                state = C_DATA_CR;
            }
            c->state = state;
            *data = s;
            *data_len = n;
            *p = s + n;
            return RIC_OK;
        }

        ch = *s;

        if (state >= C_SIZE_START && state <= C_EXT_QUOTED_END && ch != CR
            && ++c->line_len > RIC_HTTP_MAX_CHUNK_LINE)
        {
            goto failed;
        }
        if (state >= C_TRAILER_START && state <= C_END_LF
            && ++c->trailer_len > RIC_HTTP_MAX_TRAILER_BYTES)
        {
            goto failed;
        }

        switch (state) {

        case C_SIZE_START:
            if (!is_class(ch, CH_HEX)) {
                goto failed;
            }
            c->remaining = (uint64_t) hex_value(ch);
            c->ndigits = 1;
            state = C_SIZE;
            break;

        case C_SIZE:
            if (is_class(ch, CH_HEX)) {
                v = hex_value(ch);
                if (++c->ndigits > 16
                    || c->remaining > ((uint64_t) INT64_MAX - (uint64_t) v) >> 4)
                {
                    goto failed;
                }
                c->remaining = (c->remaining << 4) + (uint64_t) v;
                break;
            }
            if (ch == ';') {
                state = C_EXT_NAME_START;
                break;
            }
            if (ch != CR) {
                goto failed;
            }
            state = C_SIZE_LF;
            break;

        case C_EXT_NAME_START:
            if (!is_class(ch, CH_TCHAR)) {
                goto failed;
            }
            state = C_EXT_NAME;
            break;

        case C_EXT_NAME:
        case C_EXT_TOKEN:
            if (is_class(ch, CH_TCHAR)) {
                break;
            }
            if (ch == '=' && state == C_EXT_NAME) {
                state = C_EXT_VALUE_START;
                break;
            }
            /* fall through */

        case C_EXT_QUOTED_END:
            if (ch == ';') {
                state = C_EXT_NAME_START;
                break;
            }
            if (ch != CR) {
                goto failed;
            }
            state = C_SIZE_LF;
            break;

        case C_EXT_VALUE_START:
            if (ch == '"') {
                state = C_EXT_QUOTED;
                break;
            }
            if (!is_class(ch, CH_TCHAR)) {
                goto failed;
            }
            state = C_EXT_TOKEN;
            break;

        case C_EXT_QUOTED:
            if (ch == '"') {
                state = C_EXT_QUOTED_END;
                break;
            }
            if (ch == '\\') {
                state = C_EXT_QUOTED_PAIR;
                break;
            }
            if (!is_class(ch, CH_QDTEXT)) {
                goto failed;
            }
            break;

        case C_EXT_QUOTED_PAIR:
            if (!is_class(ch, CH_FIELD | CH_WS)) {
                goto failed;
            }
            state = C_EXT_QUOTED;
            break;

        case C_SIZE_LF:
            if (ch != LF) {
                goto failed;
            }
            c->line_len = 0;
            state = c->remaining ? C_DATA : C_TRAILER_START;
            break;

        case C_DATA_CR:
            /* anything but CRLF here means the size lied: "runaway data" */
            if (ch != CR) {
                goto failed;
            }
            state = C_DATA_LF;
            break;

        case C_DATA_LF:
            if (ch != LF) {
                goto failed;
            }
            state = C_SIZE_START;
            break;

        case C_TRAILER_START:
            if (ch == CR) {
                state = C_END_LF;
                break;
            }
            /* a leading SP/HTAB would be obs-fold: refused like in a head */
            if (!is_class(ch, CH_TCHAR)) {
                goto failed;
            }
            state = C_TRAILER_NAME;
            break;

        case C_TRAILER_NAME:
            if (ch == ':') {
                state = C_TRAILER_VALUE;
                break;
            }
            if (!is_class(ch, CH_TCHAR)) {
                goto failed;
            }
            break;

        case C_TRAILER_VALUE:
            if (ch == CR) {
                state = C_TRAILER_LF;
                break;
            }
            if (!is_class(ch, CH_FIELD | CH_WS)) {
                goto failed;
            }
            break;

        case C_TRAILER_LF:
            if (ch != LF) {
                goto failed;
            }
            state = C_TRAILER_START;
            break;

        case C_END_LF:
            if (ch != LF) {
                goto failed;
            }
            c->state = C_DONE;
            *p = s + 1;
            return RIC_DONE;

        default:
            ric_assert(0);
        }
    }

    c->state = state;
    *p = s;
    return RIC_AGAIN;

failed:
    c->state = C_ERROR;
    *p = s;
    return RIC_ERROR;
}

ric_http_method_t
ric_http_method_parse(const u_char *p, size_t len)
{
    static const struct {
        const char *name;
        size_t len;
        ric_http_method_t method;
    } methods[] = {
        { "GET", 3, RIC_HTTP_GET },
        { "HEAD", 4, RIC_HTTP_HEAD },
        { "POST", 4, RIC_HTTP_POST },
        { "PUT", 3, RIC_HTTP_PUT },
        { "DELETE", 6, RIC_HTTP_DELETE },
        { "OPTIONS", 7, RIC_HTTP_OPTIONS },
        { "TRACE", 5, RIC_HTTP_TRACE },
        { "CONNECT", 7, RIC_HTTP_CONNECT },
        { "PATCH", 5, RIC_HTTP_PATCH },
    };
    size_t i;

    /* method names are case-sensitive (RFC 9110 §9.1) */
    for (i = 0; i < ric_nelems(methods); i++) {
        if (len == methods[i].len && memcmp(p, methods[i].name, len) == 0) {
            return methods[i].method;
        }
    }
    return RIC_HTTP_METHOD_OTHER;
}

const char *
ric_http_status_text(int status)
{
    switch (status) {
    case 100: return "Continue";
    case 101: return "Switching Protocols";
    case 200: return "OK";
    case 201: return "Created";
    case 202: return "Accepted";
    case 203: return "Non-Authoritative Information";
    case 204: return "No Content";
    case 205: return "Reset Content";
    case 206: return "Partial Content";
    case 300: return "Multiple Choices";
    case 301: return "Moved Permanently";
    case 302: return "Found";
    case 303: return "See Other";
    case 304: return "Not Modified";
    case 305: return "Use Proxy";
    case 307: return "Temporary Redirect";
    case 308: return "Permanent Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 402: return "Payment Required";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 406: return "Not Acceptable";
    case 407: return "Proxy Authentication Required";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 410: return "Gone";
    case 411: return "Length Required";
    case 412: return "Precondition Failed";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 415: return "Unsupported Media Type";
    case 416: return "Range Not Satisfiable";
    case 417: return "Expectation Failed";
    case 421: return "Misdirected Request";
    case 422: return "Unprocessable Content";
    case 425: return "Too Early";
    case 426: return "Upgrade Required";
    case 428: return "Precondition Required";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    default: return "";
    }
}
