/* fuzz_http_parse.c: libFuzzer driver for the head parser and the chunked decoder. */
#include "http_parse.h"

#include <stdio.h>

/* The longest input that may still be RIC_AGAIN: leading empty lines, a
 * request line with CRLF, a whole field section. */
#define MAX_PENDING (256 + RIC_HTTP_MAX_REQUEST_LINE + 2 + RIC_HTTP_MAX_HEADER_BYTES)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Where to cut the input for a two-step feed: the byte scaled over the size,
 * so every cut is reachable whatever the input's length. */
static size_t
split_at(uint8_t sel, size_t size)
{
    return (size_t) sel * size / 255;
}

static int
is_tchar(u_char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
           || (c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

static void
check_span(uint32_t off, uint32_t len, uint32_t head_len)
{
    ric_assert(off <= head_len && len <= head_len - off);
}

/* What must hold of any result, whatever the input. */
static void
check_msg(const ric_http_msg_t *m, const u_char *buf, size_t len, int rc, int is_response)
{
    const ric_http_field_t *f;
    uint32_t i;
    unsigned n;

    if (rc == RIC_AGAIN) {
        ric_assert(m->pos == len);
        ric_assert(len <= MAX_PENDING);
        return;
    }

    if (rc == RIC_ERROR) {
        ric_assert(m->error_reason != NULL && m->error_reason[0] != '\0');
        if (is_response) {
            ric_assert(m->error_status == 502);
        } else {
            ric_assert(m->error_status == 400 || m->error_status == 414
                       || m->error_status == 417 || m->error_status == 431
                       || m->error_status == 501 || m->error_status == 505);
        }
        return;
    }

    ric_assert(rc == RIC_OK);
    ric_assert(m->head_len >= 4 && m->head_len <= len);
    ric_assert(memcmp(buf + m->head_len - 4, "\r\n\r\n", 4) == 0);
    ric_assert(m->version == 10 || m->version == 11);
    ric_assert(m->nfields <= RIC_HTTP_MAX_FIELDS);
    ric_assert(m->keep_alive == 0 || m->keep_alive == 1);
    ric_assert(m->upgrade == 0 || m->upgrade == 1);
    ric_assert(m->host_index >= -1 && m->host_index < (int) m->nfields);

    if (m->body == RIC_BODY_LENGTH) {
        ric_assert(m->content_length > 0 && m->content_length <= (uint64_t) INT64_MAX);
    } else {
        ric_assert(m->body == RIC_BODY_NONE || m->body == RIC_BODY_CHUNKED
                   || (is_response && m->body == RIC_BODY_CLOSE));
    }

    if (is_response) {
        ric_assert(m->status >= 100 && m->status <= 599);
        check_span(m->reason_off, m->reason_len, m->head_len);
        for (i = 0; i < m->reason_len; i++) {
            u_char c = buf[m->reason_off + i];
            ric_assert(c != '\r' && c != '\n' && c != '\0');
        }
        if (m->body == RIC_BODY_CLOSE) {
            ric_assert(m->keep_alive == 0);
        }
    } else {
        ric_assert(m->method_len > 0 && m->target_len > 0);
        check_span(m->method_off, m->method_len, m->head_len);
        check_span(m->target_off, m->target_len, m->head_len);
        ric_assert(m->path_len <= m->target_len);
        for (i = 0; i < m->method_len; i++) {
            ric_assert(is_tchar(buf[m->method_off + i]));
        }
        for (i = 0; i < m->target_len; i++) {
            u_char c = buf[m->target_off + i];
            ric_assert(c > 0x20 && c < 0x7f);
        }
        ric_assert(m->method
                   == ric_http_method_parse(buf + m->method_off, m->method_len));
        if (m->version == 11) {
            ric_assert(m->host_index >= 0);
        }
        if (m->expect_continue) {
            ric_assert(m->version == 11);
        }
    }

    for (n = 0; n < m->nfields; n++) {
        f = &m->fields[n];
        ric_assert(f->name_len > 0);
        check_span(f->name_off, f->name_len, m->head_len);
        check_span(f->value_off, f->value_len, m->head_len);
        for (i = 0; i < f->name_len; i++) {
            ric_assert(is_tchar(buf[f->name_off + i]));
        }
        for (i = 0; i < f->value_len; i++) {
            u_char c = buf[f->value_off + i];
            ric_assert(c != '\r' && c != '\n' && c != '\0');
            ric_assert(c >= 0x20 || c == '\t');
            ric_assert(c != 0x7f);
        }
        if (f->value_len) {
            u_char first = buf[f->value_off], last = buf[f->value_off + f->value_len - 1];
            ric_assert(first != ' ' && first != '\t' && last != ' ' && last != '\t');
        }
    }
    if (m->host_index >= 0) {
        ric_str_t h = ric_http_field(m, buf, "host");
        ric_assert(h.data == buf + m->fields[m->host_index].value_off);
    }
}

static int
parse(ric_http_msg_t *m, const u_char *buf, size_t len, int is_response,
      ric_http_method_t method)
{
    return is_response ? ric_http_parse_response(m, buf, len, method)
                       : ric_http_parse_request(m, buf, len);
}

/* One-shot, then the same input fed as a prefix (from a separate, freed
 * copy: a moved buffer) and then whole: the result must be identical. */
static void
fuzz_head(const u_char *buf, size_t len, int is_response, ric_http_method_t method,
          size_t split, ric_http_msg_t *one)
{
    ric_http_msg_t two;
    u_char *prefix;
    int rc1, rc2;

    /* zeroed first: ric_http_msg_init leaves the fields array as it was,
     * and the two are compared whole */
    memset(one, 0, sizeof(*one));
    memset(&two, 0, sizeof(two));
    ric_http_msg_init(one);
    rc1 = parse(one, buf, len, is_response, method);
    check_msg(one, buf, len, rc1, is_response);
    /* results stick */
    ric_assert(parse(one, buf, len, is_response, method) == rc1);

    ric_http_msg_init(&two);
    prefix = malloc(split ? split : 1);
    ric_assert(prefix != NULL);
    memcpy(prefix, buf, split);
    rc2 = parse(&two, prefix, split, is_response, method);
    check_msg(&two, prefix, split, rc2, is_response);
    free(prefix);
    if (rc2 == RIC_AGAIN) {
        rc2 = parse(&two, buf, len, is_response, method);
    }
    ric_assert(rc1 == rc2);
    ric_assert(memcmp(one, &two, sizeof(two)) == 0);
}

typedef struct {
    int rc;
    size_t consumed;
    size_t out_len;
} chunked_result_t;

/* Decodes buf[0..len) arriving as [0, split) then [split, len). */
static chunked_result_t
run_chunked(const u_char *buf, size_t len, size_t split, u_char *out)
{
    ric_http_chunked_t c;
    chunked_result_t r = { RIC_AGAIN, 0, 0 };
    const u_char *p = buf, *end = buf + split, *before, *data;
    size_t data_len;

    ric_http_chunked_init(&c);
    for (;;) {
        before = p;
        r.rc = ric_http_chunked_next(&c, &p, end, &data, &data_len);
        ric_assert(p >= before && p <= end);
        if (r.rc == RIC_OK) {
            ric_assert(data_len > 0 && data >= before && data + data_len == p);
            memcpy(out + r.out_len, data, data_len);
            r.out_len += data_len;
            continue;
        }
        if (r.rc == RIC_AGAIN) {
            ric_assert(p == end);
            if (end == buf + len) {
                break;
            }
            end = buf + len;
            continue;
        }
        ric_assert(r.rc == RIC_DONE || r.rc == RIC_ERROR);
        break;
    }
    r.consumed = (size_t) (p - buf);
    ric_assert(r.out_len <= r.consumed);
    return r;
}

static void
fuzz_chunked(const u_char *buf, size_t len, size_t split)
{
    chunked_result_t r1, r2;
    u_char *out1, *out2;

    out1 = malloc(len + 1);
    out2 = malloc(len + 1);
    ric_assert(out1 != NULL && out2 != NULL);

    r1 = run_chunked(buf, len, len, out1);
    r2 = run_chunked(buf, len, split, out2);
    ric_assert(r1.rc == r2.rc && r1.consumed == r2.consumed && r1.out_len == r2.out_len);
    ric_assert(memcmp(out1, out2, r1.out_len) == 0);
    if (r1.rc == RIC_DONE) {
        ric_assert(r1.consumed >= 5); /* "0\r\n\r\n" at least */
        ric_assert(memcmp(buf + r1.consumed - 2, "\r\n", 2) == 0);
    }

    free(out1);
    free(out2);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const ric_http_method_t methods[] = {
        RIC_HTTP_GET, RIC_HTTP_HEAD, RIC_HTTP_CONNECT, RIC_HTTP_POST,
    };
    ric_http_msg_t m;
    size_t split_first, split_last, body;

    if (size == 0) {
        ric_http_msg_init(&m);
        ric_assert(ric_http_parse_request(&m, data, 0) == RIC_AGAIN);
        return 0;
    }

    split_first = split_at(data[0], size);
    split_last = split_at(data[size - 1], size);

    fuzz_head(data, size, 0, RIC_HTTP_GET, split_first, &m);
    if (ric_http_parse_request(&m, data, size) == RIC_OK && m.body == RIC_BODY_CHUNKED) {
        /* the body right after the head, with any pipelined bytes after it */
        body = m.head_len;
        fuzz_chunked(data + body, size - body, split_at(data[0], size - body));
    }

    fuzz_head(data, size, 1, methods[size % ric_nelems(methods)], split_last, &m);

    fuzz_chunked(data, size, split_first);
    fuzz_chunked(data, size, split_last);

    return 0;
}
