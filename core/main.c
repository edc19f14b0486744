/* main.c: the command line: run, test a config (-t), signal a master (-s), print versions (-v). */
#include "access_log.h"
#include "conf.h"
#include "idem_store.h"
#include "shared_dict.h"
#include "log.h"
#include "plan.h"
#include "process.h"
#include "retry.h"
#include "script.h"
#include "shm.h"
#include "upstream.h"

#include <errno.h>
#include <event2/event.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <malloc.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static void
usage(FILE *out)
{
    fprintf(out,
            "usage: ricochet [-h] [-v] [-t] [-s SIGNAL] [-p PREFIX] [-c FILE]\n"
            "\n"
            "  -h, --help  this help\n"
            "  -v, --version  the version, and the versions of the libraries it runs on\n"
            "  -t          test the configuration and exit\n"
            "  -s SIGNAL   send SIGNAL to the running master: stop, quit, reopen,\n"
            "              reload, upgrade (these two wait, and say whether it took)\n"
            "  -p PREFIX   the directory relative paths resolve against (default: the\n"
            "              current directory)\n"
            "  -c FILE     the configuration file (default: PREFIX/conf/ricochet.conf,\n"
            "              or the built-in default when that file does not exist)\n"
            "  --directives  list every configuration directive with its default\n"
            "\n"
            "usage: ricochet plan [-p PREFIX] [-c FILE] [LOCATION]\n"
            "  print each route's retry schedule: the wait window before every retry,\n"
            "  the worst case against retry_timeout, and retries that can never happen\n");
}

/* LuaJIT's own idea of its version, read at run time. */
static void
print_luajit_version(void)
{
    lua_State *L = luaL_newstate();

    if (L == NULL) {
        printf("LuaJIT: (cannot create a state)\n");
        return;
    }
    luaL_openlibs(L);
    lua_getglobal(L, "jit");                 /* jit */
    if (lua_istable(L, -1)) {
        lua_getfield(L, -1, "version");      /* jit version */
        printf("%s\n", lua_tostring(L, -1) ? lua_tostring(L, -1) : "LuaJIT (unknown)");
        lua_pop(L, 1);                       /* jit */
    } else {
        printf("%s\n", LUA_VERSION);
    }
    lua_pop(L, 1);                           /* (empty) */
    lua_close(L);
}

static void
print_versions(void)
{
    printf("ricochet version %s\n", RIC_VERSION);
    printf("libevent %s\n", event_get_version());
    printf("%s\n", OpenSSL_version(OPENSSL_VERSION));
    print_luajit_version();
}

int ric_conf_print_directives(FILE *out);

/* A typo in -p or -c should not quietly test the built-in default. */
static int
check_paths(const char *prefix, const char *file)
{
    struct stat st;

    if (file != NULL && *file == '\0') {
        fprintf(stderr, "ricochet: -c needs a file name\n");
        return RIC_ERROR;
    }
    if (prefix != NULL && (*prefix == '\0' || stat(prefix, &st) != 0 || !S_ISDIR(st.st_mode))) {
        fprintf(stderr, "ricochet: the prefix \"%s\" is not a directory\n", prefix);
        return RIC_ERROR;
    }
    return RIC_OK;
}

/* RICOCHET_NO_RETRY=1 turns every retry off, whatever the config says. */
static int
apply_kill_switch(void)
{
    const char *v = getenv("RICOCHET_NO_RETRY");

    ric_retry_killed = v != NULL && strcmp(v, "1") == 0;
    return ric_retry_killed;
}

/* `ricochet plan [-c FILE] [-p PREFIX] [LOCATION]` */
static int
plan(int argc, char **argv)
{
    const char *prefix = NULL, *file = NULL, *filter = NULL;
    char err[1024];
    ric_conf_t *conf;
    int opt, n;

    apply_kill_switch();
    if (argc == 2 && strcmp(argv[1], "--help") == 0) {
        argv[1] = (char *) "-h";
    }
    while ((opt = getopt(argc, argv, "c:p:h")) != -1) {
        switch (opt) {
        case 'c':
            file = optarg;
            break;
        case 'p':
            prefix = optarg;
            break;
        default:
            fprintf(opt == 'h' ? stdout : stderr,
                    "usage: ricochet plan [-p PREFIX] [-c FILE] [LOCATION]\n");
            return opt == 'h' ? 0 : 1;
        }
    }
    if (optind < argc) {
        filter = argv[optind];
    }
    conf = ric_conf_load(prefix, file, err, sizeof(err));
    if (conf == NULL) {
        fprintf(stderr, "ricochet: %s\n", err);
        return 1;
    }
    n = ric_plan_print(conf, filter, stdout);
    if (n == 0) {
        fprintf(stderr, "ricochet: no proxied location%s%s in %s\n", filter ? " matches " : "",
                filter ? filter : "", conf->file);
    }
    ric_conf_free(conf);
    return n > 0 ? 0 : 1;
}

int
main(int argc, char **argv)
{
    const char *prefix = NULL, *file = NULL, *sig = NULL;
    int test = 0, opt, rc;
    char err[1024];
    ric_conf_t *conf;
    ric_log_t log;
    ric_shm_t *zone;

    /* glibc raises its mmap threshold to the size of each mapped block
     * freed (up to 32 MiB), so after one large answer or script string the
     * next ones come from the heap, and a burst of them stays resident
     * while the worker idles. A fixed threshold keeps every block of 128
     * KiB or more a mapping of its own, given back when it is freed. */
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
    if (argc == 2 && strcmp(argv[1], "--directives") == 0) {
        return ric_conf_print_directives(stdout);
    }
    if (argc == 2 && strcmp(argv[1], "--help") == 0) {
        usage(stdout);
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "--version") == 0) {
        print_versions();
        return 0;
    }
    if (argc >= 2 && strcmp(argv[1], "plan") == 0) {
        return plan(argc - 1, argv + 1);
    }
    while ((opt = getopt(argc, argv, "hvtc:p:s:")) != -1) {
        switch (opt) {
        case 'h':
            usage(stdout);
            return 0;
        case 'v':
            print_versions();
            return 0;
        case 't':
            test = 1;
            break;
        case 'c':
            file = optarg;
            break;
        case 'p':
            prefix = optarg;
            break;
        case 's':
            sig = optarg;
            break;
        default:
            usage(stderr);
            return 1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ricochet: unexpected argument \"%s\"\n", argv[optind]);
        usage(stderr);
        return 1;
    }

    if (check_paths(prefix, file) != RIC_OK) {
        if (test) {
            fprintf(stderr, "ricochet: configuration file %s test failed\n",
                    file && *file ? file : "(default)");
        }
        return 1;
    }
    conf = ric_conf_load(prefix, file, err, sizeof(err));
    if (conf == NULL) {
        fprintf(stderr, "ricochet: %s\n", err);
        if (test) {
            fprintf(stderr, "ricochet: configuration file %s test failed\n",
                    file ? file : "(default)");
        }
        return 1;
    }
    if (test) {
        ric_idem_store_recover_all(conf, 1, err, sizeof(err)); /* says what a start would move */
        printf("ricochet: configuration file %s test is successful\n", conf->file);
        ric_conf_free(conf);
        return 0;
    }
    if (sig != NULL) {
        rc = ric_process_signal(conf, sig);
        ric_conf_free(conf);
        return rc;
    }

    if (ric_log_open(&log, conf->error_log, (int) conf->error_log_level) != RIC_OK) {
        fprintf(stderr, "ricochet: cannot open the error log \"%s\": %s\n", conf->error_log,
                strerror(errno));
        ric_conf_free(conf);
        return 1;
    }
    ric_log_use(&log);
    if (apply_kill_switch()) {
        ric_log_error(RIC_LOG_NOTICE, 0, "RICOCHET_NO_RETRY=1: every retry is off");
    }
    /* cross-worker state: made before the first fork, so every worker, every
     * replacement and every later generation sees the same budgets and health */
    zone = ric_shm_create(ric_process_zone_size(conf));
    if (zone == NULL) {
        fprintf(stderr, "ricochet: cannot map the shared memory zone: %s\n", strerror(errno));
        ric_conf_free(conf);
        return 1;
    }
    /* from the first bound socket a client may connect and an operator
     * signal: the master's signals wait, pending, until its loop takes them */
    ric_process_hold_signals();
    if (ric_process_generation(conf, zone, err, sizeof(err)) != RIC_OK) {
        ric_log_error(RIC_LOG_EMERG, 0, "%s", err); /* on stderr too, at start-up */
        ric_shm_destroy(zone);
        ric_conf_free(conf);
        return 1;
    }
    rc = ric_process_master(&conf, prefix, file, zone, argv);
    ric_conf_free(conf);
    ric_shm_destroy(zone);
    return rc;
}
