/* retry_after.c: a strict parser for the Retry-After field and an IMF-fixdate formatter. */
#include "retry_after.h"

#include <stdio.h>

/*
 * Choices where the header leaves room:
 *  - second 60 is accepted only as a real leap second, 23:59:60, and read
 *    as 23:59:59 (POSIX time has no leap seconds; one second early is the
 *    safe side for a wait). 60 at any other minute is an impossible time.
 *  - delay-seconds may have leading zeros (1*DIGIT allows them); its value
 *    must fit INT64_MAX / 1000 seconds, so *delay_ms never overflows.
 *  - RFC 850 two-digit years are resolved by calendar year against now's
 *    year Y into (Y - 50, Y + 50]: "more than 50 years in the future" means
 *    a year beyond Y + 50, taken from the previous century instead.
 *  - conversion uses our own days-from-civil arithmetic (proleptic
 *    Gregorian, UTC), independent of TZ and locale.
 */

static const char *const wday_short[] = { "Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat" };
static const char *const wday_long[] = { "Sunday",   "Monday", "Tuesday", "Wednesday",
                                         "Thursday", "Friday", "Saturday" };
static const char *const month_names[] = { "Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                           "Jul", "Aug", "Sep", "Oct", "Nov", "Dec" };

/* A cursor over the trimmed value. */
typedef struct {
    const u_char *p;
    const u_char *end;
} cursor_t;

typedef struct {
    int64_t year;
    int month; /* 1..12 */
    int day;
    int hour;
    int minute;
    int second;
} civil_t;

static int
is_digit(u_char c)
{
    return c >= '0' && c <= '9';
}

static int
is_leap(int64_t y)
{
    return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
}

static int
days_in_month(int64_t y, int m)
{
    static const int days[] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
    return m == 2 && is_leap(y) ? 29 : days[m - 1];
}

/* Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
 * days_from_civil); valid for any year that fits comfortably in int64. */
static int64_t
days_from_civil(int64_t y, int m, int d)
{
    int64_t era, yoe, doy, doe;

    y -= m <= 2;
    era = (y >= 0 ? y : y - 399) / 400;
    yoe = y - era * 400;
    doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* The inverse of days_from_civil. */
static void
civil_from_days(int64_t z, int64_t *y, int *m, int *d)
{
    int64_t era, doe, yoe, doy, mp;

    z += 719468;
    era = (z >= 0 ? z : z - 146096) / 146097;
    doe = z - era * 146097;
    yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    mp = (5 * doy + 2) / 153;
    *d = (int) (doy - (153 * mp + 2) / 5 + 1);
    *m = (int) (mp < 10 ? mp + 3 : mp - 9);
    *y = yoe + era * 400 + (*m <= 2);
}

static int64_t
floor_div(int64_t a, int64_t b)
{
    return a / b - (a % b != 0 && (a < 0) != (b < 0));
}

/* Consumes exactly the literal s. */
static int
expect(cursor_t *c, const char *s)
{
    size_t n = strlen(s);

    if ((size_t) (c->end - c->p) < n || memcmp(c->p, s, n) != 0) {
        return 0;
    }
    c->p += n;
    return 1;
}

/* Consumes exactly n digits into *out. */
static int
digits(cursor_t *c, int n, int *out)
{
    int v = 0;

    if (c->end - c->p < n) {
        return 0;
    }
    while (n-- > 0) {
        if (!is_digit(*c->p)) {
            return 0;
        }
        v = v * 10 + (*c->p++ - '0');
    }
    *out = v;
    return 1;
}

/* Consumes one of names (case-sensitively, as RFC 9110 spells them) and
 * requires that the next byte is not a letter, so "Sund" is not "Sun". */
static int
name(cursor_t *c, const char *const *names, int count, int *out)
{
    int i;

    for (i = 0; i < count; i++) {
        cursor_t t = *c;
        if (expect(&t, names[i])
            && (t.p == t.end || !((*t.p | 0x20) >= 'a' && (*t.p | 0x20) <= 'z'))) {
            *c = t;
            *out = i;
            return 1;
        }
    }
    return 0;
}

/* time-of-day = hour ":" minute ":" second */
static int
time_of_day(cursor_t *c, civil_t *t)
{
    return digits(c, 2, &t->hour) && expect(c, ":") && digits(c, 2, &t->minute)
           && expect(c, ":") && digits(c, 2, &t->second);
}

static int
month(cursor_t *c, civil_t *t)
{
    int m;

    if (!name(c, month_names, 12, &m)) {
        return 0;
    }
    t->month = m + 1;
    return 1;
}

/* The year of now (seconds since the epoch, UTC). */
static int64_t
year_of(int64_t now)
{
    int64_t y;
    int m, d;

    civil_from_days(floor_div(now, 86400), &y, &m, &d);
    return y;
}

/* IMF-fixdate after "Sun": ", 06 Nov 1994 08:49:37 GMT" */
static int
parse_imf_rest(cursor_t *c, civil_t *t)
{
    int y;

    if (!(expect(c, ", ") && digits(c, 2, &t->day) && expect(c, " ") && month(c, t)
          && expect(c, " ") && digits(c, 4, &y) && expect(c, " ") && time_of_day(c, t)
          && expect(c, " GMT"))) {
        return 0;
    }
    t->year = y;
    return 1;
}

/* rfc850-date after "Sunday": ", 06-Nov-94 08:49:37 GMT" */
static int
parse_rfc850_rest(cursor_t *c, civil_t *t, int64_t now)
{
    int yy;
    int64_t this_year, y;

    if (!(expect(c, ", ") && digits(c, 2, &t->day) && expect(c, "-") && month(c, t)
          && expect(c, "-") && digits(c, 2, &yy) && expect(c, " ") && time_of_day(c, t)
          && expect(c, " GMT"))) {
        return 0;
    }
    /* RFC 9110 §5.6.7: a year more than 50 years in the future is the most
     * recent past year with the same last two digits. */
    this_year = year_of(now);
    y = this_year - floor_div(this_year, 100) * 100;
    y = this_year - y + yy;
    if (y > this_year + 50) {
        y -= 100;
    } else if (y <= this_year - 50) {
        y += 100;
    }
    if (y < 0 || y > 9999) {
        return 0; /* only for an absurd now; keeps the arithmetic in range */
    }
    t->year = y;
    return 1;
}

/* asctime-date after "Sun": " Nov  6 08:49:37 1994" */
static int
parse_asctime_rest(cursor_t *c, civil_t *t)
{
    int y;

    if (!(expect(c, " ") && month(c, t) && expect(c, " "))) {
        return 0;
    }
    /* date3 = month SP ( 2DIGIT / ( SP DIGIT ) ) */
    if (expect(c, " ")) {
        if (!digits(c, 1, &t->day)) {
            return 0;
        }
    } else if (!digits(c, 2, &t->day)) {
        return 0;
    }
    if (!(expect(c, " ") && time_of_day(c, t) && expect(c, " ") && digits(c, 4, &y))) {
        return 0;
    }
    t->year = y;
    return 1;
}

/* An HTTP-date in any of its three forms, into seconds since the epoch. */
static int
parse_http_date(cursor_t *c, int64_t now, int64_t *out)
{
    civil_t t;
    int wd, ok;

    memset(&t, 0, sizeof(t));
    if (name(c, wday_long, 7, &wd)) {
        ok = parse_rfc850_rest(c, &t, now);
    } else if (name(c, wday_short, 7, &wd)) {
        ok = (c->p < c->end && *c->p == ',') ? parse_imf_rest(c, &t) : parse_asctime_rest(c, &t);
    } else {
        return 0;
    }
    if (!ok || c->p != c->end) {
        return 0;
    }
    if (t.day < 1 || t.day > days_in_month(t.year, t.month) || t.hour > 23 || t.minute > 59) {
        return 0;
    }
    if (t.second == 60 && t.hour == 23 && t.minute == 59) {
        t.second = 59;
    } else if (t.second > 59) {
        return 0;
    }
    *out = days_from_civil(t.year, t.month, t.day) * 86400 + t.hour * 3600 + t.minute * 60
           + t.second;
    return 1;
}

/* delay-seconds = 1*DIGIT, as ms. */
static int
parse_delay_seconds(cursor_t *c, int64_t *delay_ms)
{
    int64_t v = 0;

    if (c->p == c->end) {
        return 0;
    }
    for (; c->p < c->end; c->p++) {
        if (!is_digit(*c->p)) {
            return 0;
        }
        if (v > (INT64_MAX / 1000 - (*c->p - '0')) / 10) {
            return 0;
        }
        v = v * 10 + (*c->p - '0');
    }
    *delay_ms = v * 1000;
    return 1;
}

int
ric_retry_after_parse(const u_char *value, size_t len, time_t now, int64_t *delay_ms)
{
    cursor_t c;
    int64_t t, n = (int64_t) now, ms;

    if (value == NULL) {
        return RIC_ERROR;
    }
    c.p = value;
    c.end = value + len;
    while (c.p < c.end && (*c.p == ' ' || *c.p == '\t')) {
        c.p++;
    }
    while (c.end > c.p && (c.end[-1] == ' ' || c.end[-1] == '\t')) {
        c.end--;
    }
    if (c.p == c.end) {
        return RIC_ERROR;
    }

    if (is_digit(*c.p)) {
        if (!parse_delay_seconds(&c, &ms)) {
            return RIC_ERROR;
        }
        *delay_ms = ms;
        return RIC_OK;
    }

    if (!parse_http_date(&c, n, &t)) {
        return RIC_ERROR;
    }
    if (t <= n) {
        *delay_ms = 0;
        return RIC_OK;
    }
    /* t is within years 0..9999; only an absurd now could overflow here */
    if (n < 0 && t > INT64_MAX + n) {
        return RIC_ERROR;
    }
    if (t - n > INT64_MAX / 1000) {
        return RIC_ERROR;
    }
    *delay_ms = (t - n) * 1000;
    return RIC_OK;
}

/* Times outside years 0000..9999 are clamped to that range: IMF-fixdate
 * has a 4-digit year, and the output must stay 29 bytes. */
char *
ric_http_date(time_t t, char *buf, size_t size)
{
    static const int64_t first = -62167219200LL; /* 0000-01-01 00:00:00 */
    static const int64_t last = 253402300799LL;  /* 9999-12-31 23:59:59 */
    int64_t s = (int64_t) t, days, secs, y;
    int m, d;

    if (buf == NULL || size == 0) {
        return buf;
    }
    s = ric_max(ric_min(s, last), first);
    days = floor_div(s, 86400);
    secs = s - days * 86400;
    civil_from_days(days, &y, &m, &d);
    /* 1970-01-01 was a Thursday */
    snprintf(buf, size, "%s, %02d %s %04d %02d:%02d:%02d GMT",
             wday_short[(days % 7 + 11) % 7], d, month_names[m - 1], (int) y,
             (int) (secs / 3600), (int) (secs / 60 % 60), (int) (secs % 60));
    return buf;
}
