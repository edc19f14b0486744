/* test_conf.c: the config grammar, values, defaults, inheritance and every kind of error. */
#include "../../core/conf.c"
#include "idem.h"
#include "idem_store.h"
#include "unit.h"

#include <stdio.h>
#include <sys/stat.h>

static char dir[256];

static void
write_file(const char *name, const char *text)
{
    char path[512];
    FILE *f;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

/* Loads text as DIR/t.conf; returns the conf (or NULL) and the error. */
static ric_conf_t *
load(const char *text, char *err, size_t errlen)
{
    write_file("t.conf", text);
    return ric_conf_load(dir, "t.conf", err, errlen);
}

/* Asserts that text fails with exactly "DIR/t.conf:LINE: reason". */
static void
check_error(const char *name, const char *text, int line, const char *reason)
{
    char err[1024], want[1024];
    ric_conf_t *conf;

    UNIT_CASE(name);
    conf = load(text, err, sizeof(err));
    UNIT_CHECK(conf == NULL);
    ric_conf_free(conf);
    snprintf(want, sizeof(want), "%s/t.conf:%d: %s", dir, line, reason);
    UNIT_CHECK_STR(err, want);
}

static void
test_errors(void)
{
    check_error("unknown directive", "worker_processes 1;\nfoo bar;\n", 2,
                "unknown directive \"foo\"");
    check_error("wrong context", "http {\n  worker_processes 2;\n}\n", 2,
                "\"worker_processes\" directive is not allowed here");
    check_error("location outside server", "http {\n location / {}\n}\n", 2,
                "\"location\" directive is not allowed here");
    check_error("listen in http", "http {\n listen 80;\n}\n", 2,
                "\"listen\" directive is not allowed here");
    check_error("too many args", "worker_processes 1 2;\n", 1,
                "invalid number of arguments in \"worker_processes\" directive");
    check_error("too few args", "http {\n server {\n  listen;\n }\n}\n", 3,
                "invalid number of arguments in \"listen\" directive");
    check_error("block without brace", "http;\n", 1, "directive \"http\" has no opening \"{\"");
    check_error("value with brace", "worker_processes 1 {\n}\n", 1,
                "directive \"worker_processes\" is not terminated by \";\"");
    check_error("bad size", "http {\n client_max_body_size 10x;\n}\n", 2,
                "invalid value \"10x\" in \"client_max_body_size\" directive, expected a size "
                "like 512, 64k, 1m, 1g");
    check_error("negative size", "http {\n client_max_body_size -1;\n}\n", 2,
                "invalid value \"-1\" in \"client_max_body_size\" directive, expected a size "
                "like 512, 64k, 1m, 1g");
    check_error("bad time", "http {\n keepalive_timeout 5 s;\n}\n", 2,
                "invalid number of arguments in \"keepalive_timeout\" directive");
    check_error("bad time unit", "http {\n send_timeout 5y;\n}\n", 2,
                "invalid value \"5y\" in \"send_timeout\" directive, expected a time like "
                "500ms, 30s, 1m30s, 2h");
    check_error("bad workers", "worker_processes many;\n", 1,
                "invalid value \"many\" in \"worker_processes\" directive, expected \"auto\" "
                "or a number from 1 to 1024");
    check_error("bad flag", "daemon yes;\n", 1,
                "invalid value \"yes\" in \"daemon\" directive, it must be \"on\" or \"off\"");
    check_error("duplicate", "worker_processes 1;\n\nworker_processes 2;\n", 3,
                "\"worker_processes\" directive is duplicate");
    check_error("duplicate listen",
                "http {\n server {\n  listen 127.0.0.1:8080;\n  listen 127.0.0.1:8080;\n }\n}\n",
                4, "duplicate listen 127.0.0.1:8080");
    check_error("duplicate default server",
                "http {\n server {\n  listen 127.0.0.1:8080 default_server;\n }\n"
                " server {\n  listen 127.0.0.1:8080 default_server;\n }\n}\n",
                6, "a duplicate default server for 127.0.0.1:8080");
    check_error("bad port", "http {\n server {\n  listen 127.0.0.1:99999;\n }\n}\n", 3,
                "invalid port in \"127.0.0.1:99999\"");
    check_error("hostname in listen", "http {\n server {\n  listen localhost:80;\n }\n}\n", 3,
                "invalid address \"localhost:80\" in \"listen\": expected an IP address");
    check_error("bad listen param", "http {\n server {\n  listen 80 fast;\n }\n}\n", 3,
                "invalid parameter \"fast\" in \"listen\" directive");
    check_error("server without listen", "http {\n\n server {\n  server_name a;\n }\n}\n", 3,
                "server has no \"listen\" directive");
    check_error("missing semicolon at eof", "worker_processes 1", 1,
                "unexpected end of file, expecting \";\" or \"}\"");
    check_error("missing brace at eof", "http {\n server {\n listen 80;\n }\n", 4,
                "unexpected end of file, expecting \"}\"");
    check_error("stray brace", "worker_processes 1;\n}\n", 2, "unexpected \"}\"");
    check_error("stray semicolon", "http {\n ;\n}\n", 2, "unexpected \";\"");
    check_error("unterminated quote", "error_log \"x\n\n", 3,
                "unexpected end of file, expecting \"\"\"");
    check_error("garbage after quote", "error_log \"a\"b;\n", 1,
                "unexpected \"b\" after a quoted string");
    check_error("bad log level", "error_log stderr loud;\n", 1,
                "invalid log level \"loud\"; expected one of debug, info, notice, warn, "
                "error, crit, alert, emerg");
    check_error("regex location", "http {\n server {\n  listen 80;\n  location ~ ^/a {}\n }\n}\n",
                4, "regular expression locations are not supported; use \"=\" or a prefix");
    check_error("duplicate location",
                "http {\n server {\n  listen 80;\n  location /a {}\n  location /a {}\n }\n}\n", 5,
                "duplicate location \"/a\"");
    check_error("location without slash",
                "http {\n server {\n  listen 80;\n  location a {}\n }\n}\n", 4,
                "invalid location \"a\" in \"location\" directive, it must start with \"/\"");
    check_error("location that is no normalized path",
                "http {\n server {\n  listen 80;\n  location /a/./%62%3f {}\n }\n}\n", 4,
                "location \"/a/./%62%3f\" can never match: locations are matched against the "
                "normalized path; write \"/a/b%3F\"");
    check_error("location a request cannot have",
                "http {\n server {\n  listen 80;\n  location /a/../../b {}\n }\n}\n", 4,
                "location \"/a/../../b\" can never match: a request with that path is refused "
                "(400)");
    check_error("location with a space",
                "http {\n server {\n  listen 80;\n  location = \"/a b\" {}\n }\n}\n", 4,
                "location \"/a b\" can never match: a request's path has no space or control "
                "byte: write it %-escaped, as a client sends it (%20)");
    check_error("duplicate upstream", "http {\n upstream u { server 127.0.0.1:1; }\n"
                " upstream u { server 127.0.0.1:2; }\n}\n", 3, "duplicate upstream \"u\"");
    check_error("empty upstream", "http {\n upstream u {\n }\n}\n", 2,
                "no servers in upstream \"u\"");
    check_error("upstream server weight", "http {\n upstream u {\n  server 127.0.0.1:1 weight=0;\n"
                " }\n}\n", 3, "invalid \"weight=0\": weight is 1 to 1000");
    check_error("upstream server param", "http {\n upstream u {\n  server 127.0.0.1:1 backup;\n"
                " }\n}\n", 3, "invalid parameter \"backup\"");
    check_error("duplicate in location",
                "http {\n server {\n  listen 80;\n  location / {\n   send_timeout 1s;\n"
                "   send_timeout 2s;\n  }\n }\n}\n", 6, "\"send_timeout\" directive is duplicate");
    check_error("header timeout in location",
                "http {\n server {\n  listen 80;\n  location / {\n   client_header_timeout 1s;\n"
                "  }\n }\n}\n", 5, "\"client_header_timeout\" directive is not allowed here");
}

/* idempotency_store values, sharing, defaults and inheritance. */
static void
test_idempotency(void)
{
    char err[1024], text[2048];
    ric_conf_t *conf;
    ric_location_conf_t *a, *b, *c;

    UNIT_CASE("idempotency defaults");
    conf = load("http { server { listen 127.0.0.1:1; location / { proxy_pass http://127.0.0.1:2; } } }\n",
                err, sizeof(err));
    UNIT_CHECK(conf != NULL);
    if (conf != NULL) {
        a = conf->http->servers->locations;
        UNIT_CHECK(a->refs.idempotency_store != NULL
                   && a->refs.idempotency_store->kind == RIC_IDEM_STORE_OFF);
        UNIT_CHECK(a->settings.idempotency_ttl == 24 * 3600 * 1000LL);
        UNIT_CHECK(a->settings.idempotency_lock_ttl == 60000);
        UNIT_CHECK(a->settings.idempotency_max_body == 1048576);
        UNIT_CHECK(a->settings.idempotency_required == 0);
        UNIT_CHECK(a->settings.idempotency_store_failure == RIC_IDEM_FAIL_CLOSED);
        UNIT_CHECK(a->settings.idempotency_sync == 0);
        UNIT_CHECK(conf->http->idem_stores == NULL);
    }
    ric_conf_free(conf);

    UNIT_CASE("one store shared, inherited, and off below");
    snprintf(text, sizeof(text),
             "http {\n idempotency_store lmdb:%s/i.mdb size=2m;\n server {\n listen 127.0.0.1:1;\n"
             "  location /a { proxy_pass http://127.0.0.1:2; }\n"
             "  location /b { idempotency_store lmdb:i.mdb size=2m; idempotency_store_failure open;"
             " proxy_pass http://127.0.0.1:2; }\n"
             "  location /c { idempotency_store off; proxy_pass http://127.0.0.1:2; }\n"
             "  location /r { idempotency_store redis://127.0.0.1:6390/2; proxy_pass http://127.0.0.1:2; }\n"
             " }\n}\n", dir);
    conf = load(text, err, sizeof(err));
    UNIT_CHECK(conf != NULL);
    if (conf != NULL) {
        a = conf->http->servers->locations;
        b = a->next;
        c = b->next;
        UNIT_CHECK(a->refs.idempotency_store == b->refs.idempotency_store);
        UNIT_CHECK(a->refs.idempotency_store->kind == RIC_IDEM_STORE_LMDB);
        UNIT_CHECK(a->refs.idempotency_store->map_size == 2 * 1048576);
        UNIT_CHECK(b->settings.idempotency_store_failure == RIC_IDEM_FAIL_OPEN);
        UNIT_CHECK(c->refs.idempotency_store->kind == RIC_IDEM_STORE_OFF);
        UNIT_CHECK(c->next->refs.idempotency_store->kind == RIC_IDEM_STORE_REDIS);
        UNIT_CHECK(c->next->refs.idempotency_store->port == 6390);
        UNIT_CHECK(c->next->refs.idempotency_store->db == 2);
        UNIT_CHECK_STR(c->next->refs.idempotency_store->addr, "127.0.0.1");
    }
    ric_conf_free(conf);

    UNIT_CASE("redis credentials, percent-decoded, and masked in the spec");
    conf = load("http {\n idempotency_store redis://app:p%40ss@127.0.0.1:6390/1;\n"
                " server { listen 127.0.0.1:1; location / { proxy_pass http://127.0.0.1:2; } }\n}\n",
                err, sizeof(err));
    UNIT_CHECK(conf != NULL);
    if (conf != NULL) {
        ric_idem_store_conf_t *r = conf->http->servers->locations->refs.idempotency_store;
        UNIT_CHECK_STR(r->user, "app");
        UNIT_CHECK_STR(r->password, "p@ss");
        UNIT_CHECK_STR(r->spec, "redis://app:***@127.0.0.1:6390/1");
        UNIT_CHECK(r->port == 6390 && r->db == 1);
    }
    ric_conf_free(conf);
    check_error("redis bad credentials", "http {\n idempotency_store redis://:%zz@127.0.0.1;\n}\n", 2,
                "invalid \"redis://:***@127.0.0.1\" in \"idempotency_store\": expected "
                "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]");
    check_error("store value", "http {\n idempotency_store memcached://x;\n}\n", 2,
                "invalid value \"memcached://x\" in \"idempotency_store\": expected off, lmdb:PATH or "
                "redis://HOST:PORT[/DB]");
    check_error("redis port", "http {\n idempotency_store redis://127.0.0.1:0;\n}\n", 2,
                "invalid \"redis://127.0.0.1:0\" in \"idempotency_store\": expected "
                "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]");
    check_error("redis db", "http {\n idempotency_store redis://127.0.0.1:6379/x;\n}\n", 2,
                "invalid \"redis://127.0.0.1:6379/x\" in \"idempotency_store\": expected "
                "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]");
    check_error("lmdb size", "http {\n idempotency_store lmdb:x.mdb size=1k;\n}\n", 2,
                "invalid \"size=1k\" in \"idempotency_store\": expected size=SIZE of at least 1m");
    check_error("lmdb dir", "http {\n idempotency_store lmdb:/nonexistent/x.mdb;\n}\n", 2,
                "idempotency store \"lmdb:/nonexistent/x.mdb\": cannot open LMDB file "
                "\"/nonexistent/x.mdb\": No such file or directory");
    UNIT_CASE("a map that does not fit on the disk");
    snprintf(text, sizeof(text), "http {\n idempotency_store lmdb:%s/huge.mdb size=100000g;\n}\n", dir);
    conf = load(text, err, sizeof(err));
    UNIT_CHECK(conf == NULL);
    UNIT_CHECK(strstr(err, "t.conf:2: idempotency store") != NULL
               && strstr(err, "cannot reserve the 107374182400000 bytes of the LMDB map") != NULL);
    ric_conf_free(conf);
    check_error("store failure", "http {\n idempotency_store_failure maybe;\n}\n", 2,
                "invalid value \"maybe\" in \"idempotency_store_failure\" directive, it must be "
                "\"closed\" or \"open\"");
    check_error("off with options", "http {\n idempotency_store off size=1m;\n}\n", 2,
                "\"idempotency_store off\" takes no options");

    UNIT_CASE("routes told apart in record keys only where they share a name and location");
    snprintf(text, sizeof(text),
             "http {\n idempotency_store lmdb:%s/r.mdb size=2m;\n"
             " server { listen 127.0.0.1:3; listen 127.0.0.1:1;\n"
             "  location /p { proxy_pass http://127.0.0.1:2; }\n"
             "  location /q { proxy_pass http://127.0.0.1:2; } }\n"
             " server { listen 127.0.0.1:1; location /p { proxy_pass http://127.0.0.1:5; } }\n"
             " server { listen 127.0.0.1:1; listen 127.0.0.1:3;\n"
             "  location /p { proxy_pass http://127.0.0.1:4; }\n"
             "  location = /q { proxy_pass http://127.0.0.1:4; } }\n"
             " server { server_name x; listen 127.0.0.1:1; location /p { proxy_pass http://127.0.0.1:2; } }\n"
             " server { listen 127.0.0.1:6; location /p { idempotency_store off; proxy_pass http://127.0.0.1:2; } }\n"
             "}\n", dir);
    conf = load(text, err, sizeof(err));
    UNIT_CHECK(conf != NULL);
    if (conf != NULL) {
        ric_server_conf_t *s1 = conf->http->servers, *s2 = s1->next, *s3 = s2->next;
        UNIT_CHECK_STR(s1->locations->idem_route,
                       "listen 127.0.0.1:1 127.0.0.1:3 upstream http://127.0.0.1:2");
        UNIT_CHECK_STR(s3->locations->idem_route,
                       "listen 127.0.0.1:1 127.0.0.1:3 upstream http://127.0.0.1:4");
        UNIT_CHECK_STR(s2->locations->idem_route, "listen 127.0.0.1:1");
        UNIT_CHECK(s1->locations->next->idem_route == NULL);    /* /q and = /q differ */
        UNIT_CHECK(s3->locations->next->idem_route == NULL);
        UNIT_CHECK(s3->next->locations->idem_route == NULL);    /* named x: alone */
        UNIT_CHECK(s3->next->next->locations->idem_route == NULL); /* no store */
    }
    ric_conf_free(conf);
}

static void
test_include(void)
{
    char err[1024], want[1024];
    ric_conf_t *conf;

    UNIT_CASE("include with glob, in order, relative to the prefix");
    snprintf(want, sizeof(want), "%s/inc", dir);
    mkdir(want, 0755);
    write_file("inc/a.conf", "server { listen 127.0.0.1:1001; server_name a; }\n");
    write_file("inc/b.conf", "server { listen 127.0.0.1:1002; server_name b; }\n");
    conf = load("http {\n include inc/*.conf;\n}\n", err, sizeof(err));
    UNIT_CHECK(conf != NULL);
    if (conf) {
        UNIT_CHECK_STR(conf->http->servers->names[0], "a");
        UNIT_CHECK_STR(conf->http->servers->next->names[0], "b");
        ric_conf_free(conf);
    }

    UNIT_CASE("an error inside an included file names that file");
    write_file("inc/c.conf", "\n\nbogus;\n");
    conf = load("http {\n include inc/c.conf;\n}\n", err, sizeof(err));
    UNIT_CHECK(conf == NULL);
    snprintf(want, sizeof(want), "%s/inc/c.conf:3: unknown directive \"bogus\"", dir);
    UNIT_CHECK_STR(err, want);

    UNIT_CASE("a missing include without wildcards is an error");
    conf = load("http {\n\n include nothere.conf;\n}\n", err, sizeof(err));
    UNIT_CHECK(conf == NULL);
    snprintf(want, sizeof(want), "%s/t.conf:3: cannot open \"%s/nothere.conf\": "
             "No such file or directory", dir, dir);
    UNIT_CHECK_STR(err, want);

    UNIT_CASE("a glob matching nothing is fine");
    conf = load("http {\n include none/*.conf;\n server { listen 127.0.0.1:1; }\n}\n", err,
                sizeof(err));
    UNIT_CHECK(conf != NULL);
    ric_conf_free(conf);

    UNIT_CASE("include loops are caught");
    write_file("loop.conf", "include loop.conf;\n");
    conf = load("include loop.conf;\n", err, sizeof(err));
    UNIT_CHECK(conf == NULL);
    UNIT_CHECK(strstr(err, "includes nested too deeply") != NULL);

    UNIT_CASE("a missing config file");
    conf = ric_conf_load(dir, "absent.conf", err, sizeof(err));
    UNIT_CHECK(conf == NULL);
    snprintf(want, sizeof(want), "%s/absent.conf: cannot open: No such file or directory", dir);
    UNIT_CHECK_STR(err, want);
}

static void
test_values(void)
{
    int64_t v;

    UNIT_CASE("sizes");
    UNIT_CHECK(ric_conf_parse_size("0", &v) == RIC_OK && v == 0);
    UNIT_CHECK(ric_conf_parse_size("512", &v) == RIC_OK && v == 512);
    UNIT_CHECK(ric_conf_parse_size("64k", &v) == RIC_OK && v == 65536);
    UNIT_CHECK(ric_conf_parse_size("64K", &v) == RIC_OK && v == 65536);
    UNIT_CHECK(ric_conf_parse_size("1m", &v) == RIC_OK && v == 1048576);
    UNIT_CHECK(ric_conf_parse_size("2g", &v) == RIC_OK && v == 2147483648LL);
    UNIT_CHECK(ric_conf_parse_size("", &v) == RIC_ERROR);
    UNIT_CHECK(ric_conf_parse_size("k", &v) == RIC_ERROR);
    UNIT_CHECK(ric_conf_parse_size("1.5m", &v) == RIC_ERROR);
    UNIT_CHECK(ric_conf_parse_size("-1", &v) == RIC_ERROR);
    UNIT_CHECK(ric_conf_parse_size("99999999999g", &v) == RIC_ERROR);
    UNIT_CHECK(ric_conf_parse_size("10mb", &v) == RIC_ERROR);

    UNIT_CASE("times");
    UNIT_CHECK(ric_conf_parse_time("500ms", &v) == RIC_OK && v == 500);
    UNIT_CHECK(ric_conf_parse_time("30", &v) == RIC_OK && v == 30000);
    UNIT_CHECK(ric_conf_parse_time("30s", &v) == RIC_OK && v == 30000);
    UNIT_CHECK(ric_conf_parse_time("2m", &v) == RIC_OK && v == 120000);
    UNIT_CHECK(ric_conf_parse_time("1h", &v) == RIC_OK && v == 3600000);
    UNIT_CHECK(ric_conf_parse_time("1d", &v) == RIC_OK && v == 86400000);
    UNIT_CHECK(ric_conf_parse_time("1m30s", &v) == RIC_OK && v == 90000);
    UNIT_CHECK(ric_conf_parse_time("1h30m5s250ms", &v) == RIC_OK && v == 5405250);
    UNIT_CHECK(ric_conf_parse_time("30s1m", &v) == RIC_ERROR);
    UNIT_CHECK(ric_conf_parse_time("1s1s", &v) == RIC_ERROR);
    UNIT_CHECK(ric_conf_parse_time("", &v) == RIC_ERROR);
    UNIT_CHECK(ric_conf_parse_time("s", &v) == RIC_ERROR);
    UNIT_CHECK(ric_conf_parse_time("-1s", &v) == RIC_ERROR);
    UNIT_CHECK(ric_conf_parse_time("1.5s", &v) == RIC_ERROR);
    UNIT_CHECK(ric_conf_parse_time("5y", &v) == RIC_ERROR);
    UNIT_CHECK(ric_conf_parse_time("99999999999999999d", &v) == RIC_ERROR);

    UNIT_CASE("numbers");
    UNIT_CHECK(ric_conf_parse_number("9223372036854775807", &v) == RIC_OK);
    UNIT_CHECK(ric_conf_parse_number("9223372036854775808", &v) == RIC_ERROR);
    UNIT_CHECK(ric_conf_parse_number("+1", &v) == RIC_ERROR);
}

/* worker_watchdog: off, a time of at least 1s, main context only; 5s by default. */
static void
test_watchdog(void)
{
    char err[1024];
    ric_conf_t *conf;

    UNIT_CASE("worker_watchdog: 5s by default");
    conf = load("worker_processes 1;\n", err, sizeof(err));
    UNIT_CHECK(conf != NULL);
    UNIT_CHECK_INT(conf ? conf->worker_watchdog : -2, 5000);
    ric_conf_free(conf);

    UNIT_CASE("worker_watchdog off");
    conf = load("worker_watchdog off;\n", err, sizeof(err));
    UNIT_CHECK(conf != NULL);
    UNIT_CHECK_INT(conf ? conf->worker_watchdog : -2, 0);
    ric_conf_free(conf);

    UNIT_CASE("worker_watchdog 1s and 1m30s");
    conf = load("worker_watchdog 1s;\n", err, sizeof(err));
    UNIT_CHECK_INT(conf ? conf->worker_watchdog : -2, 1000);
    ric_conf_free(conf);
    conf = load("worker_watchdog 1m30s;\n", err, sizeof(err));
    UNIT_CHECK_INT(conf ? conf->worker_watchdog : -2, 90000);
    ric_conf_free(conf);

    check_error("worker_watchdog under 1s", "worker_watchdog 999ms;\n", 1,
                "invalid value \"999ms\" in \"worker_watchdog\" directive, expected off or a "
                "time of at least 1s, like 5s");
    check_error("worker_watchdog 0", "worker_processes 1;\nworker_watchdog 0;\n", 2,
                "invalid value \"0\" in \"worker_watchdog\" directive, expected off or a time "
                "of at least 1s, like 5s");
    check_error("worker_watchdog on", "worker_watchdog on;\n", 1,
                "invalid value \"on\" in \"worker_watchdog\" directive, expected off or a time "
                "of at least 1s, like 5s");
    check_error("worker_watchdog twice", "worker_watchdog off;\nworker_watchdog 5s;\n", 2,
                "\"worker_watchdog\" directive is duplicate");
    check_error("worker_watchdog in http", "http {\n worker_watchdog 5s;\n}\n", 2,
                "\"worker_watchdog\" directive is not allowed here");
    check_error("worker_watchdog without a value", "worker_watchdog;\n", 1,
                "invalid number of arguments in \"worker_watchdog\" directive");
}

static void
test_grammar_and_inheritance(void)
{
    char err[1024];
    ric_conf_t *conf;
    ric_server_conf_t *s;

    UNIT_CASE("quotes, escapes, comments and defaults");
    conf = load("# a comment\n"
                "worker_processes \"3\"; # trailing comment\n"
                "error_log 'err\\'s.log' warn;\n"
                "http {\n"
                "  keepalive_timeout 10s;\n"
                "  server {\n"
                "    listen 127.0.0.1:8081 default_server;\n"
                "    server_name Example.COM *.example.org;\n"
                "    client_max_body_size 2m;\n"
                "    location / { send_timeout 5s; }\n"
                "    location = /exact { keepalive_timeout 1s; }\n"
                "  }\n"
                "}\n",
                err, sizeof(err));
    UNIT_CHECK(conf != NULL);
    if (conf == NULL) {
        fprintf(stderr, "  error: %s\n", err);
        return;
    }
    UNIT_CHECK_INT(conf->worker_processes, 3);
    UNIT_CHECK(strstr(conf->error_log, "/err's.log") != NULL);
    UNIT_CHECK_INT(conf->error_log_level, RIC_LOG_WARN);
    UNIT_CHECK_STR(conf->pid_path, "off");
    UNIT_CHECK_INT(conf->worker_connections, 1024);
    UNIT_CHECK_INT(conf->daemon, 0);
    s = conf->http->servers;
    UNIT_CHECK_STR(s->names[0], "example.com");
    UNIT_CHECK_STR(s->names[1], "*.example.org");
    UNIT_CHECK_INT(conf->http->settings.client_header_timeout, 60000);
    UNIT_CHECK_INT(conf->http->settings.client_max_body_size, 1048576);
    UNIT_CHECK_INT(s->settings.keepalive_timeout, 10000);      /* from http */
    UNIT_CHECK_INT(s->settings.client_max_body_size, 2097152); /* its own */
    UNIT_CHECK_INT(s->locations->settings.send_timeout, 5000);
    UNIT_CHECK_INT(s->locations->settings.client_max_body_size, 2097152); /* from server */
    UNIT_CHECK_INT(s->locations->next->exact, 1);
    UNIT_CHECK_INT(s->locations->next->settings.keepalive_timeout, 1000);
    UNIT_CHECK_INT(s->locations->next->settings.send_timeout, 60000); /* default */
    UNIT_CHECK(conf->listeners != NULL && conf->listeners->default_server == s);
    ric_conf_free(conf);

    UNIT_CASE("servers sharing an address share one listener");
    conf = load("http {\n"
                "  server { listen 127.0.0.1:9000; server_name a; }\n"
                "  server { listen 127.0.0.1:9000 default_server; server_name b; }\n"
                "  server { listen 127.0.0.1:9001; listen [::1]:9000; }\n"
                "  upstream api { server 127.0.0.1:7000 weight=3 max_fails=2 fail_timeout=5s;"
                " server [::1]:7001; keepalive 8; }\n"
                "}\n", err, sizeof(err));
    UNIT_CHECK(conf != NULL);
    if (conf == NULL) {
        fprintf(stderr, "  error: %s\n", err);
        return;
    }
    UNIT_CHECK_STR(conf->listeners->text, "127.0.0.1:9000");
    UNIT_CHECK_STR(conf->listeners->default_server->names[0], "b");
    UNIT_CHECK_STR(conf->listeners->next->text, "127.0.0.1:9001");
    UNIT_CHECK_STR(conf->listeners->next->next->text, "[::1]:9000");
    UNIT_CHECK(conf->listeners->next->next->next == NULL);
    UNIT_CHECK_STR(conf->http->upstreams->servers->host, "127.0.0.1");
    UNIT_CHECK_INT(conf->http->upstreams->servers->weight, 3);
    UNIT_CHECK_INT(conf->http->upstreams->servers->max_fails, 2);
    UNIT_CHECK_INT(conf->http->upstreams->servers->fail_timeout, 5000);
    UNIT_CHECK_STR(conf->http->upstreams->servers->next->host, "::1");
    UNIT_CHECK_INT(conf->http->upstreams->keepalive, 8);
    UNIT_CHECK_INT(conf->http->upstreams->keepalive_timeout, 60000);
    ric_conf_free(conf);

    UNIT_CASE("the embedded default loads");
    conf = ric_conf_load("/nonexistent-prefix", NULL, err, sizeof(err));
    UNIT_CHECK(conf != NULL);
    if (conf) {
        UNIT_CHECK_STR(conf->file, "(embedded default)");
        UNIT_CHECK_STR(conf->listeners->text, "127.0.0.1:8080");
        ric_conf_free(conf);
    }
}

/* The retry budget's one owner: the upstream. */
static void
test_budget_owner(void)
{
    char err[1024], want[1024];
    ric_conf_t *conf;
    const ric_upstream_conf_t *u;

    UNIT_CASE("the default budget: adaptive max=100 wait=5s");
    conf = load("http {\n upstream b { server 127.0.0.1:1; }\n"
                " server { listen 127.0.0.1:1; location / { proxy_pass http://b; } }\n}\n",
                err, sizeof(err));
    UNIT_CHECK(conf != NULL);
    if (conf != NULL) {
        u = conf->http->upstreams;
        UNIT_CHECK_INT(u->budget->kind, RIC_BUDGET_ADAPTIVE);
        UNIT_CHECK_INT(u->budget->max_tokens, 100);
        UNIT_CHECK_INT(u->budget->wait_ms, 5000);
    }
    ric_conf_free(conf);

    UNIT_CASE("the upstream block sets it; an http one is the default it overrides");
    conf = load("http {\n retry_budget 20%;\n"
                " upstream b { server 127.0.0.1:1; retry_budget adaptive max=50 wait=2s; }\n"
                " upstream c { server 127.0.0.1:2; }\n"
                " server { listen 127.0.0.1:1; location / { proxy_pass http://b; }\n"
                "   location /c { proxy_pass http://c; } location /d { proxy_pass http://127.0.0.1:3; } }\n}\n",
                err, sizeof(err));
    UNIT_CHECK(conf != NULL);
    if (conf != NULL) {
        u = conf->http->upstreams;
        UNIT_CHECK_INT(u->budget->kind, RIC_BUDGET_ADAPTIVE);
        UNIT_CHECK_INT(u->budget->max_tokens, 50);
        UNIT_CHECK_INT(u->budget->wait_ms, 2000);
        UNIT_CHECK_INT(u->next->budget->kind, RIC_BUDGET_RATIO);
        UNIT_CHECK(u->next->budget->ratio == 0.2);
        UNIT_CHECK_INT(u->next->budget->min_per_sec, 10);
        UNIT_CHECK_INT(u->next->next->budget->kind, RIC_BUDGET_RATIO); /* implicit */
    }
    ric_conf_free(conf);

    UNIT_CASE("a location's budget goes to its upstream; locations that agree are fine");
    conf = load("http {\n upstream b { server 127.0.0.1:1; }\n"
                " server { listen 127.0.0.1:1; retry_budget off;\n"
                "   location / { proxy_pass http://b; } location /x { proxy_pass http://b; } }\n}\n",
                err, sizeof(err));
    UNIT_CHECK(conf != NULL);
    if (conf != NULL) {
        UNIT_CHECK_INT(conf->http->upstreams->budget->kind, RIC_BUDGET_OFF);
    }
    ric_conf_free(conf);

    UNIT_CASE("two locations, one upstream, two budgets");
    snprintf(want, sizeof(want), "%s/t.conf:6: \"retry_budget 50%% min=10/s\" for upstream \"b\" "
             "differs from \"retry_budget 20%% min=10/s\" at %s/t.conf:5: locations that share an "
             "upstream share its budget; set retry_budget once, in its upstream block", dir, dir);
    load("http {\n upstream b { server 127.0.0.1:1; }\n server {\n  listen 127.0.0.1:1;\n"
         "  location / { proxy_pass http://b; retry_budget 20%; }\n"
         "  location /x { proxy_pass http://b; retry_budget 50%; }\n }\n}\n", err, sizeof(err));
    UNIT_CHECK_STR(err, want);

    UNIT_CASE("the line reported is the one that departs from the default");
    conf = load("http {\n upstream b { server 127.0.0.1:1; }\n server {\n  listen 127.0.0.1:1;\n"
                "  location / { proxy_pass http://b; }\n"
                "  location /x { proxy_pass http://b; retry_budget off; }\n }\n}\n", err, sizeof(err));
    UNIT_CHECK(conf == NULL);
    snprintf(want, sizeof(want), "%s/t.conf:6: \"retry_budget off\" for upstream \"b\" differs "
             "from the default \"retry_budget adaptive max=100 wait=5s\" that the location inherits at "
             "%s/t.conf:5: locations that share "
             "an upstream share its budget; set retry_budget once, in its upstream block", dir, dir);
    UNIT_CHECK_STR(err, want);
    ric_conf_free(conf);

    UNIT_CASE("a location against its upstream block");
    conf = load("http {\n upstream b { server 127.0.0.1:1;\n  retry_budget adaptive; }\n"
                " server {\n  listen 127.0.0.1:1;\n"
                "  location / { proxy_pass http://b;\n   retry_budget 10%; }\n }\n}\n", err,
                sizeof(err));
    UNIT_CHECK(conf == NULL);
    snprintf(want, sizeof(want), "%s/t.conf:7: \"retry_budget 10%% min=10/s\" conflicts with "
             "\"retry_budget adaptive max=100 wait=5s\" of upstream \"b\" at %s/t.conf:3: a budget "
             "belongs to its upstream; set it once", dir, dir);
    UNIT_CHECK_STR(err, want);
    ric_conf_free(conf);

    check_error("a bad option", "http {\n retry_budget adaptive max=0;\n}\n", 2,
                "invalid \"max=0\" in \"retry_budget\": expected max=N tokens, 1 to 1000000");
    check_error("a bad wait", "http {\n retry_budget adaptive wait=soon;\n}\n", 2,
                "invalid \"wait=soon\" in \"retry_budget\": expected wait=TIME, e.g. wait=5s (0 "
                "never waits)");
    check_error("ratio options on adaptive", "http {\n retry_budget adaptive min=1/s;\n}\n", 2,
                "invalid \"min=1/s\" in \"retry_budget\": an adaptive budget takes max=N and "
                "wait=TIME");
    check_error("off takes nothing", "http {\n retry_budget off max=3;\n}\n", 2,
                "\"retry_budget off\" takes no options");
    check_error("a bad word", "http {\n retry_budget lots;\n}\n", 2,
                "invalid \"lots\" in \"retry_budget\": expected adaptive, off, a percentage like "
                "20% or a fraction like 0.2");
    check_error("an option twice", "http {\n retry_budget adaptive max=1 max=3;\n}\n", 2,
                "\"max=\" given twice in \"retry_budget\"");
    check_error("twice in an upstream",
                "http {\n upstream b { server 127.0.0.1:1; retry_budget off;\n retry_budget off; }\n}\n",
                3, "\"retry_budget\" directive is duplicate");
}

int
main(void)
{
    char cmd[300];
    int rc;

    snprintf(dir, sizeof(dir), "/tmp/ric_test_conf.XXXXXX");
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    test_values();
    test_errors();
    test_budget_owner();
    test_idempotency();
    test_include();
    test_grammar_and_inheritance();
    test_watchdog();
    rc = UNIT_DONE("conf");
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0) {
        fprintf(stderr, "could not remove %s\n", dir);
    }
    return rc;
}
