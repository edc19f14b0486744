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

/* Every case of tests/path_cases.txt (which the test kit's normalizer runs
 * too), and ric_route_path_normal agrees with what normalizing does. */
static void
test_normalize(void)
{
    FILE *f = fopen("tests/path_cases.txt", "r");
    char line[512], in[256], want[256];
    u_char out[256];
    size_t n;
    int rc, cases = 0;

    UNIT_CASE("tests/path_cases.txt is read (run from the top of the tree)");
    UNIT_CHECK(f != NULL);
    if (f == NULL) {
        return;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        if (line[0] == '#' || line[0] == '\n' || sscanf(line, "%255s %255s", in, want) != 2) {
            continue;
        }
        cases++;
        UNIT_CASE(in);
        memset(out, 0xAA, sizeof(out));
        rc = ric_route_normalize((const u_char *) in, strlen(in), out, &n);
        if (strcmp(want, "400") == 0) {
            UNIT_CHECK_INT(rc, RIC_ERROR);
            UNIT_CHECK_INT(ric_route_path_normal((const u_char *) in, strlen(in)), 0);
            continue;
        }
        UNIT_CHECK_INT(rc, RIC_OK);
        UNIT_CHECK(n <= strlen(in) && out[strlen(in)] == 0xAA); /* never longer, nothing past */
        out[n] = '\0';
        UNIT_CHECK_STR((const char *) out, want);
        UNIT_CHECK_INT(ric_route_path_normal((const u_char *) in, strlen(in)), strcmp(in, want) == 0);
        UNIT_CHECK_INT(ric_route_path_normal(out, n), 1);
    }
    fclose(f);
    UNIT_CASE("the cases file has its cases");
    UNIT_CHECK(cases > 40);

    UNIT_CASE("the query is no part of the path: '?' and after it untouched by routing");
    UNIT_CHECK_INT(ric_route_normalize((const u_char *) "/a/./b", 6, out, &n), RIC_OK);
    UNIT_CHECK(n == 4 && memcmp(out, "/a/b", 4) == 0);
}

static void
test_host_name(void)
{
    static const struct {
        const char *host, *name;
    } cases[] = {
        { "Example.COM:8080", "Example.COM" }, { "a.test.", "a.test" }, { "a.test.:80", "a.test" },
        { "[::1]:8080", "[::1]" }, { "[::1]", "[::1]" }, { "anything", "anything" }, { "", "" },
    };
    ric_str_t got;
    size_t i;

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        UNIT_CASE(cases[i].host);
        got = ric_route_host_name(str(cases[i].host));
        UNIT_CHECK(got.len == strlen(cases[i].name)
                   && memcmp(got.data, cases[i].name, got.len) == 0);
    }
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
    test_normalize();
    test_host_name();
    return UNIT_DONE("route");
}
