/* shm.c: a shared anonymous mapping of named, aligned entries: a bump allocator, and the blocks a sweep freed reused by entries that fit. */
#include "shm.h"

#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

#define SHM_ALIGN 64 /* a cache line: entries of different writers never share one */
#define SHM_MAGIC 0x52494353484d3031ULL /* "RICSHM01" */

/* The zone starts with its header; each entry is a header, its name, then
 * its data at the next aligned offset. */
typedef struct {
    uint64_t magic;
    size_t size;  /* of the mapping */
    size_t used;  /* bytes from the start of the zone */
    size_t first; /* offset of the first entry; 0: none */
    size_t last;
    unsigned mark; /* entries made or found since the sweep began carry it */
} shm_header_t;

typedef struct {
    size_t next;     /* offset of the next entry; 0: none */
    size_t data;     /* offset of its data */
    size_t size;     /* of its data */
    size_t end;      /* where its block ends (a freed one is reused within it) */
    unsigned mark;
    int free;        /* freed by a sweep: its block waits for an entry that fits */
    size_t name_len;
    char name[];
} shm_entry_t;

struct ric_shm_s {
    shm_header_t h; /* the mapping itself: a ric_shm_t * points at its start */
};

static size_t
align_up(size_t n, size_t a)
{
    return (n + a - 1) / a * a;
}

ric_shm_t *
ric_shm_create(size_t size)
{
    long page = sysconf(_SC_PAGESIZE);
    shm_header_t *h;
    void *p;

    size = align_up(ric_max(size, sizeof(shm_header_t) + SHM_ALIGN), page > 0 ? (size_t) page : 4096);
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        return NULL;
    }
    h = p;
    h->magic = SHM_MAGIC;
    h->size = size;
    h->used = align_up(sizeof(*h), SHM_ALIGN);
    return p;
}

void
ric_shm_destroy(ric_shm_t *z)
{
    if (z != NULL) {
        munmap(z, z->h.size);
    }
}

static shm_entry_t *
entry_at(const ric_shm_t *z, size_t off)
{
    return off ? (shm_entry_t *) ((char *) z + off) : NULL;
}

/* Makes the entry at off (a new block, or a freed one it fits in). */
static void *
entry_make(ric_shm_t *z, shm_entry_t *e, const char *name, size_t len, size_t data, size_t size)
{
    e->data = data;
    e->size = size;
    e->name_len = len;
    e->mark = z->h.mark;
    e->free = 0;
    memcpy(e->name, name, len + 1);
    memset((char *) z + data, 0, size);
    return (char *) z + data;
}

void *
ric_shm_entry(ric_shm_t *z, const char *name, size_t size, int *created)
{
    size_t len = strlen(name), off, data;
    shm_entry_t *e;

    *created = 0;
    for (e = entry_at(z, z->h.first); e != NULL; e = entry_at(z, e->next)) {
        if (!e->free && e->name_len == len && memcmp(e->name, name, len) == 0) {
            e->mark = z->h.mark;
            return e->size == size ? (char *) z + e->data : NULL;
        }
    }
    /* a block a sweep freed, when the entry fits in it */
    for (off = z->h.first; off != 0; off = e->next) {
        e = entry_at(z, off);
        data = align_up(off + sizeof(*e) + len + 1, SHM_ALIGN);
        if (e->free && data <= e->end && size <= e->end - data) {
            *created = 1;
            return entry_make(z, e, name, len, data, size);
        }
    }
    off = z->h.used;
    data = align_up(off + sizeof(*e) + len + 1, SHM_ALIGN);
    if (data > z->h.size || size > z->h.size - data) {
        errno = ENOMEM;
        return NULL;
    }
    e = entry_at(z, off);
    e->next = 0;
    e->end = align_up(data + size, SHM_ALIGN);
    z->h.used = e->end;
    if (z->h.last) {
        entry_at(z, z->h.last)->next = off;
    } else {
        z->h.first = off;
    }
    z->h.last = off;
    *created = 1;
    return entry_make(z, e, name, len, data, size);
}

void
ric_shm_sweep_begin(ric_shm_t *z)
{
    z->h.mark++;
}

size_t
ric_shm_sweep_end(ric_shm_t *z)
{
    shm_entry_t *e;
    size_t freed = 0;

    for (e = entry_at(z, z->h.first); e != NULL; e = entry_at(z, e->next)) {
        if (!e->free && e->mark != z->h.mark) {
            e->free = 1;
            freed += e->size;
        }
    }
    return freed;
}

void
ric_shm_each(const ric_shm_t *z, void (*fn)(const char *name, void *data, size_t size, void *ctx),
             void *ctx)
{
    const shm_entry_t *e;

    for (e = entry_at(z, z->h.first); e != NULL; e = entry_at(z, e->next)) {
        if (!e->free) {
            fn(e->name, (char *) z + e->data, e->size, ctx);
        }
    }
}

const char *
ric_shm_name_of(const ric_shm_t *z, const void *data)
{
    const shm_entry_t *e;

    for (e = entry_at(z, z->h.first); e != NULL && data != NULL; e = entry_at(z, e->next)) {
        if (!e->free && (const char *) z + e->data == (const char *) data) {
            return e->name;
        }
    }
    return NULL;
}

size_t
ric_shm_used(const ric_shm_t *z)
{
    return z->h.used;
}

size_t
ric_shm_size(const ric_shm_t *z)
{
    return z->h.size;
}
