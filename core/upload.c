/* upload.c: the stage of a streamed request body: chunk framing and a bounded buffer. */
#include "upload.h"

#include <stdio.h>

static void
stage(ric_upload_t *u, const void *p, size_t n)
{
    if (u->sent > 0) {
        /* drop what went out, so the stage holds only what is pending */
        memmove(u->data, u->data + u->sent, u->len - u->sent);
        u->len -= u->sent;
        u->sent = 0;
    }
    if (u->len + n > u->size) {
        u->size = ric_max(u->size * 2, u->len + n + 1024);
        u->data = ric_xrealloc(u->data, u->size);
    }
    memcpy(u->data + u->len, p, n);
    u->len += n;
}

void
ric_upload_init(ric_upload_t *u, int chunked, uint64_t held)
{
    memset(u, 0, sizeof(*u));
    u->chunked = chunked;
    if (chunked && held > 0) {
        stage(u, "\r\n", 2); /* ends the chunk of what was held */
    }
}

int
ric_upload_put(ric_upload_t *u, const u_char *data, size_t n)
{
    char line[32];
    int len;

    if (u->chunked) {
        len = snprintf(line, sizeof(line), "%zx\r\n", n);
        stage(u, line, (size_t) len);
    }
    stage(u, data, n);
    if (u->chunked) {
        stage(u, "\r\n", 2);
    }
    return ric_upload_pending(u) > RIC_UPLOAD_HIGH_WATER;
}

void
ric_upload_end(ric_upload_t *u)
{
    u->done = 1;
    if (u->chunked) {
        stage(u, "0\r\n\r\n", 5);
    }
}

void
ric_upload_sent(ric_upload_t *u, size_t n)
{
    u->sent += n;
    if (u->sent == u->len) {
        u->sent = u->len = 0;
    }
}

void
ric_upload_free(ric_upload_t *u)
{
    free(u->data);
    u->data = NULL;
    u->len = u->sent = u->size = 0;
}
