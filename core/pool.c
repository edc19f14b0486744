/* pool.c: arena blocks and cleanup handlers for config and per-request memory. */
#include "pool.h"

#include <malloc.h>
#include <stdalign.h>

struct ric_pool_block_s {
    ric_pool_block_t *next;
    size_t used;
    size_t size;
    alignas(max_align_t) u_char data[];
};

struct ric_pool_cleanup_s {
    ric_pool_cleanup_t *next;
    void (*handler)(void *);
    void *data;
};

#define POOL_ALIGN alignof(max_align_t)
/* where a pool's first block starts in the pool's allocation */
#define FIRST_BLOCK_AT ((sizeof(ric_pool_t) + alignof(ric_pool_block_t) - 1) & ~(alignof(ric_pool_block_t) - 1))

static ric_pool_block_t *
block_new(size_t size)
{
    ric_pool_block_t *b = ric_xmalloc(sizeof(*b) + size);
    b->next = NULL;
    b->used = 0;
    b->size = size;
    return b;
}

size_t ric_pool_released;

void
ric_pool_trim_idle(void)
{
    if (ric_pool_released >= RIC_POOL_TRIM_AFTER) {
        ric_pool_released = 0;
        malloc_trim(0);
    }
}

/* Destroyed pools kept, each with its first block, for the next pool of
 * their block size (a request's pool, in a steady stream of requests). */
#define POOLS_KEPT 64

static ric_pool_t *pools_free;
static int pools_kept;

ric_pool_t *
ric_pool_create(size_t block_size)
{
    ric_pool_t *pool, **pp;
    ric_pool_block_t *b;

    block_size = block_size < 256 ? 256 : block_size;
    for (pp = &pools_free; *pp != NULL; pp = &(*pp)->next_free) {
        if ((*pp)->block_size == block_size) {
            pool = *pp;
            *pp = pool->next_free;
            pools_kept--;
            return pool;
        }
    }
    /* the pool and its first block in one allocation */
    pool = ric_xmalloc(FIRST_BLOCK_AT + sizeof(*b) + block_size);
    b = (ric_pool_block_t *) ((u_char *) pool + FIRST_BLOCK_AT);
    b->next = NULL;
    b->used = 0;
    b->size = block_size;
    pool->block_size = block_size;
    pool->blocks = pool->first = b;
    pool->cleanups = NULL;
    pool->next_free = NULL;
    return pool;
}

void
ric_pool_destroy(ric_pool_t *pool)
{
    ric_pool_block_t *b, *next;
    ric_pool_cleanup_t *c;

    if (pool == NULL) {
        return;
    }
    for (c = pool->cleanups; c != NULL; c = c->next) {
        c->handler(c->data);
    }
    for (b = pool->blocks; b != NULL; b = next) {
        next = b->next;
        if (b != pool->first) {
            ric_pool_released += b->size;
            free(b);
        }
    }
    if (RIC_RECYCLE && pools_kept < POOLS_KEPT) {
        pool->first->next = NULL;
        pool->first->used = 0;
        pool->blocks = pool->first;
        pool->cleanups = NULL;
        pool->next_free = pools_free;
        pools_free = pool;
        pools_kept++;
        return;
    }
    free(pool);
}

void *
ric_palloc(ric_pool_t *pool, size_t n)
{
    ric_pool_block_t *b = pool->blocks;
    size_t at = (b->used + POOL_ALIGN - 1) & ~(POOL_ALIGN - 1);

    if (at + n <= b->size) {
        b->used = at + n;
        return b->data + at;
    }
    if (n > pool->block_size / 4) {
        /* a large piece gets its own block behind the current one, so the
         * current block keeps serving small pieces */
        ric_pool_block_t *big = block_new(n);
        big->used = n;
        big->next = b->next;
        b->next = big;
        return big->data;
    }
    b = block_new(pool->block_size);
    b->next = pool->blocks;
    pool->blocks = b;
    b->used = n;
    return b->data;
}

void *
ric_pcalloc(ric_pool_t *pool, size_t n)
{
    void *p = ric_palloc(pool, n);
    memset(p, 0, n);
    return p;
}

char *
ric_pstrndup(ric_pool_t *pool, const char *s, size_t n)
{
    char *p = ric_palloc(pool, n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *
ric_pstrdup(ric_pool_t *pool, const char *s)
{
    return ric_pstrndup(pool, s, strlen(s));
}

void
ric_pool_cleanup_add(ric_pool_t *pool, void (*handler)(void *), void *data)
{
    ric_pool_cleanup_t *c = ric_palloc(pool, sizeof(*c));
    c->handler = handler;
    c->data = data;
    c->next = pool->cleanups;
    pool->cleanups = c;
}
