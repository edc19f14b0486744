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

/* Bytes freed since the last trim in blocks beyond a pool's first, and in
 * other buffers a request grew past the usual (their owners add them).
 * What is freed in pieces (large answers, many large fields of many
 * requests at once) lies in holes of the heap that free does not give
 * back to the system: past RIC_POOL_TRIM_AFTER, an idle worker does. */
extern size_t ric_pool_released;
#define RIC_POOL_TRIM_AFTER (1 << 20)

/* For a moment when the worker has no request: past RIC_POOL_TRIM_AFTER
 * released, gives the heap's free pages back (malloc_trim) and counts
 * again from 0; never once per request of an ordinary stream. */
void ric_pool_trim_idle(void);

/* Registers handler(data) to run when the pool is destroyed. */
void ric_pool_cleanup_add(ric_pool_t *pool, void (*handler)(void *), void *data);

#endif /* RIC_POOL_H */
