/* upload.h: a request body too large to hold for replay, staged on its way upstream as it arrives. */
#ifndef RIC_UPLOAD_H
#define RIC_UPLOAD_H

#include "ric_core.h"

/* Above this many staged bytes the client is not read until the upstream
 * takes some: memory stays bounded whatever the two paces are. */
#define RIC_UPLOAD_HIGH_WATER (64 * 1024)

/* The bytes wait here until the upstream socket takes them, framed as
 * chunks when the client sent chunks (their length is not known). */
struct ric_upload_s {
    int chunked;     /* re-framed as chunks upstream */
    int done;        /* the client's body ended; the terminator is staged */
    u_char *data;
    size_t len;
    size_t sent;     /* data[0, sent) went upstream */
    size_t size;
};

/* Prepares an upload; held is how many body bytes were held in memory
 * before streaming began (they go first, sent as one chunk when chunked:
 * the head builder writes its size line, the upload its closing CRLF). */
void ric_upload_init(ric_upload_t *u, int chunked, uint64_t held);

/* Stages n body bytes from the client. Returns 1 when the client should
 * be paused (over RIC_UPLOAD_HIGH_WATER), else 0. */
int ric_upload_put(ric_upload_t *u, const u_char *data, size_t n);

/* The client's body ended: stages the chunked terminator. */
void ric_upload_end(ric_upload_t *u);

/* Bytes staged and not yet sent. */
static inline size_t
ric_upload_pending(const ric_upload_t *u)
{
    return u->len - u->sent;
}

/* n staged bytes went upstream. */
void ric_upload_sent(ric_upload_t *u, size_t n);

/* Frees the stage. */
void ric_upload_free(ric_upload_t *u);

#endif /* RIC_UPLOAD_H */
