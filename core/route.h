/* route.h: choosing the server by Host and the location by path. */
#ifndef RIC_ROUTE_H
#define RIC_ROUTE_H

#include "ric_core.h"
#include "conf.h"

/* The server of listener ls for the Host value (port and trailing dot
 * ignored, case-insensitive): an exact name first, then the longest
 * "*.suffix" wildcard, then the listener's default server. host.data may be
 * NULL (no Host: HTTP/1.0). Never NULL. */
ric_server_conf_t *ric_route_server(const ric_listener_t *ls, ric_str_t host);

/* The location of s for path: "location = /p" when equal, otherwise the
 * longest prefix. NULL when none matches. */
ric_location_conf_t *ric_route_location(const ric_server_conf_t *s, ric_str_t path);

/* The path locations are matched against, as nginx does: %XX decoded,
 * repeated slashes merged, "." and ".." segments resolved. Writes at most
 * len bytes to out (the result is never longer). Returns RIC_OK, or
 * RIC_ERROR for a path that cannot be a resource: a bad %-escape, an
 * encoded NUL, or ".." above the root (the client gets 400). */
int ric_route_normalize(const u_char *path, size_t len, u_char *out, size_t *out_len);

#endif /* RIC_ROUTE_H */
