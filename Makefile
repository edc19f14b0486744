# ricochet: a Lua-scriptable retry gateway. `make help` lists the targets.

PREFIX ?= /usr/local
SYSCONFDIR ?= $(PREFIX)/etc
DESTDIR ?=
BUILD ?= build
CC ?= cc
SAN ?=

PKGS := luajit libevent openssl lmdb hiredis libsystemd
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS = $(shell pkg-config --libs $(PKGS) 2>/dev/null)

WARN := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes
CFLAGS ?= -O2 -g
ifeq ($(SAN),1)
CFLAGS := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif
ALL_CFLAGS = -std=c11 -D_GNU_SOURCE $(WARN) $(CFLAGS) -Icore -I$(BUILD) $(PKG_CFLAGS)
LIBS = $(PKG_LIBS) -lpthread -lm

CORE_SRC := $(filter-out core/main.c,$(wildcard core/*.c))
CORE_OBJ := $(patsubst core/%.c,$(BUILD)/obj/%.o,$(CORE_SRC)) $(BUILD)/obj/default_conf.o \
    $(BUILD)/obj/embedded_lua.o
LUA_LIB := scripts/ricochet/api.lua scripts/ricochet/sandbox.lua
UNIT_SRC := $(wildcard tests/unit/test_*.c)
UNIT_BIN := $(patsubst tests/unit/%.c,$(BUILD)/%,$(UNIT_SRC))
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)

.PHONY: deb all run test asan fuzz bench bench-faults bench-reload bench-profile bench-idempotency bench-tls install clean help deps deps-test deps-run
.DEFAULT_GOAL := all

all: deps $(BUILD)/ricochet

help:
	@echo "make            build $(BUILD)/ricochet (installs missing Debian packages as root)"
	@echo "make run        build and run the gateway on conf/ricochet.conf (127.0.0.1:8080)"
	@echo "                in front of a demo upstream (127.0.0.1:9000)"
	@echo "make test       build and run every test suite; ends with 'N passed, N failed'"
	@echo "make asan       the whole suite under AddressSanitizer and UBSan"
	@echo "make fuzz       run the libFuzzer targets for FUZZ_SECONDS (default 60) each"
	@echo "make bench      wrk against ricochet, nginx and HAProxy (contrib/bench): throughput,"
	@echo "                then retries under injected upstream faults"
	@echo "make bench-faults  only the fault scenarios (contrib/bench/faults.sh)"
	@echo "make bench-idempotency  only the idempotency store's cost (contrib/bench/idempotency.sh)"
	@echo "make bench-profile  perf profiles of the nginx and ricochet workers, 1 KiB and 64 KiB (contrib/bench/profile.sh)"
	@echo "make bench-reload  a steady load with and without a reload every 0.5 s, against nginx (contrib/bench/reload.sh)"
	@echo "make bench-tls  only TLS (to the upstream, and terminating it) against nginx and HAProxy (contrib/bench/tls.sh)"
	@echo "make install    install into DESTDIR/PREFIX (default /usr/local)"
	@echo "make deb        build/ricochet_VERSION_ARCH.deb: the binary, /etc/ricochet, the systemd unit,"
	@echo "                logrotate, the man page and the Lua test kit (contrib/deb/build.sh)"
	@echo "make clean      remove build outputs"

deps:
	@sh contrib/deps.sh build

deps-test:
	@sh contrib/deps.sh test

deps-run:
	@sh contrib/deps.sh run

$(BUILD)/obj/%.o: core/%.c core/*.h | $(BUILD)/obj
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/default_conf.c: conf/ricochet.conf contrib/embed_conf.sh | $(BUILD)/obj
	sh contrib/embed_conf.sh $< > $@

$(BUILD)/obj/default_conf.o: $(BUILD)/default_conf.c core/conf.h
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/embedded_lua.c: $(LUA_LIB) core/status_page.html contrib/embed_text.sh | $(BUILD)/obj
	sh contrib/embed_text.sh ric_lua_api=scripts/ricochet/api.lua \
	    ric_lua_sandbox=scripts/ricochet/sandbox.lua ric_status_page=core/status_page.html > $@

$(BUILD)/obj/embedded_lua.o: $(BUILD)/embedded_lua.c
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/ricochet: $(BUILD)/obj/main.o $(CORE_OBJ)
	$(CC) $(LDFLAGS) -o $@ $^ $(LIBS)

$(BUILD)/test_%: tests/unit/test_%.c tests/unit/unit.h $(CORE_OBJ)
	$(CC) $(ALL_CFLAGS) -Wno-missing-prototypes -o $@ $< $(filter-out $(BUILD)/obj/$*.o,$(CORE_OBJ)) $(LDFLAGS) $(LIBS)

# Replays the fuzz corpora through the fuzz targets without libFuzzer, so
# the plain test suite runs them too.
$(BUILD)/replay_%: tests/fuzz/fuzz_%.c tests/fuzz/replay.c $(CORE_OBJ)
	$(CC) $(ALL_CFLAGS) -Wno-missing-prototypes -o $@ $< tests/fuzz/replay.c $(CORE_OBJ) $(LDFLAGS) $(LIBS)

$(BUILD)/obj:
	mkdir -p $@

run: deps-run $(BUILD)/ricochet
	@RICOCHET_BIN=$(BUILD)/ricochet sh contrib/demo/run.sh

test: deps-test $(BUILD)/ricochet $(UNIT_BIN) $(patsubst tests/fuzz/fuzz_%.c,$(BUILD)/replay_%,$(FUZZ_SRC))
	@BUILD=$(BUILD) RICOCHET_SANITIZED=$(SAN) sh tests/run

asan:
	$(MAKE) BUILD=build/asan SAN=1 test

FUZZ_SECONDS ?= 60
fuzz: $(BUILD)/default_conf.c $(BUILD)/embedded_lua.c
	@sh contrib/deps.sh fuzz
	@mkdir -p $(BUILD)/fuzz
	@set -e; for f in $(FUZZ_SRC); do \
	    name=$$(basename $$f .c); \
	    clang -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -Icore \
	        -I$(BUILD) $(PKG_CFLAGS) -o $(BUILD)/fuzz/$$name $$f $(CORE_SRC) $(BUILD)/default_conf.c $(BUILD)/embedded_lua.c $(PKG_LIBS) -lm; \
	    corpus=tests/fuzz/corpus/$${name#fuzz_}; work=$(BUILD)/fuzz/$$name.corpus; \
	    dict=tests/fuzz/$${name#fuzz_}.dict; [ -f $$dict ] || dict=tests/fuzz/http.dict; \
	    rm -rf $$work; mkdir -p $$work; \
	    echo "fuzzing $$name for $(FUZZ_SECONDS)s"; \
	    $(BUILD)/fuzz/$$name -max_total_time=$(FUZZ_SECONDS) -dict=$$dict \
	        -artifact_prefix=$(BUILD)/fuzz/ $$work $$corpus; \
	done

# The open-loop load generator of the fault benchmark: libevent only.
$(BUILD)/openloop: contrib/bench/openloop.c
	@mkdir -p $(BUILD)
	$(CC) -std=c11 -D_GNU_SOURCE $(WARN) $(CFLAGS) $(shell pkg-config --cflags libevent) -o $@ $< \
	    $(LDFLAGS) $(shell pkg-config --libs libevent) -lm

bench: $(BUILD)/ricochet $(BUILD)/openloop
	@sh contrib/deps.sh bench
	sh contrib/bench/run.sh
	OPENLOOP_BIN=$(abspath $(BUILD))/openloop sh contrib/bench/faults.sh
	sh contrib/bench/idempotency.sh
	sh contrib/bench/tls.sh

bench-faults: $(BUILD)/ricochet $(BUILD)/openloop
	@sh contrib/deps.sh bench
	OPENLOOP_BIN=$(abspath $(BUILD))/openloop sh contrib/bench/faults.sh

bench-idempotency: $(BUILD)/ricochet
	@sh contrib/deps.sh bench
	sh contrib/bench/idempotency.sh

bench-tls: $(BUILD)/ricochet
	@sh contrib/deps.sh bench
	sh contrib/bench/tls.sh

bench-reload: $(BUILD)/ricochet
	@sh contrib/deps.sh bench
	sh contrib/bench/reload.sh

bench-profile: $(BUILD)/ricochet
	@sh contrib/deps.sh bench
	sh contrib/bench/profile.sh

install: all
	install -d $(DESTDIR)$(PREFIX)/sbin $(DESTDIR)$(SYSCONFDIR)/ricochet
	install -m 755 $(BUILD)/ricochet $(DESTDIR)$(PREFIX)/sbin/ricochet
	install -m 644 conf/ricochet.conf $(DESTDIR)$(SYSCONFDIR)/ricochet/ricochet.conf.default
	test -e $(DESTDIR)$(SYSCONFDIR)/ricochet/ricochet.conf || \
	    install -m 644 conf/ricochet.conf $(DESTDIR)$(SYSCONFDIR)/ricochet/ricochet.conf
	install -d $(DESTDIR)$(PREFIX)/share/man/man8
	gzip -9nc contrib/man/ricochet.8 > $(DESTDIR)$(PREFIX)/share/man/man8/ricochet.8.gz
	install -d $(DESTDIR)$(PREFIX)/share/doc/ricochet
	install -m 644 README.md conf/REFERENCE.md $(DESTDIR)$(PREFIX)/share/doc/ricochet/
	install -m 644 scripts/README.md $(DESTDIR)$(PREFIX)/share/doc/ricochet/SCRIPTS.md
	# the route script test kit, where LuaJIT's require looks: require("ricochet.testing")
	install -d $(DESTDIR)$(PREFIX)/share/lua/5.1/ricochet $(DESTDIR)$(PREFIX)/share/ricochet/examples
	install -m 644 $(LUA_LIB) scripts/ricochet/testing.lua $(DESTDIR)$(PREFIX)/share/lua/5.1/ricochet/
	install -m 644 scripts/examples/*.lua $(DESTDIR)$(PREFIX)/share/ricochet/examples/

deb: all
	@sh contrib/deb/build.sh $(BUILD)

clean:
	rm -rf build
