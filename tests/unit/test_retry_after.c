/* test_retry_after.c: Retry-After delay-seconds and the three HTTP-date forms, strictly. */
#include "../../core/retry_after.c"
#include "unit.h"

#include <time.h>

#define NOW_1994 784111777LL  /* Sun, 06 Nov 1994 08:49:37 GMT */
#define NOW_2026 1781481600LL /* Mon, 15 Jun 2026 00:00:00 GMT */
#define NOW_2099 4085164800LL /* Mon, 15 Jun 2099 00:00:00 GMT */
#define BAD -1LL              /* the case must be refused */

typedef struct {
    const char *value;
    int64_t now;
    int64_t want_ms; /* BAD: RIC_ERROR expected */
} case_t;

static const case_t good[] = {
    /* delay-seconds */
    { "120", NOW_1994, 120000 },
    { "0", NOW_1994, 0 },
    { "1", NOW_1994, 1000 },
    { "000120", NOW_1994, 120000 },
    { " 120", NOW_1994, 120000 },
    { "120 \t ", NOW_1994, 120000 },
    { "\t120\t", NOW_1994, 120000 },
    { "1000000000000", NOW_1994, 1000000000000000LL },
    { "9223372036854775", NOW_1994, 9223372036854775000LL }, /* INT64_MAX / 1000 */

    /* RFC 9110's three examples, at that very second */
    { "Sun, 06 Nov 1994 08:49:37 GMT", NOW_1994, 0 },
    { "Sunday, 06-Nov-94 08:49:37 GMT", NOW_1994, 0 },
    { "Sun Nov  6 08:49:37 1994", NOW_1994, 0 },
    /* ... an hour later */
    { "Sun, 06 Nov 1994 09:49:37 GMT", NOW_1994, 3600000 },
    { "Sunday, 06-Nov-94 09:49:37 GMT", NOW_1994, 3600000 },
    { "Sun Nov  6 09:49:37 1994", NOW_1994, 3600000 },
    { "Sun Nov 06 09:49:37 1994", NOW_1994, 3600000 }, /* date3's 2DIGIT form */
    { "  Sun, 06 Nov 1994 09:49:37 GMT\t", NOW_1994, 3600000 },
    /* a second later; across a month; across a year */
    { "Sun, 06 Nov 1994 08:49:38 GMT", NOW_1994, 1000 },
    { "Thu, 01 Dec 1994 00:00:00 GMT", NOW_1994, (786240000LL - NOW_1994) * 1000 },
    { "Thu Dec  1 00:00:00 1994", NOW_1994, (786240000LL - NOW_1994) * 1000 },
    { "Thursday, 01-Dec-94 00:00:00 GMT", NOW_1994, (786240000LL - NOW_1994) * 1000 },
    { "Sun, 01 Jan 1995 00:00:00 GMT", NOW_1994, (788918400LL - NOW_1994) * 1000 },
    /* in the past: no wait */
    { "Sun, 06 Nov 1994 08:49:36 GMT", NOW_1994, 0 },
    { "Sat, 05 Nov 1994 08:49:37 GMT", NOW_1994, 0 },
    { "Thu, 01 Jan 1970 00:00:00 GMT", NOW_1994, 0 },
    { "Mon, 01 Jan 0001 00:00:00 GMT", NOW_1994, 0 },
    { "Sun, 06 Nov 1994 09:49:37 GMT", NOW_2026, 0 },
    /* the weekday must be a name, not the right one */
    { "Mon, 06 Nov 1994 09:49:37 GMT", NOW_1994, 3600000 },
    { "Friday, 06-Nov-94 09:49:37 GMT", NOW_1994, 3600000 },
    /* leap days and the leap second (read as :59) */
    { "Thu, 29 Feb 2024 00:00:00 GMT", NOW_1994, (1709164800LL - NOW_1994) * 1000 },
    { "Tue, 29 Feb 2000 00:00:00 GMT", NOW_1994, (951782400LL - NOW_1994) * 1000 },
    { "Sat, 31 Dec 1994 23:59:60 GMT", NOW_1994, (788918399LL - NOW_1994) * 1000 },
    { "Sat Dec 31 23:59:60 1994", NOW_1994, (788918399LL - NOW_1994) * 1000 },
    { "Fri, 31 Dec 9999 23:59:59 GMT", NOW_1994, (253402300799LL - NOW_1994) * 1000 },

    /* RFC 850 two-digit years: within 50 years ahead, else the past century */
    { "Sunday, 06-Nov-94 08:49:37 GMT", NOW_2026, 0 },                  /* 1994, not 2094 */
    { "Tuesday, 01-Jan-30 00:00:00 GMT", NOW_2026, (1893456000LL - NOW_2026) * 1000 },
    { "Wednesday, 01-Jan-76 00:00:00 GMT", NOW_2026, (3345062400LL - NOW_2026) * 1000 },
    { "Saturday, 01-Jan-77 00:00:00 GMT", NOW_2026, 0 },                /* 1977 */
    { "Saturday, 01-Jan-00 00:00:00 GMT", NOW_2026, 0 },                /* 2000 */
    { "Sunday, 06-Nov-44 08:49:37 GMT", NOW_1994, (2362034977LL - NOW_1994) * 1000 },
    { "Sunday, 06-Nov-45 08:49:37 GMT", NOW_1994, 0 },                  /* 1945 */
    { "Friday, 01-Jan-00 00:00:00 GMT", NOW_2099, (4102444800LL - NOW_2099) * 1000 }, /* 2100 */
    { "Friday, 01-Jan-99 00:00:00 GMT", NOW_2099, 0 },                  /* 2099 */
};

static const char *const bad[] = {
    "", " ", "\t \t", "-1", "+5", "1.5", "5s", "0x10", "12 34", "1,2", "120abc", "abc",
    "99999999999999999999999",
    "9223372036854776", /* one more than INT64_MAX / 1000 seconds */
    "18446744073709551616",
    "Sun, 06 Nov 1994 08:49:37 UTC",
    "Sun, 06 Nov 1994 08:49:37 gmt",
    "Sun, 06 Nov 1994 08:49:37",
    "Sun, 6 Nov 1994 08:49:37 GMT",
    "Sun, 06 nov 1994 08:49:37 GMT",
    "Sun, 06 NOV 1994 08:49:37 GMT",
    "sun, 06 Nov 1994 08:49:37 GMT",
    "SUN, 06 Nov 1994 08:49:37 GMT",
    "Sunday, 06 Nov 1994 08:49:37 GMT", /* long day name in IMF-fixdate */
    "Sun, 06-Nov-94 08:49:37 GMT",      /* short day name in rfc850-date */
    "Sund, 06 Nov 1994 08:49:37 GMT",
    "Xyz, 06 Nov 1994 08:49:37 GMT",
    "Sun, 06 Nov 94 08:49:37 GMT",
    "Sun, 06 Nov 19940 08:49:37 GMT",
    "Sun, 06 Novem 1994 08:49:37 GMT",
    "Sun, 31 Nov 1994 08:49:37 GMT",
    "Sun, 00 Nov 1994 08:49:37 GMT",
    "Sun, 32 Jan 1994 08:49:37 GMT",
    "Sun, 30 Feb 2024 08:49:37 GMT",
    "Wed, 29 Feb 2023 00:00:00 GMT",
    "Thu, 29 Feb 1900 00:00:00 GMT",
    "Mon, 29 Feb 2100 00:00:00 GMT",
    "Wednesday, 29-Feb-23 00:00:00 GMT",
    "Wed Feb 29 00:00:00 2023",
    "Sun, 06 Nov 1994 24:00:00 GMT",
    "Sun, 06 Nov 1994 23:60:00 GMT",
    "Sun, 06 Nov 1994 08:49:60 GMT", /* 60 only as 23:59:60 */
    "Sun, 06 Nov 1994 08:49:61 GMT",
    "Sun, 06 Nov 1994 8:49:37 GMT",
    "Sun, 06 Nov 1994 08:49 GMT",
    "Sun, 06 Nov 1994 08-49-37 GMT",
    "Sun 06 Nov 1994 08:49:37 GMT",
    "Sun,06 Nov 1994 08:49:37 GMT",
    "Sun,  06 Nov 1994 08:49:37 GMT",
    "Sun, 06  Nov 1994 08:49:37 GMT",
    "Sun, 06 Nov 1994 08:49:37  GMT",
    "Sun, 06 Nov 1994 08:49:37 GMT x",
    "Sun, 06 Nov 1994 08:49:37 GMT,",
    "Sun, 06 Nov 1994 08:49:37 GMT\r\n",
    "\r\nSun, 06 Nov 1994 08:49:37 GMT",
    "x Sun, 06 Nov 1994 08:49:37 GMT",
    "Sunday, 06-Nov-1994 08:49:37 GMT",
    "Sunday, 6-Nov-94 08:49:37 GMT",
    "Sunday, 06-nov-94 08:49:37 GMT",
    "Sunday, 06-Nov-94 08:49:37 UTC",
    "Sunday, 06-Nov-94 08:49:37",
    "Sunday 06-Nov-94 08:49:37 GMT",
    "Sun Nov 6 08:49:37 1994",
    "Sun Nov   6 08:49:37 1994",
    "Sun Nov  6 08:49:37 94",
    "Sun Nov  6 08:49:37 1994 GMT",
    "Sun, Nov  6 08:49:37 1994",
    "Sunday Nov  6 08:49:37 1994",
    "Sun Nov 31 08:49:37 1994",
    "Sun Nov  0 08:49:37 1994",
    "Sun Nov  6 24:49:37 1994",
};

static void
test_good(void)
{
    size_t i;
    int64_t ms;

    UNIT_CASE("valid values");
    for (i = 0; i < ric_nelems(good); i++) {
        const case_t *c = &good[i];
        int rc;

        ms = -12345;
        rc = ric_retry_after_parse((const u_char *) c->value, strlen(c->value), (time_t) c->now,
                                   &ms);
        if (rc != RIC_OK || ms != c->want_ms) {
            fprintf(stderr, "  case \"%s\" at %lld: rc %d, %lld ms, want %lld ms\n", c->value,
                    (long long) c->now, rc, (long long) ms, (long long) c->want_ms);
        }
        UNIT_CHECK_INT(rc, RIC_OK);
        UNIT_CHECK_INT(ms, c->want_ms);
    }
}

static void
test_bad(void)
{
    static const u_char nul[] = "12\0003";
    static const u_char nul_date[] = "Sun, 06 Nov 1994 08:49:37 GMT\0";
    char big[4096 + 64];
    size_t i;
    int64_t ms = -12345;

    UNIT_CASE("invalid values are refused and *delay_ms is untouched");
    for (i = 0; i < ric_nelems(bad); i++) {
        int rc = ric_retry_after_parse((const u_char *) bad[i], strlen(bad[i]),
                                       (time_t) NOW_1994, &ms);
        if (rc != RIC_ERROR) {
            fprintf(stderr, "  case \"%s\" accepted: %lld ms\n", bad[i], (long long) ms);
        }
        UNIT_CHECK_INT(rc, RIC_ERROR);
    }
    UNIT_CHECK_INT(ms, -12345);

    UNIT_CASE("NUL bytes, NULL, and a length that stops early");
    UNIT_CHECK_INT(ric_retry_after_parse(nul, sizeof(nul) - 1, NOW_1994, &ms), RIC_ERROR);
    UNIT_CHECK_INT(ric_retry_after_parse(nul_date, sizeof(nul_date) - 1, NOW_1994, &ms),
                   RIC_ERROR);
    UNIT_CHECK_INT(ric_retry_after_parse(NULL, 0, NOW_1994, &ms), RIC_ERROR);
    UNIT_CHECK_INT(ric_retry_after_parse((const u_char *) "1205", 3, NOW_1994, &ms), RIC_OK);
    UNIT_CHECK_INT(ms, 120000);
    UNIT_CHECK_INT(ric_retry_after_parse((const u_char *) "Sun, 06 Nov 1994 08:49:37 GMT", 28,
                                         NOW_1994, &ms),
                   RIC_ERROR);

    UNIT_CASE("overlong inputs");
    memset(big, '1', 4096);
    UNIT_CHECK_INT(ric_retry_after_parse((u_char *) big, 4096, NOW_1994, &ms), RIC_ERROR);
    memset(big, 'A', 4096);
    UNIT_CHECK_INT(ric_retry_after_parse((u_char *) big, 4096, NOW_1994, &ms), RIC_ERROR);
    memcpy(big, "Sun, 06 Nov 1994 09:49:37 GMT", 29);
    memset(big + 29, ' ', 4096 - 30);
    big[4095] = 'x';
    UNIT_CHECK_INT(ric_retry_after_parse((u_char *) big, 4096, NOW_1994, &ms), RIC_ERROR);
    memset(big, '0', 4096 - 3);
    memcpy(big + 4096 - 3, "120", 3);
    UNIT_CHECK_INT(ric_retry_after_parse((u_char *) big, 4096, NOW_1994, &ms), RIC_OK);
    UNIT_CHECK_INT(ms, 120000); /* 1*DIGIT: leading zeros are grammar, not overflow */

    UNIT_CASE("OWS of any length is still only OWS");
    memset(big, ' ', 2000);
    memcpy(big + 2000, "120", 3);
    memset(big + 2003, '\t', 2000);
    UNIT_CHECK_INT(ric_retry_after_parse((u_char *) big, 4003, NOW_1994, &ms), RIC_OK);
    UNIT_CHECK_INT(ms, 120000);
}

static void
test_extreme_now(void)
{
    static const char date[] = "Sun, 06 Nov 1994 09:49:37 GMT";
    static const char rfc850[] = "Sunday, 06-Nov-94 09:49:37 GMT";
    int64_t ms = -12345;

    UNIT_CASE("an absurd now never overflows");
    UNIT_CHECK_INT(ric_retry_after_parse((const u_char *) date, sizeof(date) - 1,
                                         (time_t) INT64_MAX, &ms),
                   RIC_OK);
    UNIT_CHECK_INT(ms, 0);
    UNIT_CHECK_INT(ric_retry_after_parse((const u_char *) date, sizeof(date) - 1,
                                         (time_t) INT64_MIN, &ms),
                   RIC_ERROR);
    UNIT_CHECK_INT(ric_retry_after_parse((const u_char *) rfc850, sizeof(rfc850) - 1,
                                         (time_t) INT64_MAX, &ms),
                   RIC_ERROR);
    UNIT_CHECK_INT(ric_retry_after_parse((const u_char *) rfc850, sizeof(rfc850) - 1,
                                         (time_t) INT64_MIN, &ms),
                   RIC_ERROR);
}

static void
test_http_date(void)
{
    static const struct {
        int64_t t;
        const char *s;
    } dates[] = {
        { 0, "Thu, 01 Jan 1970 00:00:00 GMT" },
        { 784111777, "Sun, 06 Nov 1994 08:49:37 GMT" },
        { 951782400, "Tue, 29 Feb 2000 00:00:00 GMT" },
        { 1709164800, "Thu, 29 Feb 2024 00:00:00 GMT" },
        { 2147483647, "Tue, 19 Jan 2038 03:14:07 GMT" },
        { 2147483648LL, "Tue, 19 Jan 2038 03:14:08 GMT" },
        { 4102444800LL, "Fri, 01 Jan 2100 00:00:00 GMT" },
        { -1, "Wed, 31 Dec 1969 23:59:59 GMT" },
        { 253402300799LL, "Fri, 31 Dec 9999 23:59:59 GMT" },
    };
    char buf[30], want[64];
    size_t i;
    int64_t ms, t, mismatches = 0, failures = 0;
    struct tm tm;
    time_t tt;

    UNIT_CASE("ric_http_date: known times, and back through the parser");
    for (i = 0; i < ric_nelems(dates); i++) {
        UNIT_CHECK_STR(ric_http_date((time_t) dates[i].t, buf, sizeof(buf)), dates[i].s);
        UNIT_CHECK_INT(strlen(buf), 29);
        ms = -1;
        UNIT_CHECK_INT(ric_retry_after_parse((u_char *) buf, strlen(buf),
                                             (time_t) (dates[i].t - 5), &ms),
                       RIC_OK);
        UNIT_CHECK_INT(ms, 5000);
        UNIT_CHECK_INT(ric_retry_after_parse((u_char *) buf, strlen(buf), (time_t) dates[i].t,
                                             &ms),
                       RIC_OK);
        UNIT_CHECK_INT(ms, 0);
    }

    UNIT_CASE("ric_http_date: clamped to years 0000..9999");
    UNIT_CHECK_STR(ric_http_date((time_t) INT64_MAX, buf, sizeof(buf)),
                   "Fri, 31 Dec 9999 23:59:59 GMT");
    UNIT_CHECK_STR(ric_http_date((time_t) INT64_MIN, buf, sizeof(buf)),
                   "Sat, 01 Jan 0000 00:00:00 GMT");

    UNIT_CASE("ric_http_date: a short buffer is truncated, not overrun");
    UNIT_CHECK_STR(ric_http_date(0, buf, 4), "Thu");

    /* Cross-check against gmtime_r and both other forms over 1900..2100,
     * stepping a day and 7 s so times of day vary too. */
    UNIT_CASE("sweep: IMF-fixdate, rfc850-date and asctime-date agree with gmtime");
    for (t = -2208988800LL; t < 4102444800LL; t += 86407) {
        tt = (time_t) t;
        gmtime_r(&tt, &tm);
        strftime(want, sizeof(want), "%a, %d %b %Y %H:%M:%S GMT", &tm);
        if (strcmp(ric_http_date(tt, buf, sizeof(buf)), want) != 0) {
            mismatches++;
        }
        if (ric_retry_after_parse((u_char *) buf, strlen(buf), tt - 1, &ms) != RIC_OK
            || ms != 1000) {
            failures++;
        }
        strftime(want, sizeof(want), "%a %b %e %H:%M:%S %Y", &tm);
        if (ric_retry_after_parse((u_char *) want, strlen(want), tt - 2, &ms) != RIC_OK
            || ms != 2000) {
            failures++;
        }
        strftime(want, sizeof(want), "%A, %d-%b-%y %H:%M:%S GMT", &tm);
        if (ric_retry_after_parse((u_char *) want, strlen(want), tt - 3, &ms) != RIC_OK
            || ms != 3000) {
            failures++;
        }
    }
    UNIT_CHECK_INT(mismatches, 0);
    UNIT_CHECK_INT(failures, 0);
}

int
main(void)
{
    test_good();
    test_bad();
    test_extreme_now();
    test_http_date();
    return UNIT_DONE("retry_after");
}
