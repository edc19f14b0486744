/* test_http_parse.c: table-driven tests of the HTTP/1.1 head parser and chunked decoder. */
#include "unit.h"

#include "../../core/http_parse.c"

#include <stdio.h>

/* A literal and its length, so rows may hold NUL bytes. */
#define S(s) s, sizeof(s) - 1

#define REQ_HEAD "GET / HTTP/1.1\r\nHost: a\r\n"

typedef struct {
    const char *name;
    const char *in;
    size_t len;
    int rc;
    int status; /* error_status when rc is RIC_ERROR */
} head_case_t;

static const head_case_t request_cases[] = {
    /* well-formed */
    { "minimal GET", S("GET / HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_OK, 0 },
    { "HTTP/1.0 without Host", S("GET / HTTP/1.0\r\n\r\n"), RIC_OK, 0 },
    { "leading empty lines", S("\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_OK, 0 },
    { "unknown method token", S("PURGE /x HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_OK, 0 },
    { "lowercase method is a token", S("get / HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_OK, 0 },
    { "HTTP/1.2 is 1.1", S("GET / HTTP/1.2\r\nHost: a\r\n\r\n"), RIC_OK, 0 },
    { "OPTIONS *", S("OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_OK, 0 },
    { "CONNECT authority", S("CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n"), RIC_OK, 0 },
    { "CONNECT IPv6 authority", S("CONNECT [::1]:443 HTTP/1.1\r\nHost: [::1]:443\r\n\r\n"), RIC_OK, 0 },
    { "absolute-form http", S("GET http://a/x?y HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_OK, 0 },
    { "absolute-form HTTPS", S("GET HTTPS://a/ HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_OK, 0 },
    { "empty value", S(REQ_HEAD "X-Empty:\r\n\r\n"), RIC_OK, 0 },
    { "value only OWS", S(REQ_HEAD "X-Empty: \t \r\n\r\n"), RIC_OK, 0 },
    { "obs-text in value", S(REQ_HEAD "X-Latin: caf\xe9\r\n\r\n"), RIC_OK, 0 },
    { "empty Host", S("GET / HTTP/1.1\r\nHost:\r\n\r\n"), RIC_OK, 0 },
    { "CL identical duplicate fields", S(REQ_HEAD "Content-Length: 5\r\nContent-Length: 5\r\n\r\n"), RIC_OK, 0 },
    { "CL identical list", S(REQ_HEAD "Content-Length: 5, 5\r\n\r\n"), RIC_OK, 0 },
    { "CL INT64_MAX", S(REQ_HEAD "Content-Length: 9223372036854775807\r\n\r\n"), RIC_OK, 0 },
    { "TE chunked any case", S(REQ_HEAD "Transfer-Encoding: Chunked\r\n\r\n"), RIC_OK, 0 },
    { "Expect 100-continue", S(REQ_HEAD "Expect: 100-Continue\r\n\r\n"), RIC_OK, 0 },

    /* incomplete */
    { "empty input", S(""), RIC_AGAIN, 0 },
    { "partial method", S("GE"), RIC_AGAIN, 0 },
    { "partial version", S("GET / HTTP/1."), RIC_AGAIN, 0 },
    { "request line CR only", S("GET / HTTP/1.1\r"), RIC_AGAIN, 0 },
    { "no final CRLF", S(REQ_HEAD), RIC_AGAIN, 0 },
    { "final CR only", S(REQ_HEAD "\r"), RIC_AGAIN, 0 },

    /* line endings */
    { "bare LF after request line", S("GET / HTTP/1.1\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "bare LF after field", S("GET / HTTP/1.1\r\nHost: a\n\r\n"), RIC_ERROR, 400 },
    { "bare LF ending head", S(REQ_HEAD "\n"), RIC_ERROR, 400 },
    { "bare LF leading line", S("\nGET / HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "bare CR in leading line", S("\rGET / HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "bare CR after request line", S("GET / HTTP/1.1\rHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "bare CR ending head", S(REQ_HEAD "\rX"), RIC_ERROR, 400 },
    { "leading SP", S(" GET / HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },

    /* method */
    { "method with (", S("GE(T / HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "method with SP", S("G T / HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "method with NUL", S("G\0T / HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "method then CRLF", S("GET\r\n"), RIC_ERROR, 400 },

    /* target */
    { "target control char", S("GET /a\x01 HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "target DEL", S("GET /a\x7f HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "target NUL", S("GET /a\0 HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "target HTAB", S("GET /a\tb HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "target byte >= 0x80", S("GET /caf\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "two spaces before target", S("GET  / HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "target not a form", S("GET a/b HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "asterisk without OPTIONS", S("GET * HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "asterisk with more", S("OPTIONS *x HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "authority without CONNECT", S("GET a:80 HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "CONNECT origin-form", S("CONNECT / HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "CONNECT without port", S("CONNECT a HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "CONNECT empty port", S("CONNECT a: HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "CONNECT bad port", S("CONNECT a:8x HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "CONNECT userinfo", S("CONNECT u@a:80 HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "other scheme", S("GET ftp://a/ HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "scheme without authority", S("GET http:// HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "scheme, empty authority", S("GET http:///x HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "scheme, userinfo", S("GET http://u@a/ HTTP/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },

    /* version */
    { "version lowercase", S("GET / http/1.1\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "version trailing SP", S("GET / HTTP/1.1 \r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "version HTTP/11", S("GET / HTTP/11\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "version missing", S("GET /\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "version missing after SP", S("GET / \r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "version two digits", S("GET / HTTP/1.10\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "version letter", S("GET / HTTP/1.x\r\nHost: a\r\n\r\n"), RIC_ERROR, 400 },
    { "version HTTP/2.0", S("GET / HTTP/2.0\r\nHost: a\r\n\r\n"), RIC_ERROR, 505 },
    { "version HTTP/3.0", S("GET / HTTP/3.0\r\nHost: a\r\n\r\n"), RIC_ERROR, 505 },
    { "version HTTP/0.9", S("GET / HTTP/0.9\r\n\r\n"), RIC_ERROR, 505 },

    /* fields */
    { "obs-fold", S(REQ_HEAD "X: a\r\n b\r\n\r\n"), RIC_ERROR, 400 },
    { "obs-fold HTAB", S(REQ_HEAD "X: a\r\n\tb\r\n\r\n"), RIC_ERROR, 400 },
    { "space before first field", S("GET / HTTP/1.1\r\n Host: a\r\n\r\n"), RIC_ERROR, 400 },
    { "space before colon", S(REQ_HEAD "X : a\r\n\r\n"), RIC_ERROR, 400 },
    { "HTAB before colon", S(REQ_HEAD "X\t: a\r\n\r\n"), RIC_ERROR, 400 },
    { "empty name", S(REQ_HEAD ": a\r\n\r\n"), RIC_ERROR, 400 },
    { "control char in name", S(REQ_HEAD "X\x01Y: a\r\n\r\n"), RIC_ERROR, 400 },
    { "separator in name", S(REQ_HEAD "X(Y): a\r\n\r\n"), RIC_ERROR, 400 },
    { "byte >= 0x80 in name", S(REQ_HEAD "X\xc3\xa9: a\r\n\r\n"), RIC_ERROR, 400 },
    { "name without colon", S(REQ_HEAD "X\r\n\r\n"), RIC_ERROR, 400 },
    { "CR in value", S(REQ_HEAD "X: a\rb\r\n\r\n"), RIC_ERROR, 400 },
    { "LF in value", S(REQ_HEAD "X: a\nb\r\n\r\n"), RIC_ERROR, 400 },
    { "NUL in value", S(REQ_HEAD "X: a\0b\r\n\r\n"), RIC_ERROR, 400 },
    { "control char in value", S(REQ_HEAD "X: a\x1b b\r\n\r\n"), RIC_ERROR, 400 },
    { "DEL in value", S(REQ_HEAD "X: a\x7f\r\n\r\n"), RIC_ERROR, 400 },
    { "control char first in value", S(REQ_HEAD "X: \x01a\r\n\r\n"), RIC_ERROR, 400 },
    { "LF first in value", S(REQ_HEAD "X: \na\r\n\r\n"), RIC_ERROR, 400 },

    /* Host */
    { "HTTP/1.1 without Host", S("GET / HTTP/1.1\r\nX: a\r\n\r\n"), RIC_ERROR, 400 },
    { "two Hosts", S(REQ_HEAD "Host: a\r\n\r\n"), RIC_ERROR, 400 },
    { "two Hosts HTTP/1.0", S("GET / HTTP/1.0\r\nHost: a\r\nhost: b\r\n\r\n"), RIC_ERROR, 400 },
    { "Host with space", S("GET / HTTP/1.1\r\nHost: a b\r\n\r\n"), RIC_ERROR, 400 },
    { "Host with slash", S("GET / HTTP/1.1\r\nHost: a/b\r\n\r\n"), RIC_ERROR, 400 },
    { "Host with userinfo", S("GET / HTTP/1.1\r\nHost: u@a\r\n\r\n"), RIC_ERROR, 400 },
    { "Host with obs-text", S("GET / HTTP/1.1\r\nHost: caf\xe9\r\n\r\n"), RIC_ERROR, 400 },

    /* Content-Length */
    { "CL plus sign", S(REQ_HEAD "Content-Length: +5\r\n\r\n"), RIC_ERROR, 400 },
    { "CL minus sign", S(REQ_HEAD "Content-Length: -5\r\n\r\n"), RIC_ERROR, 400 },
    { "CL hex", S(REQ_HEAD "Content-Length: 0x5\r\n\r\n"), RIC_ERROR, 400 },
    { "CL space inside", S(REQ_HEAD "Content-Length: 1 0\r\n\r\n"), RIC_ERROR, 400 },
    { "CL overflow", S(REQ_HEAD "Content-Length: 99999999999999999999\r\n\r\n"), RIC_ERROR, 400 },
    { "CL INT64_MAX + 1", S(REQ_HEAD "Content-Length: 9223372036854775808\r\n\r\n"), RIC_ERROR, 400 },
    { "CL empty", S(REQ_HEAD "Content-Length:\r\n\r\n"), RIC_ERROR, 400 },
    { "CL differing fields", S(REQ_HEAD "Content-Length: 5\r\nContent-Length: 6\r\n\r\n"), RIC_ERROR, 400 },
    { "CL differing list", S(REQ_HEAD "Content-Length: 5, 6\r\n\r\n"), RIC_ERROR, 400 },
    { "CL empty list element", S(REQ_HEAD "Content-Length: 5,\r\n\r\n"), RIC_ERROR, 400 },
    { "CL valid then invalid", S(REQ_HEAD "Content-Length: 5\r\nContent-Length: x\r\n\r\n"), RIC_ERROR, 400 },

    /* Transfer-Encoding */
    { "both CL and TE", S(REQ_HEAD "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"), RIC_ERROR, 400 },
    { "both TE and CL", S(REQ_HEAD "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"), RIC_ERROR, 400 },
    { "TE repeated", S(REQ_HEAD "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n"), RIC_ERROR, 400 },
    { "TE empty", S(REQ_HEAD "Transfer-Encoding:\r\n\r\n"), RIC_ERROR, 400 },
    { "TE empty element first", S(REQ_HEAD "Transfer-Encoding: , chunked\r\n\r\n"), RIC_ERROR, 400 },
    { "TE empty element last", S(REQ_HEAD "Transfer-Encoding: chunked,\r\n\r\n"), RIC_ERROR, 400 },
    { "TE gzip", S(REQ_HEAD "Transfer-Encoding: gzip\r\n\r\n"), RIC_ERROR, 400 },
    { "TE chunked, gzip", S(REQ_HEAD "Transfer-Encoding: chunked, gzip\r\n\r\n"), RIC_ERROR, 400 },
    { "TE gzip, chunked", S(REQ_HEAD "Transfer-Encoding: gzip, chunked\r\n\r\n"), RIC_ERROR, 501 },
    { "TE coding params, chunked", S(REQ_HEAD "Transfer-Encoding: x;a=\"b,c\" ; d = e, chunked\r\n\r\n"), RIC_ERROR, 501 },
    { "TE chunked, chunked", S(REQ_HEAD "Transfer-Encoding: chunked, chunked\r\n\r\n"), RIC_ERROR, 400 },
    { "TE chunked with params", S(REQ_HEAD "Transfer-Encoding: chunked;q=1\r\n\r\n"), RIC_ERROR, 400 },
    { "TE bad param", S(REQ_HEAD "Transfer-Encoding: gzip;a, chunked\r\n\r\n"), RIC_ERROR, 400 },
    { "TE empty param name", S(REQ_HEAD "Transfer-Encoding: gzip;=a, chunked\r\n\r\n"), RIC_ERROR, 400 },
    { "TE empty param value", S(REQ_HEAD "Transfer-Encoding: gzip;a=, chunked\r\n\r\n"), RIC_ERROR, 400 },
    { "TE quoted-pair param", S(REQ_HEAD "Transfer-Encoding: gzip;a=\"\\\"\\\\\", chunked\r\n\r\n"), RIC_ERROR, 501 },
    { "TE quoted-pair at end", S(REQ_HEAD "Transfer-Encoding: gzip;a=\"\\\r\n\r\n"), RIC_ERROR, 400 },
    { "TE unterminated quote", S(REQ_HEAD "Transfer-Encoding: gzip;a=\"b, chunked\r\n\r\n"), RIC_ERROR, 400 },
    { "TE not a token", S(REQ_HEAD "Transfer-Encoding: chun ked\r\n\r\n"), RIC_ERROR, 400 },
    { "TE in HTTP/1.0", S("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"), RIC_ERROR, 400 },

    /* Expect */
    { "Expect other", S(REQ_HEAD "Expect: 200-ok\r\n\r\n"), RIC_ERROR, 417 },
    { "Expect empty", S(REQ_HEAD "Expect:\r\n\r\n"), RIC_ERROR, 417 },
    { "Expect 100-continue and other", S(REQ_HEAD "Expect: 100-continue\r\nExpect: x\r\n\r\n"), RIC_ERROR, 417 },
};

typedef struct {
    const char *name;
    const char *in;
    size_t len;
    ric_http_method_t method;
    const char *method_name;
    const char *target;
    uint32_t path_len;
    int version;
    uint32_t head_len; /* 0: the whole input */
    ric_http_body_t body;
    uint64_t content_length;
    int keep_alive;
    int expect_continue;
    int host_index;
    int upgrade;
    unsigned nfields;
    const char *fields[8]; /* name, value pairs in order */
} request_value_case_t;

static const request_value_case_t request_value_cases[] = {
    { "GET with query and OWS",
      S("\r\nGET /a/b?c=d&e HTTP/1.1\r\nHost:  example.com:8080 \t\r\nX-Two:\ta  b\t\r\n"
        "Accept:*/*\r\n\r\n"),
      RIC_HTTP_GET, "GET", "/a/b?c=d&e", 4, 11, 0, RIC_BODY_NONE, 0, 1, 0, 0, 0, 3,
      { "Host", "example.com:8080", "X-Two", "a  b", "Accept", "*/*" } },
    { "POST with Content-Length and pipelined bytes",
      S("POST /submit HTTP/1.1\r\nContent-Length: 11\r\nhost: h\r\n\r\nhello worldGET"),
      RIC_HTTP_POST, "POST", "/submit", 7, 11, 54, RIC_BODY_LENGTH, 11, 1, 0, 1, 0, 2,
      { "Content-Length", "11", "host", "h" } },
    { "Content-Length 0 has no body",
      S("PUT /x HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n"),
      RIC_HTTP_PUT, "PUT", "/x", 2, 11, 0, RIC_BODY_NONE, 0, 1, 0, 0, 0, 2,
      { "Host", "h", "Content-Length", "0" } },
    { "identical Content-Length values",
      S("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 7 , 7\r\nContent-Length: 7\r\n\r\n"),
      RIC_HTTP_POST, "POST", "/", 1, 11, 0, RIC_BODY_LENGTH, 7, 1, 0, 0, 0, 3,
      { "Host", "h", "Content-Length", "7 , 7", "Content-Length", "7" } },
    { "chunked with Expect, Connection close",
      S("PATCH /p HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
        "Expect: 100-continue\r\nConnection: foo, Close\r\n\r\n"),
      RIC_HTTP_PATCH, "PATCH", "/p", 2, 11, 0, RIC_BODY_CHUNKED, 0, 0, 1, 0, 0, 4,
      { "Host", "h", "Transfer-Encoding", "chunked", "Expect", "100-continue",
        "Connection", "foo, Close" } },
    { "HTTP/1.0 keep-alive",
      S("HEAD / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"),
      RIC_HTTP_HEAD, "HEAD", "/", 1, 10, 0, RIC_BODY_NONE, 0, 1, 0, -1, 0, 1,
      { "Connection", "Keep-Alive" } },
    { "HTTP/1.0 default close, Expect ignored",
      S("DELETE /d HTTP/1.0\r\nExpect: 100-continue\r\n\r\n"),
      RIC_HTTP_DELETE, "DELETE", "/d", 2, 10, 0, RIC_BODY_NONE, 0, 0, 0, -1, 0, 1,
      { "Expect", "100-continue" } },
    { "HTTP/1.0 close wins over keep-alive",
      S("GET / HTTP/1.0\r\nConnection: keep-alive\r\nConnection: close\r\n\r\n"),
      RIC_HTTP_GET, "GET", "/", 1, 10, 0, RIC_BODY_NONE, 0, 0, 0, -1, 0, 2,
      { "Connection", "keep-alive", "Connection", "close" } },
    { "upgrade",
      S("GET /ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"),
      RIC_HTTP_GET, "GET", "/ws", 3, 11, 0, RIC_BODY_NONE, 0, 1, 0, 0, 1, 3,
      { "Host", "h", "Upgrade", "websocket", "Connection", "Upgrade" } },
    { "Connection upgrade without Upgrade",
      S("GET / HTTP/1.1\r\nConnection: upgrade\r\nHost: h\r\n\r\n"),
      RIC_HTTP_GET, "GET", "/", 1, 11, 0, RIC_BODY_NONE, 0, 1, 0, 1, 0, 2,
      { "Connection", "upgrade", "Host", "h" } },
    { "OPTIONS asterisk",
      S("OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n"),
      RIC_HTTP_OPTIONS, "OPTIONS", "*", 1, 11, 0, RIC_BODY_NONE, 0, 1, 0, 0, 0, 1,
      { "Host", "h" } },
    { "CONNECT",
      S("CONNECT h:443 HTTP/1.1\r\nHost: h:443\r\n\r\n"),
      RIC_HTTP_CONNECT, "CONNECT", "h:443", 5, 11, 0, RIC_BODY_NONE, 0, 1, 0, 0, 0, 1,
      { "Host", "h:443" } },
    { "absolute-form, path_len before query",
      S("TRACE http://h/x?q HTTP/1.2\r\nHost: h\r\n\r\n"),
      RIC_HTTP_TRACE, "TRACE", "http://h/x?q", 10, 11, 0, RIC_BODY_NONE, 0, 1, 0, 0, 0, 1,
      { "Host", "h" } },
    { "unknown method, empty value, obs-text",
      S("M-SEARCH /?a?b HTTP/1.1\r\nX-E: \r\nHost: h\r\nX-O: \xff\xfe \r\n\r\n"),
      RIC_HTTP_METHOD_OTHER, "M-SEARCH", "/?a?b", 1, 11, 0, RIC_BODY_NONE, 0, 1, 0, 1, 0, 3,
      { "X-E", "", "Host", "h", "X-O", "\xff\xfe" } },
};

typedef struct {
    const char *name;
    const char *in;
    size_t len;
    ric_http_method_t request_method;
    int rc;
    int status;             /* RIC_OK: the status code; RIC_ERROR: error_status */
    ric_http_body_t body;
    uint64_t content_length;
    int keep_alive;
    const char *reason;
} response_case_t;

static const response_case_t response_cases[] = {
    { "200 with Content-Length", S("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"),
      RIC_HTTP_GET, RIC_OK, 200, RIC_BODY_LENGTH, 5, 1, "OK" },
    { "no reason, no SP", S("HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n"),
      RIC_HTTP_GET, RIC_OK, 200, RIC_BODY_NONE, 0, 1, "" },
    { "empty reason", S("HTTP/1.1 404 \r\nContent-Length: 1\r\n\r\n"),
      RIC_HTTP_GET, RIC_OK, 404, RIC_BODY_LENGTH, 1, 1, "" },
    { "reason with spaces and obs-text", S("HTTP/1.1 503 Service \xe9 Unavailable\r\nContent-Length: 0\r\n\r\n"),
      RIC_HTTP_GET, RIC_OK, 503, RIC_BODY_NONE, 0, 1, "Service \xe9 Unavailable" },
    { "chunked", S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
      RIC_HTTP_GET, RIC_OK, 200, RIC_BODY_CHUNKED, 0, 1, "OK" },
    { "gzip, chunked", S("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
      RIC_HTTP_POST, RIC_OK, 200, RIC_BODY_CHUNKED, 0, 1, "OK" },
    { "TE gzip reads to close", S("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n"),
      RIC_HTTP_GET, RIC_OK, 200, RIC_BODY_CLOSE, 0, 0, "OK" },
    { "TE chunked, gzip reads to close", S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"),
      RIC_HTTP_GET, RIC_OK, 200, RIC_BODY_CLOSE, 0, 0, "OK" },
    { "no framing reads to close", S("HTTP/1.1 200 OK\r\nX: y\r\n\r\n"),
      RIC_HTTP_GET, RIC_OK, 200, RIC_BODY_CLOSE, 0, 0, "OK" },
    { "HEAD has no body", S("HTTP/1.1 200 OK\r\nContent-Length: 42\r\n\r\n"),
      RIC_HTTP_HEAD, RIC_OK, 200, RIC_BODY_NONE, 0, 1, "OK" },
    { "204 has no body", S("HTTP/1.1 204 No Content\r\n\r\n"),
      RIC_HTTP_GET, RIC_OK, 204, RIC_BODY_NONE, 0, 1, "No Content" },
    { "304 has no body", S("HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n"),
      RIC_HTTP_GET, RIC_OK, 304, RIC_BODY_NONE, 0, 1, "Not Modified" },
    { "100 has no body", S("HTTP/1.1 100 Continue\r\n\r\n"),
      RIC_HTTP_POST, RIC_OK, 100, RIC_BODY_NONE, 0, 1, "Continue" },
    { "CONNECT 200 has no body", S("HTTP/1.1 200 Connection Established\r\n\r\n"),
      RIC_HTTP_CONNECT, RIC_OK, 200, RIC_BODY_NONE, 0, 1, "Connection Established" },
    { "CONNECT 407 has a body", S("HTTP/1.1 407 Auth\r\nContent-Length: 3\r\n\r\n"),
      RIC_HTTP_CONNECT, RIC_OK, 407, RIC_BODY_LENGTH, 3, 1, "Auth" },
    { "HTTP/1.0 default close", S("HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n"),
      RIC_HTTP_GET, RIC_OK, 200, RIC_BODY_LENGTH, 2, 0, "OK" },
    { "HTTP/1.0 keep-alive", S("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n"),
      RIC_HTTP_GET, RIC_OK, 200, RIC_BODY_LENGTH, 2, 1, "OK" },
    { "Connection close", S("HTTP/1.1 500 Oops\r\nConnection: close\r\nContent-Length: 2\r\n\r\n"),
      RIC_HTTP_GET, RIC_OK, 500, RIC_BODY_LENGTH, 2, 0, "Oops" },
    { "identical CL list", S("HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\n"),
      RIC_HTTP_GET, RIC_OK, 200, RIC_BODY_LENGTH, 3, 1, "OK" },
    { "HTTP/1.9 is 1.1", S("HTTP/1.9 200 OK\r\nContent-Length: 1\r\n\r\n"),
      RIC_HTTP_GET, RIC_OK, 200, RIC_BODY_LENGTH, 1, 1, "OK" },
    { "partial", S("HTTP/1.1 200 OK\r\nContent-Len"),
      RIC_HTTP_GET, RIC_AGAIN, 0, RIC_BODY_NONE, 0, 0, NULL },

    { "TE and CL", S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"),
      RIC_HTTP_GET, RIC_ERROR, 502, RIC_BODY_NONE, 0, 0, NULL },
    { "TE repeated", S("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"),
      RIC_HTTP_GET, RIC_ERROR, 502, RIC_BODY_NONE, 0, 0, NULL },
    { "TE chunked twice", S("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n"),
      RIC_HTTP_GET, RIC_ERROR, 502, RIC_BODY_NONE, 0, 0, NULL },
    { "TE in HTTP/1.0", S("HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
      RIC_HTTP_GET, RIC_ERROR, 502, RIC_BODY_NONE, 0, 0, NULL },
    { "CL differing", S("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 4\r\n\r\n"),
      RIC_HTTP_GET, RIC_ERROR, 502, RIC_BODY_NONE, 0, 0, NULL },
    { "CL negative", S("HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"),
      RIC_HTTP_GET, RIC_ERROR, 502, RIC_BODY_NONE, 0, 0, NULL },
    { "status 600", S("HTTP/1.1 600 X\r\n\r\n"), RIC_HTTP_GET, RIC_ERROR, 502, RIC_BODY_NONE, 0, 0, NULL },
    { "status 099", S("HTTP/1.1 099 X\r\n\r\n"), RIC_HTTP_GET, RIC_ERROR, 502, RIC_BODY_NONE, 0, 0, NULL },
    { "status two digits", S("HTTP/1.1 20 OK\r\n\r\n"), RIC_HTTP_GET, RIC_ERROR, 502, RIC_BODY_NONE, 0, 0, NULL },
    { "status four digits", S("HTTP/1.1 2000 OK\r\n\r\n"), RIC_HTTP_GET, RIC_ERROR, 502, RIC_BODY_NONE, 0, 0, NULL },
    { "status missing", S("HTTP/1.1 \r\n\r\n"), RIC_HTTP_GET, RIC_ERROR, 502, RIC_BODY_NONE, 0, 0, NULL },
    { "HTTP/2.0", S("HTTP/2.0 200 OK\r\n\r\n"), RIC_HTTP_GET, RIC_ERROR, 502, RIC_BODY_NONE, 0, 0, NULL },
    { "lowercase version", S("http/1.1 200 OK\r\n\r\n"), RIC_HTTP_GET, RIC_ERROR, 502, RIC_BODY_NONE, 0, 0, NULL },
    { "leading empty line", S("\r\nHTTP/1.1 200 OK\r\n\r\n"), RIC_HTTP_GET, RIC_ERROR, 502, RIC_BODY_NONE, 0, 0, NULL },
    { "bare LF", S("HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n"), RIC_HTTP_GET, RIC_ERROR, 502, RIC_BODY_NONE, 0, 0, NULL },
    { "control char in reason", S("HTTP/1.1 200 O\x01K\r\n\r\n"), RIC_HTTP_GET, RIC_ERROR, 502, RIC_BODY_NONE, 0, 0, NULL },
    { "LF after status", S("HTTP/1.1 200\nX: y\r\n\r\n"), RIC_HTTP_GET, RIC_ERROR, 502, RIC_BODY_NONE, 0, 0, NULL },
    { "LF after reason", S("HTTP/1.1 200 OK\nX: y\r\n\r\n"), RIC_HTTP_GET, RIC_ERROR, 502, RIC_BODY_NONE, 0, 0, NULL },
    { "LF after version", S("HTTP/1.1\n"), RIC_HTTP_GET, RIC_ERROR, 502, RIC_BODY_NONE, 0, 0, NULL },
    { "obs-fold", S("HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n"), RIC_HTTP_GET, RIC_ERROR, 502, RIC_BODY_NONE, 0, 0, NULL },
    { "NUL in value", S("HTTP/1.1 200 OK\r\nX: a\0\r\n\r\n"), RIC_HTTP_GET, RIC_ERROR, 502, RIC_BODY_NONE, 0, 0, NULL },
};

typedef struct {
    const char *name;
    const char *in;
    size_t len;
    int rc;
    const char *data; /* all chunk data returned, concatenated */
    size_t consumed;  /* where *p stopped on RIC_DONE or RIC_ERROR */
} chunked_case_t;

static const chunked_case_t chunked_cases[] = {
    { "one chunk", S("5\r\nhello\r\n0\r\n\r\n"), RIC_DONE, "hello", 15 },
    { "pipelined bytes stay", S("5\r\nhello\r\n0\r\n\r\nGET / HTTP/1.1\r\n"), RIC_DONE, "hello", 15 },
    { "two chunks, uppercase hex", S("A\r\n0123456789\r\n3\r\nabc\r\n0\r\n\r\n"), RIC_DONE, "0123456789abc", 28 },
    { "lowercase hex", S("a\r\n0123456789\r\n0\r\n\r\n"), RIC_DONE, "0123456789", 20 },
    { "leading zeros", S("005\r\nhello\r\n000\r\n\r\n"), RIC_DONE, "hello", 19 },
    { "16 hex digits", S("0000000000000005\r\nhello\r\n0\r\n\r\n"), RIC_DONE, "hello", 30 },
    { "data with CRLF inside", S("4\r\n\r\n\r\n\r\n0\r\n\r\n"), RIC_DONE, "\r\n\r\n", 14 },
    { "extensions", S("5;a;b=c;d=\"q \\\" ;\"\r\nhello\r\n0;last\r\n\r\n"), RIC_DONE, "hello", 37 },
    { "trailers discarded", S("1\r\nx\r\n0\r\nX-Sum: abc\r\nY:\r\n\r\nNEXT"), RIC_DONE, "x", 27 },
    { "empty body", S("0\r\n\r\n"), RIC_DONE, "", 5 },
    { "INT64_MAX size", S("7fffffffffffffff\r\nabc"), RIC_AGAIN, "abc", 21 },
    { "partial data", S("5\r\nhel"), RIC_AGAIN, "hel", 6 },
    { "after data, before CRLF", S("5\r\nhello"), RIC_AGAIN, "hello", 8 },
    { "partial trailers", S("0\r\nX: y\r\n"), RIC_AGAIN, "", 9 },

    { "0x prefix", S("0x5\r\nhello\r\n0\r\n\r\n"), RIC_ERROR, "", 1 },
    { "plus sign", S("+5\r\nhello\r\n0\r\n\r\n"), RIC_ERROR, "", 0 },
    { "minus sign", S("-5\r\nhello\r\n0\r\n\r\n"), RIC_ERROR, "", 0 },
    { "leading space", S(" 5\r\nhello\r\n0\r\n\r\n"), RIC_ERROR, "", 0 },
    { "trailing space", S("5 \r\nhello\r\n0\r\n\r\n"), RIC_ERROR, "", 1 },
    { "space before ext", S("5 ;a\r\nhello\r\n0\r\n\r\n"), RIC_ERROR, "", 1 },
    { "space in ext", S("5; a=b\r\nhello\r\n0\r\n\r\n"), RIC_ERROR, "", 2 },
    { "empty size", S("\r\nhello\r\n0\r\n\r\n"), RIC_ERROR, "", 0 },
    { "17 hex digits", S("00000000000000005\r\nhello\r\n0\r\n\r\n"), RIC_ERROR, "", 16 },
    { "size over INT64_MAX", S("8000000000000000\r\n"), RIC_ERROR, "", 15 },
    { "missing CRLF after size", S("5hello\r\n0\r\n\r\n"), RIC_ERROR, "", 1 },
    { "LF alone after size", S("5\nhello\r\n0\r\n\r\n"), RIC_ERROR, "", 1 },
    { "CR without LF after size", S("5\rhello\r\n0\r\n\r\n"), RIC_ERROR, "", 2 },
    { "runaway data", S("5\r\nhelloworld\r\n0\r\n\r\n"), RIC_ERROR, "hello", 8 },
    { "LF alone after data", S("5\r\nhello\n0\r\n\r\n"), RIC_ERROR, "hello", 8 },
    { "CR then junk after data", S("5\r\nhello\rX0\r\n\r\n"), RIC_ERROR, "hello", 9 },
    { "bare CR in extension", S("5;a\rb\r\nhello\r\n0\r\n\r\n"), RIC_ERROR, "", 4 },
    { "LF alone in extension", S("5;a\nhello\r\n0\r\n\r\n"), RIC_ERROR, "", 3 },
    { "NUL in extension", S("5;a=b\0\r\nhello\r\n0\r\n\r\n"), RIC_ERROR, "", 5 },
    { "control char in quoted ext", S("5;a=\"b\x01\"\r\nhello\r\n0\r\n\r\n"), RIC_ERROR, "", 6 },
    { "quoted-pair with control char", S("5;a=\"\\\x01\"\r\nhello\r\n0\r\n\r\n"), RIC_ERROR, "", 6 },
    { "trailer control char in value", S("0\r\nX: a\x01\r\n\r\n"), RIC_ERROR, "", 7 },
    { "trailer CR without LF", S("0\r\nX: a\rX\r\n\r\n"), RIC_ERROR, "", 8 },
    { "empty ext name", S("5;=b\r\nhello\r\n0\r\n\r\n"), RIC_ERROR, "", 2 },
    { "empty ext value", S("5;a=\r\nhello\r\n0\r\n\r\n"), RIC_ERROR, "", 4 },
    { "junk after quoted ext", S("5;a=\"b\"c\r\nhello\r\n0\r\n\r\n"), RIC_ERROR, "", 7 },
    { "trailer obs-fold", S("0\r\nX: a\r\n b\r\n\r\n"), RIC_ERROR, "", 9 },
    { "trailer bad name", S("0\r\nX Y: a\r\n\r\n"), RIC_ERROR, "", 4 },
    { "trailer bare LF", S("0\r\nX: a\n\r\n"), RIC_ERROR, "", 7 },
    { "trailer NUL", S("0\r\nX: \0\r\n\r\n"), RIC_ERROR, "", 6 },
    { "end without LF", S("0\r\n\rX"), RIC_ERROR, "", 4 },
};

typedef int (*parse_fn_t)(ric_http_msg_t *m, const u_char *buf, size_t len,
                          ric_http_method_t method);

static int
parse_request(ric_http_msg_t *m, const u_char *buf, size_t len, ric_http_method_t method)
{
    (void) method;
    return ric_http_parse_request(m, buf, len);
}

static int
parse_response(ric_http_msg_t *m, const u_char *buf, size_t len, ric_http_method_t method)
{
    return ric_http_parse_response(m, buf, len, method);
}

/* Feeds the input growing by one byte, in place and then through a fresh
 * copy per call (a moved buffer), and checks both end exactly where the
 * one-shot parse did: same result code and the very same message state. */
static void
check_incremental(parse_fn_t parse, const char *in, size_t len, ric_http_method_t method)
{
    ric_http_msg_t one, step;
    u_char *copy;
    size_t n;
    int rc1, rc2;

    /* zeroed first: ric_http_msg_init leaves the fields array as it was,
     * and the comparison is of the whole struct */
    memset(&one, 0, sizeof(one));
    memset(&step, 0, sizeof(step));
    ric_http_msg_init(&one);
    rc1 = parse(&one, (const u_char *) in, len, method);

    ric_http_msg_init(&step);
    rc2 = parse(&step, (const u_char *) in, 0, method);
    for (n = 1; n <= len && rc2 == RIC_AGAIN; n++) {
        rc2 = parse(&step, (const u_char *) in, n, method);
    }
    UNIT_CHECK_INT(rc2, rc1);
    UNIT_CHECK(memcmp(&one, &step, sizeof(one)) == 0);

    memset(&step, 0, sizeof(step));
    ric_http_msg_init(&step);
    rc2 = RIC_AGAIN;
    for (n = 1; n <= len && rc2 == RIC_AGAIN; n++) {
        copy = ric_xmalloc(n);
        memcpy(copy, in, n);
        rc2 = parse(&step, copy, n, method);
        free(copy);
    }
    if (len == 0) {
        rc2 = parse(&step, (const u_char *) in, 0, method);
    }
    UNIT_CHECK_INT(rc2, rc1);
    UNIT_CHECK(memcmp(&one, &step, sizeof(one)) == 0);
}

static void
test_request_table(void)
{
    ric_http_msg_t m;
    size_t i;
    int rc;

    for (i = 0; i < ric_nelems(request_cases); i++) {
        const head_case_t *t = &request_cases[i];

        UNIT_CASE(t->name);
        ric_http_msg_init(&m);
        rc = ric_http_parse_request(&m, (const u_char *) t->in, t->len);
        UNIT_CHECK_INT(rc, t->rc);
        if (t->rc == RIC_ERROR) {
            UNIT_CHECK_INT(m.error_status, t->status);
            UNIT_CHECK(m.error_reason != NULL && m.error_reason[0] != '\0');
            /* an error sticks */
            UNIT_CHECK_INT(ric_http_parse_request(&m, (const u_char *) t->in, t->len),
                           RIC_ERROR);
        }
        if (t->rc == RIC_OK) {
            UNIT_CHECK_INT(m.head_len, t->len);
            UNIT_CHECK_INT(ric_http_parse_request(&m, (const u_char *) t->in, t->len),
                           RIC_OK);
        }
        check_incremental(parse_request, t->in, t->len, RIC_HTTP_GET);
    }
}

static int
span_is(const u_char *buf, uint32_t off, uint32_t len, const char *want)
{
    return len == strlen(want) && memcmp(buf + off, want, len) == 0;
}

static void
test_request_values(void)
{
    ric_http_msg_t m;
    const u_char *b;
    unsigned k;
    size_t i;

    for (i = 0; i < ric_nelems(request_value_cases); i++) {
        const request_value_case_t *t = &request_value_cases[i];

        UNIT_CASE(t->name);
        b = (const u_char *) t->in;
        ric_http_msg_init(&m);
        UNIT_CHECK_INT(ric_http_parse_request(&m, b, t->len), RIC_OK);
        UNIT_CHECK_INT(m.is_response, 0);
        UNIT_CHECK_INT(m.method, t->method);
        UNIT_CHECK(span_is(b, m.method_off, m.method_len, t->method_name));
        UNIT_CHECK(span_is(b, m.target_off, m.target_len, t->target));
        UNIT_CHECK_INT(m.path_len, t->path_len);
        UNIT_CHECK_INT(m.version, t->version);
        UNIT_CHECK_INT(m.head_len, t->head_len ? t->head_len : t->len);
        UNIT_CHECK_INT(m.body, t->body);
        UNIT_CHECK_INT(m.content_length, t->content_length);
        UNIT_CHECK_INT(m.keep_alive, t->keep_alive);
        UNIT_CHECK_INT(m.expect_continue, t->expect_continue);
        UNIT_CHECK_INT(m.host_index, t->host_index);
        UNIT_CHECK_INT(m.upgrade, t->upgrade);
        UNIT_CHECK_INT(m.nfields, t->nfields);
        for (k = 0; k < m.nfields && k < 4; k++) {
            UNIT_CHECK(span_is(b, m.fields[k].name_off, m.fields[k].name_len, t->fields[2 * k]));
            UNIT_CHECK(span_is(b, m.fields[k].value_off, m.fields[k].value_len,
                               t->fields[2 * k + 1]));
        }
        check_incremental(parse_request, t->in, t->len, RIC_HTTP_GET);
    }
}

static void
test_response_table(void)
{
    ric_http_msg_t m;
    size_t i;
    int rc;

    for (i = 0; i < ric_nelems(response_cases); i++) {
        const response_case_t *t = &response_cases[i];
        const u_char *b = (const u_char *) t->in;

        UNIT_CASE(t->name);
        ric_http_msg_init(&m);
        rc = ric_http_parse_response(&m, b, t->len, t->request_method);
        UNIT_CHECK_INT(rc, t->rc);
        if (t->rc == RIC_ERROR) {
            UNIT_CHECK_INT(m.error_status, t->status);
            UNIT_CHECK(m.error_reason != NULL);
            UNIT_CHECK_INT(ric_http_parse_response(&m, b, t->len, t->request_method), RIC_ERROR);
        }
        if (t->rc == RIC_OK) {
            UNIT_CHECK_INT(m.is_response, 1);
            UNIT_CHECK_INT(m.status, t->status);
            UNIT_CHECK_INT(m.body, t->body);
            UNIT_CHECK_INT(m.content_length, t->content_length);
            UNIT_CHECK_INT(m.keep_alive, t->keep_alive);
            UNIT_CHECK(span_is(b, m.reason_off, m.reason_len, t->reason));
            UNIT_CHECK(m.head_len <= t->len);
            UNIT_CHECK_INT(ric_http_parse_response(&m, b, t->len, t->request_method), RIC_OK);
        }
        check_incremental(parse_response, t->in, t->len, t->request_method);
    }
}

static void
test_response_repeated_length(void)
{
    static const struct {
        const char *in;
        ric_http_method_t method;
        int repeated;
    } cases[] = {
        { "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", RIC_HTTP_GET, 0 },
        { "HTTP/1.1 200 OK\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n", RIC_HTTP_GET, 1 },
        { "HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\n", RIC_HTTP_GET, 1 },
        { "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", RIC_HTTP_HEAD, 1 },
    };
    static const char conflict[] = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n";
    ric_http_msg_t m;
    size_t i;

    UNIT_CASE("a response's repeated Content-Length: said once, with its value");
    for (i = 0; i < ric_nelems(cases); i++) {
        ric_http_msg_init(&m);
        UNIT_CHECK_INT(ric_http_parse_response(&m, (const u_char *) cases[i].in, strlen(cases[i].in),
                                               cases[i].method), RIC_OK);
        UNIT_CHECK_INT(m.content_length_repeated, cases[i].repeated);
        UNIT_CHECK_INT(m.content_length_value, cases[i].repeated ? 5 : 0);
    }
    ric_http_msg_init(&m);
    UNIT_CHECK_INT(ric_http_parse_response(&m, (const u_char *) conflict, strlen(conflict), RIC_HTTP_GET),
                   RIC_ERROR);
}

/* Runs the decoder over in[0..len) as input arriving in pieces of `step`
 * bytes (0: all at once); returns the final result, collects the data. */
static int
run_chunked(const char *in, size_t len, size_t step, char *out, size_t *out_len,
            size_t *consumed)
{
    ric_http_chunked_t c;
    const u_char *p = (const u_char *) in, *end, *data, *base = (const u_char *) in;
    size_t avail = step ? 0 : len, data_len;
    int rc = RIC_AGAIN;

    ric_http_chunked_init(&c);
    *out_len = 0;

    for (;;) {
        end = base + avail;
        rc = ric_http_chunked_next(&c, &p, end, &data, &data_len);
        if (rc == RIC_OK) {
            /* a span never crosses the input end */
            UNIT_CHECK(data >= base && data + data_len <= end && data_len > 0);
            UNIT_CHECK(p == data + data_len);
            memcpy(out + *out_len, data, data_len);
            *out_len += data_len;
            continue;
        }
        if (rc == RIC_AGAIN) {
            UNIT_CHECK(p == end);
            if (avail == len) {
                break;
            }
            avail = ric_min(len, avail + step);
            continue;
        }
        break;
    }
    *consumed = (size_t) (p - base);
    return rc;
}

static void
test_chunked_table(void)
{
    char out[256];
    size_t i, out_len, consumed, step;
    int rc;

    for (i = 0; i < ric_nelems(chunked_cases); i++) {
        const chunked_case_t *t = &chunked_cases[i];

        UNIT_CASE(t->name);
        for (step = 0; step <= 3; step++) {
            rc = run_chunked(t->in, t->len, step, out, &out_len, &consumed);
            UNIT_CHECK_INT(rc, t->rc);
            UNIT_CHECK_INT(out_len, strlen(t->data));
            UNIT_CHECK(out_len == strlen(t->data) && memcmp(out, t->data, out_len) == 0);
            UNIT_CHECK_INT(consumed, t->consumed);
        }
    }
}

static void
test_chunked_trailer_len(void)
{
    static const char in[] = "3\r\nabc\r\n0\r\nX-A: 1\r\n\r\n";
    ric_http_chunked_t c;
    const u_char *p = (const u_char *) in, *data;
    size_t data_len;

    UNIT_CASE("chunked: the trailer section's length, 0 before it, its closing CRLF in at the end");
    ric_http_chunked_init(&c);
    UNIT_CHECK_INT(ric_http_chunked_next(&c, &p, (const u_char *) in + 11, &data, &data_len), RIC_OK);
    UNIT_CHECK_INT(ric_http_chunked_next(&c, &p, (const u_char *) in + 11, &data, &data_len), RIC_AGAIN);
    UNIT_CHECK_INT(c.trailer_len, 0);
    UNIT_CHECK_INT(ric_http_chunked_next(&c, &p, (const u_char *) in + 15, &data, &data_len), RIC_AGAIN);
    UNIT_CHECK_INT(c.trailer_len, 4);
    UNIT_CHECK_INT(ric_http_chunked_next(&c, &p, (const u_char *) in + sizeof(in) - 1, &data,
                                         &data_len), RIC_DONE);
    UNIT_CHECK_INT(c.trailer_len, 10);
}

static void
test_chunked_sticky(void)
{
    ric_http_chunked_t c;
    const u_char *in = (const u_char *) "0\r\n\r\nXY", *p = in, *data;
    size_t data_len;

    UNIT_CASE("chunked: done and error stick");
    ric_http_chunked_init(&c);
    UNIT_CHECK_INT(ric_http_chunked_next(&c, &p, in + 7, &data, &data_len), RIC_DONE);
    UNIT_CHECK(p == in + 5);
    UNIT_CHECK_INT(ric_http_chunked_next(&c, &p, in + 7, &data, &data_len), RIC_DONE);
    UNIT_CHECK(p == in + 5);

    ric_http_chunked_init(&c);
    p = (const u_char *) "x";
    UNIT_CHECK_INT(ric_http_chunked_next(&c, &p, p + 1, &data, &data_len), RIC_ERROR);
    UNIT_CHECK_INT(ric_http_chunked_next(&c, &p, p + 1, &data, &data_len), RIC_ERROR);
}

/* Builds "5;x=aaaa...\r\n" with an extension so the size line is n bytes. */
static void
test_chunked_limits(void)
{
    char *buf = ric_xmalloc(RIC_HTTP_MAX_TRAILER_BYTES + 64), out[16];
    size_t n, out_len, consumed;

    UNIT_CASE("chunked: size line at the limit");
    n = 0;
    n += (size_t) sprintf(buf, "1;x=");
    memset(buf + n, 'a', RIC_HTTP_MAX_CHUNK_LINE - n);
    n = RIC_HTTP_MAX_CHUNK_LINE;
    memcpy(buf + n, "\r\nz\r\n0\r\n\r\n", 10);
    UNIT_CHECK_INT(run_chunked(buf, n + 10, 0, out, &out_len, &consumed), RIC_DONE);
    UNIT_CHECK_INT(out_len, 1);

    UNIT_CASE("chunked: size line over the limit");
    sprintf(buf, "1;x=");
    memset(buf + 4, 'a', RIC_HTTP_MAX_CHUNK_LINE + 1 - 4);
    n = RIC_HTTP_MAX_CHUNK_LINE + 1;
    /* refused without waiting for the line to end */
    UNIT_CHECK_INT(run_chunked(buf, n, 0, out, &out_len, &consumed), RIC_ERROR);

    UNIT_CASE("chunked: trailers at the limit");
    memcpy(buf, "0\r\nX: ", 6);
    n = 3 + RIC_HTTP_MAX_TRAILER_BYTES - 4; /* "X: " value "\r\n" then "\r\n" */
    memset(buf + 6, 'v', n - 6);
    memcpy(buf + n, "\r\n\r\n", 4);
    UNIT_CHECK_INT(run_chunked(buf, n + 4, 0, out, &out_len, &consumed), RIC_DONE);
    UNIT_CHECK_INT(consumed, n + 4);

    UNIT_CASE("chunked: trailers over the limit");
    memset(buf + 6, 'v', n + 1 - 6);
    memcpy(buf + n + 1, "\r\n\r\n", 4);
    UNIT_CHECK_INT(run_chunked(buf, n + 5, 0, out, &out_len, &consumed), RIC_ERROR);

    free(buf);
}

/* Request line of exactly `line` bytes (CRLF not counted). */
static char *
make_request_line(size_t line, size_t *len)
{
    const char *tail = " HTTP/1.1\r\nHost: a\r\n\r\n";
    char *buf = ric_xmalloc(line + 64);

    memcpy(buf, "GET /", 5);
    memset(buf + 5, 'a', line - 5 - 9);
    memcpy(buf + line - 9, tail, strlen(tail));
    *len = line - 9 + strlen(tail);
    return buf;
}

/* A request whose field section (final CRLF included) is `section` bytes. */
static char *
make_field_section(size_t section, size_t *len)
{
    const char *line = "GET / HTTP/1.1\r\n";
    size_t l = strlen(line), filler = section - 16;
    char *buf = ric_xmalloc(l + section + 1);

    memcpy(buf, line, l);
    memcpy(buf + l, "Host: a\r\nX: ", 12);
    memset(buf + l + 12, 'v', filler);
    memcpy(buf + l + 12 + filler, "\r\n\r\n", 4);
    *len = l + section;
    return buf;
}

static char *
make_fields(unsigned nfields, size_t *len)
{
    char *buf = ric_xmalloc(32 + nfields * 16);
    unsigned k;
    size_t n;

    n = (size_t) sprintf(buf, "GET / HTTP/1.1\r\nHost: a\r\n");
    for (k = 1; k < nfields; k++) {
        n += (size_t) sprintf(buf + n, "X-%u: %u\r\n", k, k);
    }
    memcpy(buf + n, "\r\n", 2);
    *len = n + 2;
    return buf;
}

static void
check_big(const char *name, char *buf, size_t len, int want_rc, int want_status)
{
    ric_http_msg_t m, step;
    size_t n;
    int rc;

    UNIT_CASE(name);
    memset(&m, 0, sizeof(m)); /* compared whole below: see check_incremental */
    memset(&step, 0, sizeof(step));
    ric_http_msg_init(&m);
    rc = ric_http_parse_request(&m, (const u_char *) buf, len);
    UNIT_CHECK_INT(rc, want_rc);
    if (want_rc == RIC_ERROR) {
        UNIT_CHECK_INT(m.error_status, want_status);
    }

    /* the same in 7-byte steps, cheaper than byte by byte at this size */
    ric_http_msg_init(&step);
    rc = RIC_AGAIN;
    for (n = 7; rc == RIC_AGAIN; n += 7) {
        rc = ric_http_parse_request(&step, (const u_char *) buf, ric_min(n, len));
        if (n >= len) {
            break;
        }
    }
    UNIT_CHECK_INT(rc, want_rc);
    UNIT_CHECK(memcmp(&m, &step, sizeof(m)) == 0);
    free(buf);
}

static void
test_limits(void)
{
    size_t len;
    char *buf;
    int i;

    buf = make_request_line(RIC_HTTP_MAX_REQUEST_LINE, &len);
    check_big("request line exactly 8 KiB", buf, len, RIC_OK, 0);

    buf = make_request_line(RIC_HTTP_MAX_REQUEST_LINE + 1, &len);
    check_big("request line 8 KiB + 1", buf, len, RIC_ERROR, 414);

    /* refused as soon as the line is too long, not when it ends */
    buf = make_request_line(RIC_HTTP_MAX_REQUEST_LINE + 1, &len);
    check_big("request line 8 KiB + 1, no CRLF yet", buf, RIC_HTTP_MAX_REQUEST_LINE + 1,
              RIC_ERROR, 414);
    buf = make_request_line(RIC_HTTP_MAX_REQUEST_LINE + 1, &len);
    check_big("request line 8 KiB, no CRLF yet", buf, RIC_HTTP_MAX_REQUEST_LINE,
              RIC_AGAIN, 0);

    buf = make_field_section(RIC_HTTP_MAX_HEADER_BYTES, &len);
    check_big("field section exactly 32 KiB", buf, len, RIC_OK, 0);

    buf = make_field_section(RIC_HTTP_MAX_HEADER_BYTES + 1, &len);
    check_big("field section 32 KiB + 1", buf, len, RIC_ERROR, 431);

    buf = make_field_section(RIC_HTTP_MAX_HEADER_BYTES + 1000, &len);
    check_big("field section over 32 KiB, unfinished", buf, 16 + RIC_HTTP_MAX_HEADER_BYTES + 1,
              RIC_ERROR, 431);

    buf = make_fields(RIC_HTTP_MAX_FIELDS, &len);
    check_big("exactly 100 fields", buf, len, RIC_OK, 0);

    buf = make_fields(RIC_HTTP_MAX_FIELDS + 1, &len);
    check_big("101 fields", buf, len, RIC_ERROR, 431);

    buf = ric_xmalloc(1024);
    for (i = 0; i < 100; i++) {
        memcpy(buf + 2 * i, "\r\n", 2);
    }
    memcpy(buf + 200, "GET / HTTP/1.0\r\n\r\n", 18);
    check_big("100 empty lines before request", buf, 218, RIC_OK, 0);

    buf = ric_xmalloc(1024);
    for (i = 0; i < 200; i++) {
        memcpy(buf + 2 * i, "\r\n", 2);
    }
    memcpy(buf + 400, "GET / HTTP/1.0\r\n\r\n", 18);
    check_big("200 empty lines before request", buf, 418, RIC_ERROR, 400);

    buf = ric_xmalloc(RIC_HTTP_MAX_REQUEST_LINE + 64);
    memcpy(buf, "HTTP/1.1 200 ", 13);
    memset(buf + 13, 'r', RIC_HTTP_MAX_REQUEST_LINE);
    memcpy(buf + 13 + RIC_HTTP_MAX_REQUEST_LINE, "\r\n\r\n", 4);
    {
        ric_http_msg_t m;

        UNIT_CASE("status line over the limit");
        ric_http_msg_init(&m);
        UNIT_CHECK_INT(ric_http_parse_response(&m, (const u_char *) buf,
                                               17 + RIC_HTTP_MAX_REQUEST_LINE, RIC_HTTP_GET),
                       RIC_ERROR);
        UNIT_CHECK_INT(m.error_status, 502);
    }
    free(buf);
}

static void
test_field_lookup(void)
{
    static const char in[] = "GET / HTTP/1.1\r\nHost: h\r\nX-A:  one \r\nx-a: two\r\n\r\n";
    ric_http_msg_t m;
    ric_str_t v;

    UNIT_CASE("ric_http_field");
    ric_http_msg_init(&m);
    UNIT_CHECK_INT(ric_http_parse_request(&m, (const u_char *) in, sizeof(in) - 1), RIC_OK);
    v = ric_http_field(&m, (const u_char *) in, "x-a");
    UNIT_CHECK(v.data != NULL && v.len == 3 && memcmp(v.data, "one", 3) == 0);
    v = ric_http_field(&m, (const u_char *) in, "host");
    UNIT_CHECK(v.data != NULL && v.len == 1 && v.data[0] == 'h');
    v = ric_http_field(&m, (const u_char *) in, "x-b");
    UNIT_CHECK(v.data == NULL && v.len == 0);
    v = ric_http_field(&m, (const u_char *) in, "x-");
    UNIT_CHECK(v.data == NULL);
}

static void
test_methods_and_status(void)
{
    static const struct {
        const char *name;
        ric_http_method_t method;
    } methods[] = {
        { "GET", RIC_HTTP_GET }, { "HEAD", RIC_HTTP_HEAD }, { "POST", RIC_HTTP_POST },
        { "PUT", RIC_HTTP_PUT }, { "DELETE", RIC_HTTP_DELETE },
        { "OPTIONS", RIC_HTTP_OPTIONS }, { "TRACE", RIC_HTTP_TRACE },
        { "CONNECT", RIC_HTTP_CONNECT }, { "PATCH", RIC_HTTP_PATCH },
        { "get", RIC_HTTP_METHOD_OTHER }, { "GETS", RIC_HTTP_METHOD_OTHER },
        { "GE", RIC_HTTP_METHOD_OTHER }, { "", RIC_HTTP_METHOD_OTHER },
    };
    static const struct {
        int status;
        const char *text;
    } texts[] = {
        { 100, "Continue" }, { 101, "Switching Protocols" }, { 200, "OK" },
        { 201, "Created" }, { 204, "No Content" }, { 301, "Moved Permanently" },
        { 302, "Found" }, { 307, "Temporary Redirect" }, { 404, "Not Found" },
        { 405, "Method Not Allowed" }, { 503, "Service Unavailable" },
        { 504, "Gateway Timeout" },
        { 206, "Partial Content" }, { 304, "Not Modified" }, { 308, "Permanent Redirect" },
        { 400, "Bad Request" }, { 408, "Request Timeout" }, { 413, "Content Too Large" },
        { 414, "URI Too Long" }, { 417, "Expectation Failed" },
        { 421, "Misdirected Request" }, { 422, "Unprocessable Content" },
        { 425, "Too Early" }, { 429, "Too Many Requests" },
        { 431, "Request Header Fields Too Large" }, { 501, "Not Implemented" },
        { 502, "Bad Gateway" }, { 505, "HTTP Version Not Supported" }, { 299, "" },
        { 0, "" }, { 999, "" },
    };
    size_t i;

    UNIT_CASE("ric_http_method_parse");
    for (i = 0; i < ric_nelems(methods); i++) {
        UNIT_CHECK_INT(ric_http_method_parse((const u_char *) methods[i].name,
                                             strlen(methods[i].name)),
                       methods[i].method);
    }

    UNIT_CASE("ric_http_status_text");
    for (i = 0; i < ric_nelems(texts); i++) {
        UNIT_CHECK_STR(ric_http_status_text(texts[i].status), texts[i].text);
    }
}

/* The one absolute-form splitter: routing and the upstream's target both use it. */
static void
test_absolute_form(void)
{
    static const struct {
        const char *target, *authority, *rest;
        int absolute;
    } cases[] = {
        { "http://a/x?y", "a", "/x?y", 1 },
        { "https://a.example:8443/p", "a.example:8443", "/p", 1 },
        { "http://a", "a", "", 1 },
        { "http://a?q=1", "a", "?q=1", 1 },
        { "http://a/", "a", "/", 1 },
        { "/origin?x", NULL, NULL, 0 },
        { "*", NULL, NULL, 0 },
        { "", NULL, NULL, 0 },
        { "http:/a", NULL, NULL, 0 },
    };
    ric_str_t t, auth, rest;
    size_t i;

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        UNIT_CASE(cases[i].target);
        t.data = (const u_char *) cases[i].target;
        t.len = strlen(cases[i].target);
        UNIT_CHECK_INT(ric_http_absolute_form(t, &auth, &rest), cases[i].absolute);
        if (cases[i].absolute) {
            UNIT_CHECK(auth.len == strlen(cases[i].authority)
                       && memcmp(auth.data, cases[i].authority, auth.len) == 0);
            UNIT_CHECK(rest.len == strlen(cases[i].rest)
                       && memcmp(rest.data, cases[i].rest, rest.len) == 0);
        }
    }
}

int
main(void)
{
    test_absolute_form();
    test_request_table();
    test_request_values();
    test_response_table();
    test_response_repeated_length();
    test_chunked_table();
    test_chunked_sticky();
    test_chunked_trailer_len();
    test_chunked_limits();
    test_limits();
    test_field_lookup();
    test_methods_and_status();
    return UNIT_DONE("http_parse");
}
