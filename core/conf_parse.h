/* conf_parse.h: what the grammar (conf.c) and the directive table (conf_directives.c) share. */
#ifndef RIC_CONF_PARSE_H
#define RIC_CONF_PARSE_H

#include "conf.h"

#define RIC_CONF_MAX_ARGS 64
#define RIC_CONF_NO_OFFSET ((size_t) -1)

typedef struct ric_conf_parse_s ric_conf_parse_t;
typedef struct ric_conf_cmd_s ric_conf_cmd_t;

/* A directive handler: returns NULL on success, or a reason (static, or
 * formatted into cf->reason) that the parser reports as "FILE:LINE: reason";
 * ric_conf_reported when the failure was already reported in full (a block
 * whose contents failed). conf points at the context's struct. */
typedef const char *(*ric_conf_set_pt)(ric_conf_parse_t *cf, const ric_conf_cmd_t *cmd,
                                       void *conf);

struct ric_conf_cmd_s {
    const char *name;
    unsigned contexts;         /* RIC_CONF_MAIN | ... */
    unsigned arity;            /* RIC_CONF_TAKE1 | ... | RIC_CONF_BLOCK */
    ric_conf_set_pt set;       /* parses the arguments */
    size_t offset;             /* of an int64_t field in the context's struct */
    const char *default_value; /* as written in a config; NULL: none */
    const char *summary;       /* one line for `ricochet --directives` */
};

struct ric_conf_parse_s {
    ric_conf_t *conf;
    ric_pool_t *pool;

    /* where we are */
    const char *file;
    int line;
    const char *start, *pos, *end;
    int include_depth;

    /* the current context */
    unsigned ctx;
    ric_server_conf_t *server;
    ric_location_conf_t *location;
    ric_upstream_conf_t *upstream;

    /* the directive being handled: args[0] is its name */
    char *args[RIC_CONF_MAX_ARGS];
    int nargs;
    int directive_line;

    int applying_defaults;

    char reason[512];
    char *err;
    size_t errlen;
};

extern const char ric_conf_reported[];
extern const ric_conf_cmd_t ric_conf_commands[]; /* ends with a NULL name */

/* Parses statements up to the "}" closing the current block. Returns RIC_OK
 * or RIC_ERROR with the error already reported. */
int ric_conf_parse_block(ric_conf_parse_t *cf);

/* Parses the file at path (resolved) in the current context. */
int ric_conf_parse_file(ric_conf_parse_t *cf, const char *path);

/* Formats a reason into cf->reason and returns it. */
const char *ric_conf_reason(ric_conf_parse_t *cf, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Applies the table defaults to unset fields of a context's struct. */
int ric_conf_apply_defaults(ric_conf_parse_t *cf, unsigned ctx, void *conf);

/* Called once the whole file is read: defaults, inheritance, listeners. */
const char *ric_conf_finish(ric_conf_parse_t *cf);

#endif /* RIC_CONF_PARSE_H */
