/* access_log.h: one JSON object per line for every request, with each upstream attempt. */
#ifndef RIC_ACCESS_LOG_H
#define RIC_ACCESS_LOG_H

#include "ric_core.h"
#include "conf.h"

/* One upstream attempt of a request, as the access log reports it. */
typedef struct {
    const char *server; /* "127.0.0.1:9000"; NULL when none was picked */
    const char *class;  /* connect_error, reset, timeout, bad_response, status */
    int status;         /* the upstream's status, 0 when none arrived */
    int64_t duration_us;
    int64_t wait_us;    /* backoff before this attempt */
    const char *regime; /* what chose the wait (a retry's): backoff, fast, scaled, retry_after, script */
    int hedge;          /* 1: sent as the hedge of the first attempt (wait: how long after it) */
} ric_attempt_record_t;

#define RIC_MAX_ATTEMPTS 32 /* logged in full; longer schedules keep the first and the last */

/* A field a route script's on_log added (ctx:set), under "script". */
typedef struct {
    const char *name;
    char *text;         /* a string's bytes, or a number's or boolean's JSON: room for
                         * RIC_SCRIPT_FIELD_VALUE_MAX, so setting it again copies nothing new */
    size_t len;
    int quoted;         /* a string: escaped and quoted as JSON */
} ric_script_field_t;

#define RIC_MAX_SCRIPT_FIELDS 16
#define RIC_SCRIPT_FIELDS_BYTES 2048 /* names and values together */
#define RIC_SCRIPT_FIELD_VALUE_MAX 256 /* a string value's bytes */

typedef struct {
    char id[33];    /* the request's (ric_request_id) */
    const char *client;
    ric_str_t method;
    ric_str_t path; /* the request target as sent */
    ric_str_t host;
    int status;
    uint64_t bytes; /* sent to the client, head included */
    int64_t duration_us;
    const char *upstream; /* the server of the final answer, or NULL */
    ric_attempt_record_t attempts[RIC_MAX_ATTEMPTS];
    int nattempts;
    int attempts_total; /* attempts made, when more than were kept */
    const char *not_retried; /* why the last attempt's failure was final; NULL */
    const char *verdict;     /* how the attempts ended: passed, kept, gave_up, cut; NULL: none made */
    const char *reason;      /* ...and why (a retry reason: final_status, budget...) */
    const char *idempotency; /* what the idempotency store did (idem.c); NULL */
    const char *hedge;       /* a hedge was sent: won, lost or failed (ric_metrics_hedge_name) */
    ric_script_field_t script[RIC_MAX_SCRIPT_FIELDS]; /* on_log's ctx:set, in order */
    int nscript;
    size_t script_bytes;
} ric_access_entry_t;

/* Opens every access log of conf (done by the master, so workers inherit
 * the descriptors). Returns RIC_OK, or RIC_ERROR with a reason in err. */
int ric_access_log_open(ric_conf_t *conf, char *err, size_t errlen);

/* Reopens the log files after rotation (SIGUSR1). */
void ric_access_log_reopen(ric_conf_t *conf);

/* Writes e as one line to log: with a single write(2), or into the
 * worker's buffer (buffer=), whose every write holds whole lines; "off"
 * does nothing. */
void ric_access_log_write(ric_access_log_t *log, const ric_access_entry_t *e);

/* Writes the buffers whose oldest line is flush= old by now (all: every
 * buffer). Returns when the next one will be, or -1 when none waits. */
int64_t ric_access_log_flush_due(ric_conf_t *conf, int64_t now, int all);

/* The worker exits: every buffer written, and freed. */
void ric_access_log_free_buffers(ric_conf_t *conf);

#endif /* RIC_ACCESS_LOG_H */
