/* test_route.c: server choice by Host and location choice by path. */
#include "../../core/route.c"
#include "unit.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static ric_str_t
str(const char *s)
{
    ric_str_t r = { (const u_char *) s, s ? strlen(s) : 0 };
    return r;
}

static const char *
server_for(ric_conf_t *conf, const char *host)
{
    ric_server_conf_t *s = ric_route_server(conf->listeners, str(host));
    return s->nnames ? s->names[0] : "(unnamed)";
}

static const char *
location_for(ric_conf_t *conf, const char *path)
{
    ric_location_conf_t *l = ric_route_location(conf->http->servers, str(path));
    return l ? l->path : "(none)";
}

int
main(void)
{
    static const char text[] =
        "http {\n"
        "  server { listen 127.0.0.1:9; server_name first.test;\n"
        "           location / {} location /api {} location /api/v2 {}\n"
        "           location = /api {} location = /exact {} }\n"
        "  server { listen 127.0.0.1:9; server_name *.example.com; }\n"
        "  server { listen 127.0.0.1:9; server_name *.b.example.com; }\n"
        "  server { listen 127.0.0.1:9 default_server; server_name www.example.com default; }\n"
        "}\n";
    ric_conf_t *conf;

    conf = unit_conf_load(text);

    UNIT_CASE("exact names win, case-insensitively, port and trailing dot ignored");
    UNIT_CHECK_STR(server_for(conf, "first.test"), "first.test");
    UNIT_CHECK_STR(server_for(conf, "FIRST.Test:8080"), "first.test");
    UNIT_CHECK_STR(server_for(conf, "first.test."), "first.test");
    UNIT_CHECK_STR(server_for(conf, "www.example.com"), "www.example.com");

    UNIT_CASE("the longest wildcard wins; a wildcard needs a label before it");
    UNIT_CHECK_STR(server_for(conf, "api.example.com"), "*.example.com");
    UNIT_CHECK_STR(server_for(conf, "x.b.example.com"), "*.b.example.com");
    UNIT_CHECK_STR(server_for(conf, "example.com"), "www.example.com");

    UNIT_CASE("no match or no Host: the default server");
    UNIT_CHECK_STR(server_for(conf, "other.test"), "www.example.com");
    UNIT_CHECK_STR(server_for(conf, NULL), "www.example.com");
    UNIT_CHECK_STR(server_for(conf, ""), "www.example.com");

    UNIT_CASE("locations: exact first, then the longest prefix");
    UNIT_CHECK_STR(location_for(conf, "/api"), "/api");
    UNIT_CHECK(ric_route_location(conf->http->servers, str("/api"))->exact == 1);
    UNIT_CHECK_STR(location_for(conf, "/api/users"), "/api");
    UNIT_CHECK(ric_route_location(conf->http->servers, str("/api/users"))->exact == 0);
    UNIT_CHECK_STR(location_for(conf, "/api/v2/x"), "/api/v2");
    UNIT_CHECK_STR(location_for(conf, "/exact"), "/exact");
    UNIT_CHECK_STR(location_for(conf, "/exact/more"), "/");
    UNIT_CHECK_STR(location_for(conf, "/apix"), "/api");
    UNIT_CHECK_STR(location_for(conf, "/"), "/");

    UNIT_CASE("no location matches");
    UNIT_CHECK(ric_route_location(conf->http->servers->next, str("/a")) == NULL);

    ric_conf_free(conf);
    return UNIT_DONE("route");
}
