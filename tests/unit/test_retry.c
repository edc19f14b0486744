/* test_retry.c: the retry decision, one invariant of DESIGN §1 at a time, with injected randomness. */
#include "../../core/retry.c"
#include "unit.h"

static uint64_t fixed_value;

static uint64_t
fixed_rand(void *ctx)
{
    (void) ctx;
    return fixed_value;
}

static ric_retry_on_t default_on;

static ric_retry_policy_t
policy(void)
{
    ric_retry_policy_t p;

    memset(&p, 0, sizeof(p));
    p.enabled = 1;
    p.attempts = 5;
    p.backoff.initial_ms = 250;
    p.backoff.max_ms = 5000;
    p.backoff.factor = 2;
    p.backoff.jitter = RIC_JITTER_NONE;
    p.retry_after_max_ms = 30000;
    p.retry_on = &default_on;
    return p;
}

/* A GET that got a 503 on attempt 1, with plenty of time left. */
static ric_retry_input_t
input(void)
{
    ric_retry_input_t in;

    memset(&in, 0, sizeof(in));
    in.class = RIC_CLASS_STATUS;
    in.status = 503;
    in.attempt = 1;
    in.replay_safe = 1;
    in.body_replayable = 1;
    in.now_ms = 1000;
    in.deadline_ms = 31000;
    return in;
}

static ric_retry_decision_t
decide(const ric_retry_policy_t *p, const ric_retry_input_t *in, ric_budget_t *b)
{
    return ric_retry_decide(p, in, b, fixed_rand, NULL);
}

int
main(void)
{
    char *words[] = { "connect_error", "reset", "timeout", "502", "503", "504", "429" };
    char *bad[] = { "503", "teapot" };
    char *range[] = { "5xx" };
    ric_retry_policy_t p;
    ric_retry_input_t in;
    ric_retry_decision_t d;
    ric_retry_on_t on;
    ric_budget_t budget;
    ric_budget_conf_t bconf;
    ric_budget_state_t bstate;
    int64_t ms;
    int i;

    UNIT_CHECK(ric_retry_on_parse(&default_on, words, 7) == NULL);

    UNIT_CASE("a transient status on a safe request is retried after the backoff");
    p = policy();
    in = input();
    d = decide(&p, &in, NULL);
    UNIT_CHECK_INT(d.retry, 1);
    UNIT_CHECK_INT(d.wait_ms, 250);
    in.attempt = 3;
    UNIT_CHECK_INT(decide(&p, &in, NULL).wait_ms, 1000);

    UNIT_CASE("§1.1 an unsafe request is never repeated once it may have reached the upstream");
    in = input();
    in.replay_safe = 0;
    d = decide(&p, &in, NULL);
    UNIT_CHECK_INT(d.retry, 0);
    UNIT_CHECK_STR(ric_retry_reason_name(d.reason), "unsafe_method");
    in.class = RIC_CLASS_RESET;
    UNIT_CHECK_INT(decide(&p, &in, NULL).retry, 0);
    in.class = RIC_CLASS_TIMEOUT;
    UNIT_CHECK_INT(decide(&p, &in, NULL).retry, 0);
    in.class = RIC_CLASS_BAD_RESPONSE;
    p.retry_on = &on;
    UNIT_CHECK(ric_retry_on_parse(&on, (char *[]){ "bad_response" }, 1) == NULL);
    UNIT_CHECK_INT(decide(&p, &in, NULL).retry, 0);
    p = policy();

    UNIT_CASE("§1.1 ...unless it provably never reached it (connect_error)");
    in.class = RIC_CLASS_CONNECT_ERROR;
    UNIT_CHECK_INT(decide(&p, &in, NULL).retry, 1);

    UNIT_CASE("§1.2 a wait that would end at or past the deadline is not taken");
    in = input();
    in.deadline_ms = in.now_ms + 250; /* ends exactly at the deadline */
    d = decide(&p, &in, NULL);
    UNIT_CHECK_INT(d.retry, 0);
    UNIT_CHECK_STR(ric_retry_reason_name(d.reason), "deadline");
    in.deadline_ms = in.now_ms + 251;
    UNIT_CHECK_INT(decide(&p, &in, NULL).retry, 1);

    UNIT_CASE("§1.3 nothing is retried once the answer started");
    in = input();
    in.response_started = 1;
    d = decide(&p, &in, NULL);
    UNIT_CHECK_INT(d.retry, 0);
    UNIT_CHECK_STR(ric_retry_reason_name(d.reason), "response_started");
    in.class = RIC_CLASS_CONNECT_ERROR;
    UNIT_CHECK_INT(decide(&p, &in, NULL).retry, 0);

    UNIT_CASE("§1.5 a status not in retry_on is final");
    in = input();
    in.status = 500;
    d = decide(&p, &in, NULL);
    UNIT_CHECK_INT(d.retry, 0);
    UNIT_CHECK_STR(ric_retry_reason_name(d.reason), "final_status");
    in.status = 404;
    UNIT_CHECK_INT(decide(&p, &in, NULL).retry, 0);
    in.status = 429;
    UNIT_CHECK_INT(decide(&p, &in, NULL).retry, 1);

    UNIT_CASE("attempts: retry_attempts counts the first; 0 is bounded by time only");
    in = input();
    in.attempt = 4;
    UNIT_CHECK_INT(decide(&p, &in, NULL).retry, 1);
    in.attempt = 5;
    UNIT_CHECK_STR(ric_retry_reason_name(decide(&p, &in, NULL).reason), "attempts_exhausted");
    p.attempts = 1;
    in.attempt = 1;
    UNIT_CHECK_INT(decide(&p, &in, NULL).retry, 0);
    p.attempts = 0;
    in.attempt = 1000;
    in.deadline_ms = in.now_ms + 1000000;
    UNIT_CHECK_INT(decide(&p, &in, NULL).retry, 1);
    p = policy();

    UNIT_CASE("a body not held for replay is sent once");
    in = input();
    in.body_replayable = 0;
    UNIT_CHECK_STR(ric_retry_reason_name(decide(&p, &in, NULL).reason), "body_not_replayable");

    UNIT_CASE("kill switches");
    in = input();
    p.enabled = 0;
    UNIT_CHECK_STR(ric_retry_reason_name(decide(&p, &in, NULL).reason), "retries_off");
    p.enabled = 1;
    ric_retry_killed = 1;
    UNIT_CHECK_STR(ric_retry_reason_name(decide(&p, &in, NULL).reason), "retries_off");
    ric_retry_killed = 0;

    UNIT_CASE("an unsafe request keyed by its script on a route without the key contract says so");
    in = input();
    in.replay_safe = 0;
    in.key_no_contract = 1;
    UNIT_CHECK_STR(ric_retry_reason_name(decide(&p, &in, NULL).reason), "key_without_contract");
    in.key_no_contract = 0;
    UNIT_CHECK_STR(ric_retry_reason_name(decide(&p, &in, NULL).reason), "unsafe_method");

    UNIT_CASE("a final answer is final whatever the kill switch says (what the store keeps)");
    in = input();
    in.status = 200;
    p.enabled = 0;
    UNIT_CHECK_STR(ric_retry_reason_name(decide(&p, &in, NULL).reason), "final_status");
    ric_retry_killed = 1;
    p.enabled = 1;
    UNIT_CHECK_STR(ric_retry_reason_name(decide(&p, &in, NULL).reason), "final_status");
    ric_retry_killed = 0;
    UNIT_CHECK(ric_retry_final(&default_on, RIC_CLASS_STATUS, 200, RIC_CLASSIFY_DEFAULT));
    UNIT_CHECK(!ric_retry_final(&default_on, RIC_CLASS_STATUS, 503, RIC_CLASSIFY_DEFAULT));
    UNIT_CHECK(!ric_retry_final(&default_on, RIC_CLASS_STATUS, 200, RIC_CLASSIFY_RETRY));
    UNIT_CHECK(ric_retry_final(&default_on, RIC_CLASS_STATUS, 503, RIC_CLASSIFY_FINAL));
    UNIT_CHECK(!ric_retry_final(&default_on, RIC_CLASS_RESET, 0, RIC_CLASSIFY_DEFAULT));

    UNIT_CASE("Retry-After up to retry_after_max is the wait; longer falls back to backoff");
    in = input();
    in.has_retry_after = 1;
    in.retry_after_ms = 1000;
    UNIT_CHECK_INT(decide(&p, &in, NULL).wait_ms, 1000);
    in.retry_after_ms = 0;
    UNIT_CHECK_INT(decide(&p, &in, NULL).wait_ms, 0);
    in.retry_after_ms = 30001;
    UNIT_CHECK_INT(decide(&p, &in, NULL).wait_ms, 250);
    in.retry_after_ms = 20000;
    in.deadline_ms = in.now_ms + 10000; /* honoured, but never past the deadline */
    UNIT_CHECK_STR(ric_retry_reason_name(decide(&p, &in, NULL).reason), "deadline");

    UNIT_CASE("full jitter draws from [0, w) through the injected source");
    p.backoff.jitter = RIC_JITTER_FULL;
    in = input();
    in.attempt = 2; /* w = 500 */
    fixed_value = 0;
    UNIT_CHECK_INT(decide(&p, &in, NULL).wait_ms, 0);
    fixed_value = 499;
    UNIT_CHECK_INT(decide(&p, &in, NULL).wait_ms, 499);
    fixed_value = 500;
    UNIT_CHECK_INT(decide(&p, &in, NULL).wait_ms, 0);
    p = policy();

    UNIT_CASE("the budget is asked last, only for retries, and only read");
    ric_budget_conf_default(&bconf);
    bconf.wait_ms = 0;
    budget.conf = &bconf;
    budget.st = &bstate;
    ric_budget_reset(&bstate, &bconf);
    while (ric_budget_take(&budget, RIC_BUDGET_COST, 1000, 1, NULL) == RIC_BUDGET_GRANTED) {
    }
    in = input();
    UNIT_CHECK_STR(ric_retry_reason_name(decide(&p, &in, &budget).reason), "budget");
    UNIT_CHECK_INT(bstate.refused, 2);
    in.status = 404;
    UNIT_CHECK_STR(ric_retry_reason_name(decide(&p, &in, &budget).reason), "final_status");
    UNIT_CHECK_INT(bstate.refused, 2);
    ric_budget_reset(&bstate, &bconf);
    in = input();
    for (i = 0; i < 20; i++) {
        UNIT_CHECK_INT(decide(&p, &in, &budget).retry, 1);
    }
    UNIT_CHECK_INT(ric_budget_tokens(&budget), RIC_BUDGET_START); /* deciding pays nothing */

    UNIT_CASE("a budget that may wait does not refuse");
    bconf.wait_ms = 5000;
    ric_budget_reset(&bstate, &bconf);
    for (i = 0; i < 100; i++) {
        ric_budget_outcome(&budget, 0, 0, 1000); /* healthy: the bucket fills */
    }
    while (ric_budget_take(&budget, RIC_BUDGET_COST, 1000, 1, NULL) == RIC_BUDGET_GRANTED) {
    }
    UNIT_CHECK_INT(decide(&p, &in, &budget).retry, 1);

    UNIT_CASE("a timeout's retry costs double");
    UNIT_CHECK_INT(ric_retry_cost(RIC_CLASS_TIMEOUT), 2 * ric_retry_cost(RIC_CLASS_STATUS));
    UNIT_CHECK_INT(ric_retry_cost(RIC_CLASS_RESET), RIC_BUDGET_COST);

    UNIT_CASE("retry_on parsing");
    UNIT_CHECK(ric_retry_on_parse(&on, bad, 2) == bad[1]);
    UNIT_CHECK(ric_retry_on_parse(&on, range, 1) == NULL);
    UNIT_CHECK(ric_retry_on_match(&on, RIC_CLASS_STATUS, 500));
    UNIT_CHECK(ric_retry_on_match(&on, RIC_CLASS_STATUS, 599));
    UNIT_CHECK(!ric_retry_on_match(&on, RIC_CLASS_STATUS, 499));
    UNIT_CHECK(!ric_retry_on_match(&on, RIC_CLASS_RESET, 0));
    UNIT_CHECK(ric_retry_on_parse(&on, (char *[]){ "600" }, 1) != NULL);
    UNIT_CHECK(ric_retry_on_parse(&on, (char *[]){ "50" }, 1) != NULL);
    UNIT_CHECK(ric_retry_on_parse(&on, (char *[]){ "+503" }, 1) != NULL);

    UNIT_CASE("idempotent methods (RFC 9110 §9.2.2)");
    UNIT_CHECK(ric_retry_method_idempotent(RIC_HTTP_GET));
    UNIT_CHECK(ric_retry_method_idempotent(RIC_HTTP_PUT));
    UNIT_CHECK(ric_retry_method_idempotent(RIC_HTTP_DELETE));
    UNIT_CHECK(!ric_retry_method_idempotent(RIC_HTTP_POST));
    UNIT_CHECK(!ric_retry_method_idempotent(RIC_HTTP_PATCH));
    UNIT_CHECK(!ric_retry_method_idempotent(RIC_HTTP_METHOD_OTHER));

    UNIT_CASE("replay safety: each rule");
    {
        static const struct {
            const char *rule;
            int method, script_idempotent, script_key, client_key, key_mode;
            int safe, mint_key, key_no_contract;
        } rules[] = {
            { "a GET by its method", RIC_HTTP_GET, 0, 0, 0, RIC_IDEMPOTENCY_OFF, 1, 0, 0 },
            { "a PUT by its method", RIC_HTTP_PUT, 0, 0, 0, RIC_IDEMPOTENCY_OFF, 1, 0, 0 },
            { "a DELETE by its method", RIC_HTTP_DELETE, 0, 0, 0, RIC_IDEMPOTENCY_OFF, 1, 0, 0 },
            { "a POST is not", RIC_HTTP_POST, 0, 0, 0, RIC_IDEMPOTENCY_OFF, 0, 0, 0 },
            { "a PATCH is not", RIC_HTTP_PATCH, 0, 0, 0, RIC_IDEMPOTENCY_ON, 0, 0, 0 },
            { "a script's true makes a POST safe", RIC_HTTP_POST, 1, 0, 0, RIC_IDEMPOTENCY_OFF,
              1, 0, 0 },
            { "a script's false makes a GET unsafe", RIC_HTTP_GET, -1, 0, 0, RIC_IDEMPOTENCY_OFF,
              0, 0, 0 },
            { "a script's false beats a client key", RIC_HTTP_POST, -1, 0, 1, RIC_IDEMPOTENCY_ON,
              0, 0, 0 },
            { "a script's false beats auto", RIC_HTTP_GET, -1, 0, 0, RIC_IDEMPOTENCY_AUTO, 0, 0, 0 },
            { "a script's false beats its own key", RIC_HTTP_POST, -1, 1, 0, RIC_IDEMPOTENCY_ON,
              0, 0, 0 },
            { "a client key under the contract", RIC_HTTP_POST, 0, 0, 1, RIC_IDEMPOTENCY_ON,
              1, 0, 0 },
            { "a client key without the contract", RIC_HTTP_POST, 0, 0, 1, RIC_IDEMPOTENCY_OFF,
              0, 0, 0 },
            { "no client key (none, empty, repeated or removed)", RIC_HTTP_POST, 0, 0, 0,
              RIC_IDEMPOTENCY_ON, 0, 0, 0 },
            { "a script key under the contract", RIC_HTTP_POST, 0, 1, 0, RIC_IDEMPOTENCY_ON,
              1, 0, 0 },
            { "a script key without the contract says so", RIC_HTTP_POST, 0, 1, 0,
              RIC_IDEMPOTENCY_OFF, 0, 0, 1 },
            { "a script key and its true, no contract", RIC_HTTP_POST, 1, 1, 0, RIC_IDEMPOTENCY_OFF,
              1, 0, 0 },
            { "a script key and its false, no contract", RIC_HTTP_POST, -1, 1, 0,
              RIC_IDEMPOTENCY_OFF, 0, 0, 0 },
            { "a script key on a safe method, no contract", RIC_HTTP_GET, 0, 1, 0,
              RIC_IDEMPOTENCY_OFF, 1, 0, 0 },
            { "auto makes a key for a POST without one", RIC_HTTP_POST, 0, 0, 0,
              RIC_IDEMPOTENCY_AUTO, 1, 1, 0 },
            { "auto keeps the client's key", RIC_HTTP_POST, 0, 0, 1, RIC_IDEMPOTENCY_AUTO, 1, 0, 0 },
            { "auto keeps the script's key", RIC_HTTP_PATCH, 0, 1, 0, RIC_IDEMPOTENCY_AUTO,
              1, 0, 0 },
            { "auto makes none for a GET", RIC_HTTP_GET, 0, 0, 0, RIC_IDEMPOTENCY_AUTO, 1, 0, 0 },
            { "auto makes none when the script said true", RIC_HTTP_POST, 1, 0, 0,
              RIC_IDEMPOTENCY_AUTO, 1, 0, 0 },
        };
        ric_replay_input_t rin;
        ric_replay_t rout;
        size_t k;

        for (k = 0; k < sizeof(rules) / sizeof(rules[0]); k++) {
            UNIT_CASE(rules[k].rule);
            rin.method = rules[k].method;
            rin.script_idempotent = rules[k].script_idempotent;
            rin.script_key = rules[k].script_key;
            rin.client_key = rules[k].client_key;
            rin.key_mode = rules[k].key_mode;
            rout = ric_retry_replay(&rin);
            UNIT_CHECK_INT(rout.safe, rules[k].safe);
            UNIT_CHECK_INT(rout.mint_key, rules[k].mint_key);
            UNIT_CHECK_INT(rout.key_no_contract, rules[k].key_no_contract);
            /* the store dedupes what is not repeatable with no key at all */
            UNIT_CHECK_INT(ric_retry_repeatable(rin.method, rin.script_idempotent),
                           rin.script_idempotent != 0 ? rin.script_idempotent > 0
                           : ric_retry_method_idempotent(rin.method));
        }
    }

    UNIT_CASE("client deadlines: ms or a duration");
#define DL(s) ric_retry_parse_deadline((const u_char *) (s), sizeof(s) - 1, &ms)
    UNIT_CHECK(DL("1500") == RIC_OK && ms == 1500);
    UNIT_CHECK(DL("1.5s") == RIC_OK && ms == 1500);
    UNIT_CHECK(DL("250ms") == RIC_OK && ms == 250);
    UNIT_CHECK(DL("2m") == RIC_OK && ms == 120000);
    UNIT_CHECK(DL(" 0 ") == RIC_OK && ms == 0);
    UNIT_CHECK(DL("0.25s") == RIC_OK && ms == 250);
    UNIT_CHECK(DL("") == RIC_ERROR);
    UNIT_CHECK(DL("-1") == RIC_ERROR);
    UNIT_CHECK(DL("1.5") == RIC_ERROR);
    UNIT_CHECK(DL("1h") == RIC_ERROR);
    UNIT_CHECK(DL("abc") == RIC_ERROR);
    UNIT_CHECK(DL("1.s") == RIC_ERROR);
    UNIT_CHECK(DL("99999999999999999999") == RIC_ERROR);
    UNIT_CASE("adaptive backoff: while retries work the retry goes at once, in the fast regime");
    p = policy();
    p.adaptive = 1;
    in = input();
    in.backoff_share = 0;
    d = decide(&p, &in, NULL);
    UNIT_CHECK_INT(d.retry, 1);
    UNIT_CHECK_INT(d.wait_ms, 0);
    UNIT_CHECK_STR(ric_retry_regime_name(d.regime), "fast");

    UNIT_CASE("adaptive backoff: in between, a share of the schedule's draw; all of it when slow");
    in.backoff_share = 500;
    in.attempt = 3; /* the schedule's 1000 ms */
    d = decide(&p, &in, NULL);
    UNIT_CHECK_INT(d.wait_ms, 500);
    UNIT_CHECK_STR(ric_retry_regime_name(d.regime), "scaled");
    in.backoff_share = 1000;
    d = decide(&p, &in, NULL);
    UNIT_CHECK_INT(d.wait_ms, 1000);
    UNIT_CHECK_STR(ric_retry_regime_name(d.regime), "backoff");

    UNIT_CASE("adaptive backoff: the jittered draw is scaled, so the spread stays");
    p.backoff.jitter = RIC_JITTER_FULL;
    fixed_value = 777;
    in.backoff_share = 250;
    UNIT_CHECK_INT(decide(&p, &in, NULL).wait_ms, 777 / 4); /* 777 of a 1000 ms window, a quarter */
    fixed_value = 0;
    p.backoff.jitter = RIC_JITTER_NONE;

    UNIT_CASE("adaptive backoff: a 429, and a Retry-After too long to honour, wait the schedule");
    in = input();
    in.backoff_share = 0;
    in.status = 429;
    d = decide(&p, &in, NULL);
    UNIT_CHECK_INT(d.wait_ms, 250);
    UNIT_CHECK_STR(ric_retry_regime_name(d.regime), "backoff");
    in.status = 503;
    in.has_retry_after = 1;
    in.retry_after_ms = 120000; /* above retry_after_max */
    d = decide(&p, &in, NULL);
    UNIT_CHECK_INT(d.wait_ms, 250);
    UNIT_CHECK_STR(ric_retry_regime_name(d.regime), "backoff");

    UNIT_CASE("adaptive backoff: a Retry-After and a script's delay are honoured as they are");
    in = input();
    in.backoff_share = 0;
    in.has_retry_after = 1;
    in.retry_after_ms = 2000;
    d = decide(&p, &in, NULL);
    UNIT_CHECK_INT(d.wait_ms, 2000);
    UNIT_CHECK_STR(ric_retry_regime_name(d.regime), "retry_after");
    in.has_retry_after = 0;
    in.classified = RIC_CLASSIFY_RETRY;
    in.has_script_delay = 1;
    in.script_delay_ms = 300;
    d = decide(&p, &in, NULL);
    UNIT_CHECK_INT(d.wait_ms, 300);
    UNIT_CHECK_STR(ric_retry_regime_name(d.regime), "script");

    UNIT_CASE("adaptive backoff: the deadline, the attempts cap and replay safety still apply");
    in = input();
    in.backoff_share = 0;
    in.deadline_ms = in.now_ms; /* no time left even for a wait of 0 */
    UNIT_CHECK_STR(ric_retry_reason_name(decide(&p, &in, NULL).reason), "deadline");
    in = input();
    in.backoff_share = 0;
    in.attempt = 5;
    UNIT_CHECK_STR(ric_retry_reason_name(decide(&p, &in, NULL).reason), "attempts_exhausted");
    in = input();
    in.backoff_share = 0;
    in.replay_safe = 0;
    UNIT_CHECK_STR(ric_retry_reason_name(decide(&p, &in, NULL).reason), "unsafe_method");

    UNIT_CASE("adaptive=off: the schedule whatever the share");
    p.adaptive = 0;
    in = input();
    in.backoff_share = 0;
    d = decide(&p, &in, NULL);
    UNIT_CHECK_INT(d.wait_ms, 250);
    UNIT_CHECK_STR(ric_retry_regime_name(d.regime), "backoff");

    return UNIT_DONE("retry");
}
