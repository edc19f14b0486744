/* test_log.c: an error-log line is one line whatever its message carries
 * (control bytes escaped), cut at RIC_LOG_LINE_MAX; ric_log_fit measures
 * as the escaping writes. */
#include "../../core/log.c"
#include "unit.h"

#include <stdlib.h>

static char path[] = "/tmp/ricochet-test-log.XXXXXX";

/* The log file's text since the last call (it is emptied). */
static const char *
written(void)
{
    static char text[2 * RIC_LOG_LINE_MAX];
    int fd = open(path, O_RDONLY);
    ssize_t n = fd == -1 ? -1 : read(fd, text, sizeof(text) - 1);

    if (fd != -1) {
        close(fd);
    }
    text[n > 0 ? n : 0] = '\0';
    if (ftruncate(ric_log->fd, 0) != 0) {
        text[0] = '\0';
    }
    return text;
}

static void
test_escapes(void)
{
    const char *t;

    UNIT_CASE("control bytes, DEL and backslash are escaped; other bytes are kept");
    ric_log_write(RIC_LOG_ERR, 0, "a\nfake [error] %s", "line\r\t\x01\x7f\\ \xc3\xa9");
    t = written();
    UNIT_CHECK(strchr(t, '\n') == t + strlen(t) - 1);
    t = strstr(t, "]");
    UNIT_CHECK(t != NULL && strstr(t, ": a\\nfake [error] line\\r\\t\\x01\\x7f\\x5c \xc3\xa9\n") != NULL);

    UNIT_CASE("an errno's text follows the escaped message");
    ric_log_write(RIC_LOG_ERR, ENOENT, "open \"%s\"", "x\ny");
    t = written();
    UNIT_CHECK(strstr(t, "open \"x\\ny\" (2: ") != NULL);
    UNIT_CHECK(strchr(t, '\n') == t + strlen(t) - 1);
}

static void
test_cut(void)
{
    char msg[3000];
    const char *t;

    UNIT_CASE("a message that escapes past the line's end is cut, one line still");
    memset(msg, '\n', sizeof(msg) - 1);
    msg[sizeof(msg) - 1] = '\0';
    ric_log_write(RIC_LOG_ERR, 0, "%s", msg);
    t = written();
    UNIT_CHECK(strlen(t) <= RIC_LOG_LINE_MAX);
    UNIT_CHECK(strlen(t) > RIC_LOG_LINE_MAX - 8);
    UNIT_CHECK(strchr(t, '\n') == t + strlen(t) - 1);
    UNIT_CHECK(t[strlen(t) - 2] == 'n' && t[strlen(t) - 3] == '\\'); /* no escape cut in half */
}

static void
test_fit(void)
{
    UNIT_CASE("ric_log_fit counts each byte at its escaped width");
    UNIT_CHECK_INT(ric_log_fit("abc", 3, 10), 3);
    UNIT_CHECK_INT(ric_log_fit("abc", 3, 2), 2);
    UNIT_CHECK_INT(ric_log_fit("a\nb", 3, 2), 1);
    UNIT_CHECK_INT(ric_log_fit("a\nb", 3, 3), 2);
    UNIT_CHECK_INT(ric_log_fit("\x01z", 2, 4), 1);
    UNIT_CHECK_INT(ric_log_fit("\x01z", 2, 3), 0);
    UNIT_CHECK_INT(ric_log_fit("\\", 1, 4), 1);
}

int
main(void)
{
    ric_log_t log;
    int fd = mkstemp(path);

    if (fd == -1 || ric_log_open(&log, path, RIC_LOG_DEBUG) != RIC_OK) {
        perror("test_log");
        return 1;
    }
    close(fd);
    ric_log_use(&log);
    ric_log_stderr_too = 0;
    test_escapes();
    test_cut();
    test_fit();
    unlink(path);
    return UNIT_DONE("log");
}
