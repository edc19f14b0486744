/* test_metrics.c: the counters' shards summed (across processes too), histograms and their quantiles, labels, and the status samples on an injected clock. */
#include "../../core/metrics.c"
#include "conf.h"
#include "shm.h"
#include "status.h"
#include "unit.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *CONF_OK =
    "http {\n"
    "  upstream api { server 127.0.0.1:9000; server 127.0.0.1:9001; }\n"
    "  server { listen 127.0.0.1:8080; server_name shop.example;\n"
    "    location / { proxy_pass http://api; }\n"
    "    location = /pay { proxy_pass http://api; } }\n"
    "  server { listen 127.0.0.1:8081; server_name shop.example; }\n"
    "  server { listen 127.0.0.1:8082; }\n"
    "}\n";

static void
test_histogram(void)
{
    ric_hist_t h;
    uint64_t n[RIC_HIST_BUCKETS] = { 0 };

    UNIT_CASE("an observation goes to the first bucket whose bound holds it");
    memset(&h, 0, sizeof(h));
    ric_hist_observe(&h, 1000);     /* <= 1 ms */
    ric_hist_observe(&h, 1001);     /* <= 2.5 ms */
    ric_hist_observe(&h, 20000000); /* past 10 s: +Inf */
    UNIT_CHECK_INT(h.n[0], 1);
    UNIT_CHECK_INT(h.n[1], 1);
    UNIT_CHECK_INT(h.n[RIC_HIST_BUCKETS - 1], 1);
    UNIT_CHECK_INT(h.sum_us, 1000 + 1001 + 20000000);

    UNIT_CASE("quantiles interpolate within a bucket, as histogram_quantile does");
    UNIT_CHECK_INT(ric_hist_quantile(n, 0.5), -1);
    n[4] = 100; /* 10..25 ms */
    UNIT_CHECK_INT(ric_hist_quantile(n, 0.5), 17500);
    UNIT_CHECK_INT(ric_hist_quantile(n, 0.99), 24850);
    n[0] = 100; /* and 100 in 0..1 ms: the median is the first bucket's top */
    UNIT_CHECK_INT(ric_hist_quantile(n, 0.5), 1000);
    memset(n, 0, sizeof(n));
    n[RIC_HIST_BUCKETS - 1] = 3;
    UNIT_CHECK_INT(ric_hist_quantile(n, 0.5), 10000000); /* +Inf: the highest bound */
}

static void
test_classes(void)
{
    UNIT_CASE("an attempt's class: statuses by kind, a TLS connect error apart");
    UNIT_CHECK_INT(ric_metrics_class(RIC_CLASS_STATUS, 200, 0), RIC_MC_OK);
    UNIT_CHECK_INT(ric_metrics_class(RIC_CLASS_STATUS, 304, 0), RIC_MC_OK);
    UNIT_CHECK_INT(ric_metrics_class(RIC_CLASS_STATUS, 404, 0), RIC_MC_4XX);
    UNIT_CHECK_INT(ric_metrics_class(RIC_CLASS_STATUS, 429, 0), RIC_MC_429);
    UNIT_CHECK_INT(ric_metrics_class(RIC_CLASS_STATUS, 503, 0), RIC_MC_5XX);
    UNIT_CHECK_INT(ric_metrics_class(RIC_CLASS_CONNECT_ERROR, 0, 0), RIC_MC_CONNECT_ERROR);
    UNIT_CHECK_INT(ric_metrics_class(RIC_CLASS_CONNECT_ERROR, 0, 1), RIC_MC_TLS_ERROR);
    UNIT_CHECK_INT(ric_metrics_class(RIC_CLASS_TIMEOUT, 0, 0), RIC_MC_TIMEOUT);
    UNIT_CHECK_STR(ric_metrics_class_name(RIC_MC_TLS_ERROR), "tls_error");
    UNIT_CHECK_STR(ric_metrics_refusal_name(RIC_MR_KILL_SWITCH), "kill_switch");
    UNIT_CHECK(ric_metrics_refusal_name(0) == NULL); /* "retry" refuses nothing */
}

static ric_location_conf_t *
location(ric_conf_t *conf, const char *path)
{
    ric_location_conf_t *l;

    for (l = conf->http->servers->locations; l; l = l->next) {
        if (strcmp(l->path, path) == 0) {
            return l;
        }
    }
    return NULL;
}

static void
test_share_and_sum(void)
{
    char err[256];
    ric_conf_t *conf = unit_conf_load(CONF_OK);
    ric_shm_t *zone = ric_shm_create(ric_metrics_zone_size(conf) * 2);
    ric_location_conf_t *root, *pay;
    ric_route_shard_t sum;
    pid_t pid;
    int st, i;

    UNIT_CASE("every server and location gets an entry and a label; a repeated name gets #N");
    UNIT_CHECK_INT(ric_metrics_share(conf, zone, err, sizeof(err)), RIC_OK);
    root = location(conf, "/");
    pay = location(conf, "/pay");
    UNIT_CHECK_STR(root->label, "shop.example /");
    UNIT_CHECK_STR(pay->label, "shop.example = /pay");
    UNIT_CHECK_STR(conf->http->servers->next->label, "shop.example#2");
    UNIT_CHECK_STR(conf->http->servers->next->next->label, "127.0.0.1:8082");
    UNIT_CHECK(root->metrics != NULL && root->metrics != pay->metrics);
    UNIT_CHECK(conf->http->upstreams->metrics != NULL);

    UNIT_CASE("two processes count into their own shards; a reader sums them exactly");
    pid = fork();
    if (pid == 0) {
        ric_metrics_worker_begin(1, 1);
        for (i = 0; i < 1000; i++) {
            ric_metrics_request(root->metrics, 200, 1500);
        }
        ric_metrics_attempt(root->metrics, conf->http->upstreams->metrics, RIC_MC_5XX, 800, -1, 0);
        _exit(0);
    }
    ric_metrics_worker_begin(0, 1);
    for (i = 0; i < 500; i++) {
        ric_metrics_request(root->metrics, 503, 30000);
    }
    ric_metrics_request(root->metrics, 999, 10); /* past 599: "other" */
    ric_metrics_attempt(root->metrics, conf->http->upstreams->metrics, RIC_MC_OK, 900, RIC_MC_5XX,
                        25000);
    waitpid(pid, &st, 0);
    ric_metrics_route_sum(root->metrics, &sum);
    UNIT_CHECK_INT(sum.requests[200], 1000);
    UNIT_CHECK_INT(sum.requests[503], 500);
    UNIT_CHECK_INT(sum.requests[0], 1);
    UNIT_CHECK_INT(sum.duration.n[1], 1000); /* 1.5 ms */
    UNIT_CHECK_INT(sum.duration.n[5], 500);  /* 30 ms */
    UNIT_CHECK_INT(sum.attempts[RIC_MC_5XX], 1);
    UNIT_CHECK_INT(sum.attempts[RIC_MC_OK], 1);
    UNIT_CHECK_INT(sum.retries[RIC_MC_5XX], 1);
    UNIT_CHECK_INT(sum.retry_wait.n[4], 1); /* 25 ms */
    ric_metrics_route_sum(pay->metrics, &sum);
    UNIT_CHECK_INT(sum.requests[200], 0);

    UNIT_CASE("a second generation naming the same route gets the same entry back");
    {
        ric_conf_t *next = unit_conf_load(CONF_OK);
        UNIT_CHECK_INT(ric_metrics_share(next, zone, err, sizeof(err)), RIC_OK);
        UNIT_CHECK(location(next, "/")->metrics == root->metrics);
        ric_conf_free(next);
    }
    ric_conf_free(conf);
    ric_shm_destroy(zone);
}

/* Whether the JSON text has "key":value right after the route's or upstream's name. */
static int
has(const ric_buf_t *b, const char *needle)
{
    return memmem(b->data, b->len, needle, strlen(needle)) != NULL;
}

static void
test_status_samples(void)
{
    char err[256];
    ric_conf_t *conf = unit_conf_load(CONF_OK);
    ric_shm_t *zone = ric_shm_create(ric_metrics_zone_size(conf) * 2);
    ric_location_conf_t *root;
    ric_buf_t b = { 0 };
    int64_t t0 = 1800000000000;
    int i, j;

    ric_metrics_share(conf, zone, err, sizeof(err));
    ric_metrics_worker_begin(0, 1);
    root = location(conf, "/");

    UNIT_CASE("no sample yet: declined");
    UNIT_CHECK_INT(ric_status_json(conf, -1, &b), RIC_DECLINED);

    UNIT_CASE("rates over the last ten seconds, success below 500, history a second each");
    ric_status_sample(conf, t0);
    for (i = 1; i <= 12; i++) {
        for (j = 0; j < 10; j++) {
            ric_metrics_request(root->metrics, j == 0 ? 502 : 200, 2000);
        }
        ric_status_sample(conf, t0 + i * 1000);
    }
    UNIT_CHECK_INT(ric_status_json(conf, -1, &b), RIC_OK);
    UNIT_CHECK(has(&b, "\"seq\":12,"));
    UNIT_CHECK(has(&b, "\"route\":\"shop.example /\",\"upstream\":\"api\",\"requests\":120,"));
    UNIT_CHECK(has(&b, "\"requests_per_sec\":10.00,\"retries_per_sec\":0.00,\"success_rate\":90.00,"));
    UNIT_CHECK(has(&b, "\"history\":{\"requests\":[10,10,10,10,10,10,10,10,10,10,10,10],"));
    UNIT_CHECK(has(&b, "\"errors\":[1,1,1,1,1,1,1,1,1,1,1,1]}"));
    UNIT_CHECK(has(&b, "{\"server\":\"127.0.0.1:9000\",\"up\":true}"));

    UNIT_CASE("an older sample is the same figures as then");
    b.len = 0;
    UNIT_CHECK_INT(ric_status_json(conf, 1, &b), RIC_OK);
    UNIT_CHECK(has(&b, "\"seq\":1,"));
    UNIT_CHECK(has(&b, "\"requests\":10,"));
    UNIT_CHECK(has(&b, "\"history\":{\"requests\":[10],"));

    UNIT_CASE("the ring keeps 300 samples: older ones and future ones are not there");
    for (i = 13; i < 320; i++) {
        ric_status_sample(conf, t0 + i * 1000);
    }
    b.len = 0;
    UNIT_CHECK_INT(ric_status_json(conf, 5, &b), RIC_ERROR);
    UNIT_CHECK_INT(ric_status_json(conf, 320, &b), RIC_ERROR);
    UNIT_CHECK_INT(ric_status_json(conf, 319, &b), RIC_OK);
    UNIT_CHECK(has(&b, "\"requests_per_sec\":0.00,"));
    UNIT_CHECK(has(&b, "\"success_rate\":null,"));
    ric_buf_free(&b);
    ric_conf_free(conf);
    ric_shm_destroy(zone);
}

int
main(void)
{
    test_histogram();
    test_classes();
    test_share_and_sum();
    test_status_samples();
    return UNIT_DONE("metrics");
}
