/* shared_dict.c: lua_shared_dict: fixed slots in the shared zone, open addressing over a bounded window, sampled LRU eviction, one short lock a dictionary. */
#include "shared_dict.h"
#include "conf.h"
#include "shm.h"

#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

/*
 * A dictionary is one zone entry: a head, then slots of a fixed size. A key
 * lives in the first free slot of the WINDOW slots from its hash's; when all
 * of them are taken, the one used least recently goes (Redis's sampled LRU,
 * over the window). Every operation is a few hundred bytes copied under the
 * dictionary's lock, which holds the locker's pid: a worker killed holding
 * it (the zone is otherwise lock-free, see shm.h) has it taken from it by
 * the next one that finds it dead.
 */
#define WINDOW 32

typedef struct {
    uint32_t state;    /* 0 empty, 1 used */
    uint8_t type;      /* RIC_DICT_* */
    uint8_t klen;
    uint16_t vlen;
    uint32_t hash;
    uint32_t pad;
    int64_t expires;   /* monotonic ms (one clock for every process of the host); 0: never */
    uint64_t used;     /* the dictionary's clock at the last get or set */
    double num;
    char key[RIC_DICT_KEY_MAX];
    char value[RIC_DICT_VALUE_MAX];
} slot_t;

struct ric_dict_s {
    int32_t lock;      /* the holder's pid; 0: free */
    uint32_t nslots;
    uint64_t clock;
    slot_t slots[];
};

static ric_shared_dict_conf_t *dicts; /* the current configuration's */

size_t
ric_shared_dict_zone_size(const ric_conf_t *conf)
{
    const ric_shared_dict_conf_t *c;
    size_t n = 0;

    for (c = conf->http ? conf->http->shared_dicts : NULL; c; c = c->next) {
        n += (size_t) c->size + 4096;
    }
    return n;
}

int
ric_shared_dict_share(ric_conf_t *conf, ric_shm_t *zone, char *err, size_t errlen)
{
    ric_shared_dict_conf_t *c;
    char name[300];
    int created;
    uint32_t n;

    for (c = conf->http ? conf->http->shared_dicts : NULL; c; c = c->next) {
        n = (uint32_t) (((size_t) c->size - sizeof(struct ric_dict_s)) / sizeof(slot_t));
        /* named by its size too: a reload that resizes it starts it empty */
        snprintf(name, sizeof(name), "dict:%s:%lld", c->name, (long long) c->size);
        c->dict = ric_shm_entry(zone, name, sizeof(struct ric_dict_s) + n * sizeof(slot_t),
                                &created);
        if (c->dict == NULL) {
            snprintf(err, errlen, "%s:%d: the shared memory zone has no room for "
                     "lua_shared_dict \"%s\" (what removed or resized dictionaries held is "
                     "kept until a restart)", c->file, c->line, c->name);
            return RIC_ERROR;
        }
        if (created) {
            c->dict->nslots = n;
        }
    }
    dicts = conf->http ? conf->http->shared_dicts : NULL;
    return RIC_OK;
}

void
ric_shared_dict_declare(ric_shared_dict_conf_t *list)
{
    dicts = list;
}

/* The names a script's main chunk asked for while the configuration was
 * read, before their lua_shared_dict (which may come after the script
 * line): taken on trust then, checked when the whole http block is read. */
#define ASKED_MAX 64

static struct {
    char name[RIC_DICT_NAME_MAX + 1];
    char where[256]; /* the script's "FILE:LINE: " */
} asked[ASKED_MAX];
static int nasked, reading;

void
ric_shared_dict_begin(void)
{
    dicts = NULL;
    nasked = 0;
}

void
ric_shared_dict_reading(int on)
{
    reading = on;
}

static int
asked_for(const char *name, size_t len)
{
    int i;

    for (i = 0; i < nasked; i++) {
        if (strlen(asked[i].name) == len && memcmp(asked[i].name, name, len) == 0) {
            return 1;
        }
    }
    return 0;
}

int
ric_shared_dict_ask(const char *name, size_t len, const char *where)
{
    if (!reading || len == 0 || len > RIC_DICT_NAME_MAX || memchr(name, '\0', len) != NULL) {
        return 0;
    }
    if (asked_for(name, len)) {
        return 1;
    }
    if (nasked == ASKED_MAX) {
        return 0;
    }
    memcpy(asked[nasked].name, name, len);
    asked[nasked].name[len] = '\0';
    snprintf(asked[nasked].where, sizeof(asked[nasked].where), "%s", where);
    nasked++;
    return 1;
}

int
ric_shared_dict_resolve(char *err, size_t errlen)
{
    int i, known;

    reading = 0; /* the declared names alone */
    for (i = 0; i < nasked; i++) {
        ric_shared_dict_find(asked[i].name, strlen(asked[i].name), &known);
        if (!known) {
            snprintf(err, errlen, "%sricochet.shared: no lua_shared_dict \"%s\" (declare it at "
                     "http level: lua_shared_dict %s 1m;)", asked[i].where, asked[i].name,
                     asked[i].name);
            nasked = 0;
            return RIC_ERROR;
        }
    }
    nasked = 0;
    return RIC_OK;
}

struct ric_dict_s *
ric_shared_dict_find(const char *name, size_t len, int *known)
{
    const ric_shared_dict_conf_t *c;

    for (c = dicts; c; c = c->next) {
        if (strlen(c->name) == len && memcmp(c->name, name, len) == 0) {
            *known = 1;
            return c->dict;
        }
    }
    *known = reading && asked_for(name, len);
    return NULL;
}

/* --- the lock ------------------------------------------------------------------- */

static void
lock(struct ric_dict_s *d)
{
    int32_t me = (int32_t) getpid(), holder = 0;
    unsigned spins = 0;

    while (!__atomic_compare_exchange_n(&d->lock, &holder, me, 0, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED)) {
        if (++spins % 1024 == 0) {
            /* held that long: is its holder still there? */
            if (holder != 0 && kill(holder, 0) == -1 && errno == ESRCH) {
                __atomic_compare_exchange_n(&d->lock, &holder, 0, 0, __ATOMIC_RELAXED,
                                            __ATOMIC_RELAXED);
            }
            sched_yield();
        }
        holder = 0;
    }
}

static void
unlock(struct ric_dict_s *d)
{
    __atomic_store_n(&d->lock, 0, __ATOMIC_RELEASE);
}

/* --- slots ---------------------------------------------------------------------- */

static uint32_t
hash_of(const char *key, size_t n)
{
    uint32_t h = 2166136261u;
    size_t i;

    for (i = 0; i < n; i++) {
        h = (h ^ (u_char) key[i]) * 16777619u;
    }
    return h;
}

static int
live(const slot_t *s, int64_t now)
{
    return s->state == 1 && (s->expires == 0 || s->expires > now);
}

/* The slot holding key, or NULL; *free_slot the best slot to put it in
 * (a free one first, else the least recently used of the window). */
static slot_t *
find(struct ric_dict_s *d, const char *key, size_t klen, uint32_t h, slot_t **free_slot)
{
    slot_t *s, *oldest = NULL, *vacant = NULL;
    int64_t now = ric_now_ms();
    uint32_t i, at;

    for (i = 0; i < WINDOW && i < d->nslots; i++) {
        at = (h + i) % d->nslots;
        s = &d->slots[at];
        if (live(s, now)) {
            if (s->hash == h && s->klen == klen && memcmp(s->key, key, klen) == 0) {
                return s;
            }
            if (oldest == NULL || s->used < oldest->used) {
                oldest = s;
            }
        } else if (vacant == NULL) {
            vacant = s; /* empty, or expired: free */
        }
    }
    if (free_slot != NULL) {
        *free_slot = vacant != NULL ? vacant : oldest;
    }
    return NULL;
}

void
ric_shared_dict_get(struct ric_dict_s *d, const char *key, size_t klen, ric_dict_value_t *out,
                    char *buf)
{
    slot_t *s;

    out->type = RIC_DICT_NONE;
    if (d == NULL || d->nslots == 0 || klen == 0 || klen > RIC_DICT_KEY_MAX) {
        return;
    }
    lock(d);
    s = find(d, key, klen, hash_of(key, klen), NULL);
    if (s != NULL) {
        s->used = ++d->clock;
        out->type = s->type;
        out->num = s->num;
        out->len = s->vlen;
        memcpy(buf, s->value, s->vlen);
        out->str = buf;
    }
    unlock(d);
}

static const char *
check(const char *key, size_t klen, const ric_dict_value_t *v)
{
    if (klen == 0 || klen > RIC_DICT_KEY_MAX) {
        return "a key is 1 to 64 bytes";
    }
    if (v != NULL && v->type == RIC_DICT_STRING && v->len > RIC_DICT_VALUE_MAX) {
        return "a string value is at most 224 bytes";
    }
    (void) key;
    return NULL;
}

int
ric_shared_dict_set(struct ric_dict_s *d, const char *key, size_t klen,
                    const ric_dict_value_t *v, int64_t ttl_ms, const char **why)
{
    slot_t *s, *slot = NULL;
    uint32_t h = hash_of(key, klen);

    if ((*why = check(key, klen, v)) != NULL) {
        return RIC_ERROR;
    }
    if (d->nslots == 0) {
        *why = "the dictionary has no room";
        return RIC_ERROR;
    }
    lock(d);
    s = find(d, key, klen, h, &slot);
    if (v->type == RIC_DICT_NONE) {
        if (s != NULL) {
            s->state = 0;
        }
        unlock(d);
        return RIC_OK;
    }
    if (s == NULL) {
        s = slot;
        s->hash = h;
        s->klen = (uint8_t) klen;
        memcpy(s->key, key, klen);
    }
    s->type = (uint8_t) v->type;
    s->num = v->num;
    s->vlen = v->type == RIC_DICT_STRING ? (uint16_t) v->len : 0;
    if (v->type == RIC_DICT_STRING) {
        memcpy(s->value, v->str, v->len);
    }
    s->expires = ttl_ms > 0 ? ric_now_ms() + ttl_ms : 0;
    s->used = ++d->clock;
    s->state = 1;
    unlock(d);
    return RIC_OK;
}

int
ric_shared_dict_incr(struct ric_dict_s *d, const char *key, size_t klen, double n,
                     const double *init, double *result)
{
    slot_t *s, *slot = NULL;
    uint32_t h = hash_of(key, klen);
    int rc = RIC_OK;

    if (check(key, klen, NULL) != NULL || d->nslots == 0) {
        return RIC_ERROR;
    }
    lock(d);
    s = find(d, key, klen, h, &slot);
    if (s == NULL && init == NULL) {
        rc = RIC_DECLINED;
    } else if (s == NULL) {
        s = slot;
        s->hash = h;
        s->klen = (uint8_t) klen;
        memcpy(s->key, key, klen);
        s->type = RIC_DICT_NUMBER;
        s->num = *init + n;
        s->vlen = 0;
        s->expires = 0;
        s->state = 1;
    } else if (s->type != RIC_DICT_NUMBER) {
        rc = RIC_ERROR;
    } else {
        s->num += n;
    }
    if (rc == RIC_OK) {
        s->used = ++d->clock;
        *result = s->num;
    }
    unlock(d);
    return rc;
}
