/* pool.h: an arena allocator; everything allocated from a pool is freed with it. */
#ifndef RIC_POOL_H
#define RIC_POOL_H

#include "ric_core.h"

typedef struct ric_pool_block_s ric_pool_block_t;
typedef struct ric_pool_cleanup_s ric_pool_cleanup_t;

typedef struct ric_pool_s ric_pool_t;

struct ric_pool_s {
    ric_pool_block_t *blocks;     /* newest first */
    ric_pool_cleanup_t *cleanups; /* run in reverse order of registration */
    size_t block_size;
    ric_pool_block_t *first;      /* made with the pool, in the same allocation */
    ric_pool_t *next_free;        /* kept for reuse (ric_pool_destroy) */
};

/* Returns a new pool whose blocks are block_size bytes (larger requests get a
 * block of their own). Aborts on out-of-memory. */
ric_pool_t *ric_pool_create(size_t block_size);

/* Runs the cleanups, then frees every block and the pool itself. NULL is ok. */
void ric_pool_destroy(ric_pool_t *pool);

/* Returns n bytes aligned for any type, owned by the pool. */
void *ric_palloc(ric_pool_t *pool, size_t n);
void *ric_pcalloc(ric_pool_t *pool, size_t n);
char *ric_pstrdup(ric_pool_t *pool, const char *s);
char *ric_pstrndup(ric_pool_t *pool, const char *s, size_t n);

/* Registers handler(data) to run when the pool is destroyed. */
void ric_pool_cleanup_add(ric_pool_t *pool, void (*handler)(void *), void *data);

#endif /* RIC_POOL_H */
