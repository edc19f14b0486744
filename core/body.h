/* body.h: a request body kept for sending upstream: memory first, then an unlinked temp file. */
#ifndef RIC_BODY_H
#define RIC_BODY_H

#include "ric_core.h"

typedef struct {
    u_char *mem;       /* the first bytes; owned */
    size_t mem_len;
    size_t mem_size;
    size_t mem_max;    /* client_body_buffer_size */
    int fd;            /* temp file with the bytes after mem_max, or -1 */
    uint64_t file_len;
    const char *temp_dir;
} ric_body_t;

/* Prepares an empty body; nothing is allocated until bytes arrive. */
void ric_body_init(ric_body_t *b, size_t mem_max, const char *temp_dir);

/* Appends n bytes. Returns RIC_OK, or RIC_ERROR (logged) when the temp file
 * cannot be created or written: the caller answers 500. */
int ric_body_append(ric_body_t *b, const u_char *p, size_t n);

static inline uint64_t
ric_body_size(const ric_body_t *b)
{
    return b->mem_len + b->file_len;
}

/* Calls fn over the body's bytes in order, in pieces (the temp file's
 * part is read from the page cache). RIC_OK, or RIC_ERROR when the file
 * cannot be read (logged). */
int ric_body_each(const ric_body_t *b, void (*fn)(void *ctx, const u_char *p, size_t n),
                  void *ctx);

/* A running SHA-256 of a body that streams through, for a fingerprint of
 * bytes that are never held whole. */
typedef struct ric_body_digest_s ric_body_digest_t;

/* An empty digest; NULL when OpenSSL cannot make one. */
ric_body_digest_t *ric_body_digest_new(void);

/* Takes in n more bytes. */
void ric_body_digest_add(ric_body_digest_t *d, const u_char *p, size_t n);

/* Takes in every byte of a held body. RIC_OK, or RIC_ERROR when its file
 * cannot be read. */
int ric_body_digest_add_body(ric_body_digest_t *d, const ric_body_t *held);

/* The digest of every byte taken in (32 bytes into out). RIC_OK or RIC_ERROR. */
int ric_body_digest_final(ric_body_digest_t *d, u_char *out);

void ric_body_digest_free(ric_body_digest_t *d);

/* Releases memory and closes the temp file; the body is empty again. */
void ric_body_reset(ric_body_t *b);

#endif /* RIC_BODY_H */
