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

/* The path locations match and a route script sees as req.path, as nginx's
 * $uri: escapes of unreserved characters and of bytes beyond ASCII
 * decoded, other escapes (reserved characters, '%', space, controls) kept in
 * uppercase hex, "." and ".." segments resolved (RFC 3986 §5.2.4), repeated
 * slashes merged. A target that is not a path ("*") is kept as it is.
 * Writes at most len bytes to out (the result is never longer). Returns
 * RIC_OK, or RIC_ERROR for a path that cannot be a resource, which the
 * client gets 400 for: a bad escape, an encoded NUL, an encoded '/' (whether
 * it splits the path is the upstream's choice, so no check could see what
 * the upstream serves), a backslash (WHATWG parsers read it as '/'), or ".."
 * above the root. */
int ric_route_normalize(const u_char *path, size_t len, u_char *out, size_t *out_len);

/* 1 when ric_route_normalize would give path back unchanged (the common
 * case, which then needs no copy), 0 when it would change or refuse it. */
int ric_route_path_normal(const u_char *path, size_t len);

/* The name in a Host value or an absolute-form authority as servers are
 * chosen by: a span of host without its port and trailing dot (not yet
 * lowercased). */
ric_str_t ric_route_host_name(ric_str_t host);

#endif /* RIC_ROUTE_H */
