/* shm.h: the shared memory zone: named entries of cross-worker state (budgets, health, counters). */
#ifndef RIC_SHM_H
#define RIC_SHM_H

#include "ric_core.h"

/*
 * One zone per instance. The master maps it (shared, anonymous) before it
 * forks a worker, so every worker, and every worker that replaces one, sees
 * the same bytes at the same address. Entries are named ("budget:backend",
 * "peer:backend:127.0.0.1:9000") and made by the master alone, at start and
 * at reload, when a name that is already there gets its old entry back:
 * state outlives a config generation when its name does; the entries no
 * generation names any more are freed by a sweep once their last user
 * has exited. Workers only
 * change what is inside entries, with atomics; nothing in the zone is
 * locked, so a worker killed at any instruction leaves nothing held.
 */
typedef struct ric_shm_s ric_shm_t;

/* Maps a zone of size bytes (rounded up to pages; untouched pages cost no
 * memory). NULL with errno on failure. */
ric_shm_t *ric_shm_create(size_t size);

/* Unmaps the zone (in the process that calls it). */
void ric_shm_destroy(ric_shm_t *z);

/* The entry called name, size bytes, 64-byte aligned: the existing one
 * (*created = 0; its size must match, or NULL), or a new zeroed one
 * (*created = 1). NULL when the zone is full. Master only. */
void *ric_shm_entry(ric_shm_t *z, const char *name, size_t size, int *created);

/* A sweep (master only, when no process uses an entry it will not claim
 * again): entries made or found between begin and end are kept, every
 * other is freed, its block reused by a later entry that fits in it.
 * Returns the bytes freed. */
void ric_shm_sweep_begin(ric_shm_t *z);
size_t ric_shm_sweep_end(ric_shm_t *z);

/* Calls fn for every entry in the order they were made (for metrics). */
void ric_shm_each(const ric_shm_t *z, void (*fn)(const char *name, void *data, size_t size,
                                                  void *ctx), void *ctx);

/* The name of the entry whose data starts at data, or NULL when none does
 * (data: any address; for what a slot of the zone points at). */
const char *ric_shm_name_of(const ric_shm_t *z, const void *data);

/* Bytes used and mapped, for logs. */
size_t ric_shm_used(const ric_shm_t *z);
size_t ric_shm_size(const ric_shm_t *z);

#endif /* RIC_SHM_H */
