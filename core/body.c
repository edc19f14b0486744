/* body.c: request body buffering: grows in memory up to a limit, then spills to an unlinked temp file. */
#include "body.h"
#include "log.h"

#include <errno.h>
#include <openssl/evp.h>
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

void
ric_body_init(ric_body_t *b, size_t mem_max, const char *temp_dir)
{
    memset(b, 0, sizeof(*b));
    b->fd = -1;
    b->mem_max = mem_max;
    b->temp_dir = temp_dir;
}

static int
open_temp(ric_body_t *b)
{
    char path[4096];

    /* O_TMPFILE never has a name, so nothing is left behind after a crash */
    b->fd = open(b->temp_dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (b->fd != -1) {
        return RIC_OK;
    }
    snprintf(path, sizeof(path), "%s/ricochet-body.XXXXXX", b->temp_dir);
    b->fd = mkostemp(path, O_CLOEXEC);
    if (b->fd == -1) {
        ric_log_error(RIC_LOG_CRIT, errno, "cannot create a temp file in \"%s\" for a request "
                      "body (client_body_temp_path)", b->temp_dir);
        return RIC_ERROR;
    }
    unlink(path);
    return RIC_OK;
}

int
ric_body_append(ric_body_t *b, const u_char *p, size_t n)
{
    size_t take;
    ssize_t w;

    if (b->mem_len < b->mem_max) {
        take = ric_min(n, b->mem_max - b->mem_len);
        if (b->mem_len + take > b->mem_size) {
            b->mem_size = ric_min(b->mem_max, ric_max(b->mem_len + take, b->mem_size * 2));
            b->mem = ric_xrealloc(b->mem, b->mem_size);
        }
        memcpy(b->mem + b->mem_len, p, take);
        b->mem_len += take;
        p += take;
        n -= take;
    }
    if (n == 0) {
        return RIC_OK;
    }
    if (b->fd == -1 && open_temp(b) != RIC_OK) {
        return RIC_ERROR;
    }
    while (n > 0) {
        /* the page cache takes this without waiting on the disk */
        w = write(b->fd, p, n);
        if (w == -1 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            ric_log_error(RIC_LOG_CRIT, errno, "cannot write a request body to its temp file");
            return RIC_ERROR;
        }
        b->file_len += (uint64_t) w;
        p += w;
        n -= (size_t) w;
    }
    return RIC_OK;
}

int
ric_body_each(const ric_body_t *b, void (*fn)(void *ctx, const u_char *p, size_t n), void *ctx)
{
    u_char chunk[16384];
    uint64_t off = 0;
    ssize_t got;

    if (b->mem_len > 0) {
        fn(ctx, b->mem, b->mem_len);
    }
    while (off < b->file_len) {
        got = pread(b->fd, chunk, (size_t) ric_min((uint64_t) sizeof(chunk), b->file_len - off),
                    (off_t) off);
        if (got == -1 && errno == EINTR) {
            continue;
        }
        if (got <= 0) {
            ric_log_error(RIC_LOG_CRIT, got == 0 ? 0 : errno,
                          "cannot read a request body back from its temp file");
            return RIC_ERROR;
        }
        fn(ctx, chunk, (size_t) got);
        off += (uint64_t) got;
    }
    return RIC_OK;
}

void
ric_body_reset(ric_body_t *b)
{
    free(b->mem);
    if (b->fd != -1) {
        close(b->fd);
    }
    ric_body_init(b, b->mem_max, b->temp_dir);
}

/* --- the digest of a streamed body ---------------------------------------- */

struct ric_body_digest_s {
    EVP_MD_CTX *ctx;
};

static void
digest_piece(void *ctx, const u_char *p, size_t n)
{
    EVP_DigestUpdate(ctx, p, n);
}

ric_body_digest_t *
ric_body_digest_new(void)
{
    ric_body_digest_t *d = ric_xcalloc(1, sizeof(*d));

    d->ctx = EVP_MD_CTX_new();
    if (d->ctx == NULL || EVP_DigestInit_ex(d->ctx, EVP_sha256(), NULL) != 1) {
        ric_body_digest_free(d);
        return NULL;
    }
    return d;
}

void
ric_body_digest_add(ric_body_digest_t *d, const u_char *p, size_t n)
{
    EVP_DigestUpdate(d->ctx, p, n);
}

int
ric_body_digest_add_body(ric_body_digest_t *d, const ric_body_t *held)
{
    return ric_body_each(held, digest_piece, d->ctx);
}

int
ric_body_digest_final(ric_body_digest_t *d, u_char *out)
{
    return EVP_DigestFinal_ex(d->ctx, out, NULL) == 1 ? RIC_OK : RIC_ERROR;
}

void
ric_body_digest_free(ric_body_digest_t *d)
{
    if (d != NULL) {
        EVP_MD_CTX_free(d->ctx);
        free(d);
    }
}
