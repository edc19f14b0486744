/* retry_after.h: the Retry-After field (RFC 9110 §10.2.3): delay-seconds or an HTTP-date in any of its three forms. */
#ifndef RIC_RETRY_AFTER_H
#define RIC_RETRY_AFTER_H

#include "ric_core.h"

#include <time.h>

/* Parses a Retry-After value (leading/trailing OWS allowed) against the
 * wall clock now (seconds since the epoch). On success returns RIC_OK with
 * *delay_ms the wait it asks for: delay-seconds * 1000, or (date - now) *
 * 1000, which is 0 for a date in the past. Returns RIC_ERROR for anything
 * else: empty, signs, fractions, garbage, trailing bytes, an impossible
 * date (Feb 30, hour 24, bad weekday name...), or a delay so large it
 * would overflow. HTTP-date forms (RFC 9110 §5.6.7), all GMT:
 *   IMF-fixdate  Sun, 06 Nov 1994 08:49:37 GMT
 *   RFC 850      Sunday, 06-Nov-94 08:49:37 GMT  (two-digit year: a year
 *                that would be more than 50 years in the future is taken
 *                as the past century, RFC 9110 §5.6.7)
 *   asctime      Sun Nov  6 08:49:37 1994
 * The weekday must be a valid name but is not checked against the date
 * (recipients are lenient there in practice). */
int ric_retry_after_parse(const u_char *value, size_t len, time_t now, int64_t *delay_ms);

/* Formats t as an IMF-fixdate into buf (at least 30 bytes); returns buf. */
char *ric_http_date(time_t t, char *buf, size_t size);

#endif /* RIC_RETRY_AFTER_H */
