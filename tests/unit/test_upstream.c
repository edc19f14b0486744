/* test_upstream.c: smooth weighted round robin and passive health, with an injected clock. */
#include "../../core/upstream.c"
#include "unit.h"

#include <stdio.h>
#include <unistd.h>

static int
index_of(ric_upstream_t *u, ric_peer_t *p)
{
    return (int) (p - u->peers);
}

int
main(void)
{
    ric_conf_t *conf = unit_conf_load(
        "http {\n"
        "  upstream w { server 127.0.0.1:1 weight=5; server 127.0.0.1:2; server 127.0.0.1:3; }\n"
        "  upstream h { server 127.0.0.1:1 max_fails=2 fail_timeout=10s;\n"
        "               server 127.0.0.1:2 max_fails=2 fail_timeout=10s; }\n"
        "  upstream one { server 127.0.0.1:1; }\n"
        "  upstream off { server 127.0.0.1:1 max_fails=0; server 127.0.0.1:2; }\n"
        "  server { listen 127.0.0.1:9; location / { proxy_pass http://w; } }\n"
        "}\n");
    ric_upstream_t *ups = ric_upstream_init_all(conf, NULL);
    ric_upstream_t *w = &ups[0], *h = &ups[1], *one = &ups[2], *off = &ups[3];
    int counts[3] = { 0, 0, 0 }, seq[7], i;
    int64_t now = 1000000;

    UNIT_CASE("smooth weighted round robin: 5:1:1, spread out, not bunched");
    for (i = 0; i < 7; i++) {
        seq[i] = index_of(w, ric_upstream_pick(w, NULL, now));
        counts[seq[i]]++;
    }
    UNIT_CHECK_INT(counts[0], 5);
    UNIT_CHECK_INT(counts[1], 1);
    UNIT_CHECK_INT(counts[2], 1);
    /* nginx's sequence for weights 5,1,1: a a b a c a a */
    UNIT_CHECK_INT(seq[0], 0);
    UNIT_CHECK_INT(seq[1], 0);
    UNIT_CHECK_INT(seq[2], 1);
    UNIT_CHECK_INT(seq[3], 0);
    UNIT_CHECK_INT(seq[4], 2);
    UNIT_CHECK_INT(seq[5], 0);
    UNIT_CHECK_INT(seq[6], 0);

    UNIT_CASE("avoid: another server when one is up");
    for (i = 0; i < 20; i++) {
        UNIT_CHECK(ric_upstream_pick(w, &w->peers[0], now) != &w->peers[0]);
    }

    UNIT_CASE("max_fails failures within fail_timeout mark a server down");
    ric_upstream_report(h, &h->peers[0], 1, now);
    UNIT_CHECK_INT(h->peers[0].health->down_until, 0); /* one failure of two */
    ric_upstream_report(h, &h->peers[0], 1, now + 100);
    UNIT_CHECK_INT(h->peers[0].health->down_until, now + 100 + 10000);
    for (i = 0; i < 10; i++) {
        UNIT_CHECK(ric_upstream_pick(h, NULL, now + 200) == &h->peers[1]);
    }

    UNIT_CASE("after fail_timeout it is tried again");
    counts[0] = counts[1] = 0;
    for (i = 0; i < 10; i++) {
        counts[index_of(h, ric_upstream_pick(h, NULL, now + 100 + 10000))]++;
    }
    UNIT_CHECK_INT(counts[0], 5);
    UNIT_CHECK_INT(counts[1], 5);

    UNIT_CASE("back after fail_timeout, one failed trial takes it down again (nginx)");
    ric_upstream_report(h, &h->peers[0], 1, now + 10200);
    UNIT_CHECK_INT(h->peers[0].health->down_until, now + 10200 + 10000);
    UNIT_CASE("an answer starts the count over");
    ric_upstream_report(h, &h->peers[0], 0, now + 20300);
    UNIT_CHECK_INT(h->peers[0].health->fails, 0);
    ric_upstream_report(h, &h->peers[0], 1, now + 20400);
    UNIT_CHECK(h->peers[0].health->down_until <= now + 20400); /* one failure of two */

    UNIT_CASE("failures further apart than fail_timeout do not add up");
    ric_upstream_report(h, &h->peers[1], 1, now + 20000);
    ric_upstream_report(h, &h->peers[1], 1, now + 40000);
    UNIT_CHECK(h->peers[1].health->down_until <= now + 40000);

    UNIT_CASE("all down: the one that comes back first");
    ric_upstream_report(h, &h->peers[0], 1, now + 50000);
    ric_upstream_report(h, &h->peers[0], 1, now + 50000);
    ric_upstream_report(h, &h->peers[1], 1, now + 50001);
    ric_upstream_report(h, &h->peers[1], 1, now + 50001);
    UNIT_CHECK(ric_upstream_pick(h, NULL, now + 50002) == &h->peers[0]);

    UNIT_CASE("a single server is never marked down");
    for (i = 0; i < 5; i++) {
        ric_upstream_report(one, &one->peers[0], 1, now);
    }
    UNIT_CHECK_INT(one->peers[0].health->down_until, 0);
    UNIT_CHECK(ric_upstream_pick(one, NULL, now) == &one->peers[0]);

    UNIT_CASE("max_fails=0 turns the check off");
    for (i = 0; i < 5; i++) {
        ric_upstream_report(off, &off->peers[0], 1, now);
    }
    UNIT_CHECK_INT(off->peers[0].health->down_until, 0);

    ric_upstream_free_all(ups, conf->http->nupstreams);
    ric_conf_free(conf);
    return UNIT_DONE("upstream");
}
