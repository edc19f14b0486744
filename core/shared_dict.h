/* shared_dict.h: lua_shared_dict: small key-value dictionaries in the shared zone, the same for every worker, for route scripts. */
#ifndef RIC_SHARED_DICT_H
#define RIC_SHARED_DICT_H

#include "ric_core.h"

#define RIC_DICT_KEY_MAX 64     /* bytes of a key */
#define RIC_DICT_VALUE_MAX 224  /* bytes of a string value */
#define RIC_DICT_MIN_SIZE (8 << 10)
#define RIC_DICT_NAME_MAX 64    /* bytes of a dictionary's name */

/* One `lua_shared_dict NAME SIZE;` (http level). */
typedef struct ric_shared_dict_conf_s ric_shared_dict_conf_t;
struct ric_shared_dict_conf_s {
    char *name;
    int64_t size;
    const char *file;
    int line;
    struct ric_dict_s *dict;    /* its entry in the shared zone (the master makes it) */
    ric_shared_dict_conf_t *next;
};

/* A value: a string (up to RIC_DICT_VALUE_MAX bytes), a number or a boolean. */
typedef struct {
    int type;          /* RIC_DICT_NONE (not there), _STRING, _NUMBER, _BOOLEAN */
    const char *str;   /* _STRING: its bytes (the caller's, or a copy in buf on get) */
    size_t len;
    double num;        /* _NUMBER; _BOOLEAN: 0 or 1 */
} ric_dict_value_t;

#define RIC_DICT_NONE 0
#define RIC_DICT_STRING 1
#define RIC_DICT_NUMBER 2
#define RIC_DICT_BOOLEAN 3

struct ric_conf_s;
struct ric_shm_s;

/* Bytes the dictionaries of conf need in the zone. */
size_t ric_shared_dict_zone_size(const struct ric_conf_s *conf);

/* Gives every dictionary of conf its entry in the zone (the master, before
 * the first fork; an entry of the same name and size is kept, with what it
 * holds). RIC_OK, or RIC_ERROR with a reason in err. */
int ric_shared_dict_share(struct ric_conf_s *conf, struct ric_shm_s *zone, char *err,
                          size_t errlen);

/* The configuration being read declares list (each lua_shared_dict, as it
 * is read: a script loaded after it may name it). */
void ric_shared_dict_declare(ric_shared_dict_conf_t *list);

/* A configuration's http block begins: nothing is declared yet. */
void ric_shared_dict_begin(void);

/* A script's main chunk runs while the configuration is read (on: 1) or
 * it is over (0): meanwhile a name not declared yet may be asked for. */
void ric_shared_dict_reading(int on);

/* A main chunk asks for name, not declared so far, at where (its
 * "FILE:LINE: "): 1 when the configuration is being read, and the name
 * is then known (without an entry) until ric_shared_dict_resolve; 0 when
 * it is not (or the name can never be declared). */
int ric_shared_dict_ask(const char *name, size_t len, const char *where);

/* The configuration is read: every name asked for must be declared by
 * now. RIC_OK, or RIC_ERROR with the script's FILE:LINE and reason in err. */
int ric_shared_dict_resolve(char *err, size_t errlen);

/* The dictionary called name in the current configuration, or NULL; *known
 * says whether the name is declared at all (a declared one may have no
 * entry yet: a main chunk run before the zone exists), or asked for while
 * the configuration is read (ric_shared_dict_ask). */
struct ric_dict_s *ric_shared_dict_find(const char *name, size_t len, int *known);

/* get: *out (a string is copied into buf, RIC_DICT_VALUE_MAX bytes). A key
 * that expired is not there. */
void ric_shared_dict_get(struct ric_dict_s *d, const char *key, size_t klen, ric_dict_value_t *out,
                         char *buf);

/* set: v (type NONE deletes), expiring after ttl_ms (0: never). When the
 * key's neighbourhood is full the least recently used entry there goes.
 * RIC_OK, or RIC_ERROR (a key or value too long: *why says). */
int ric_shared_dict_set(struct ric_dict_s *d, const char *key, size_t klen,
                        const ric_dict_value_t *v, int64_t ttl_ms, const char **why);

/* incr: adds n to a number (a missing key starts from *init when given,
 * else stays missing: RIC_DECLINED). RIC_OK with *result, RIC_DECLINED, or
 * RIC_ERROR when the value is not a number. */
int ric_shared_dict_incr(struct ric_dict_s *d, const char *key, size_t klen, double n,
                         const double *init, double *result);

#endif /* RIC_SHARED_DICT_H */
