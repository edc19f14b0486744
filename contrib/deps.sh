#!/bin/sh
# deps.sh: installs the Debian packages a make target needs, when they are missing.
# usage: contrib/deps.sh build|run|test|fuzz|bench ...
# As root it runs `apt-get update` once and installs what is missing; otherwise
# it prints the exact command to run and fails.
set -eu

pkgs_build="gcc make pkg-config libc6-dev libluajit2-5.1-dev luajit2 libevent-dev libssl-dev liblmdb-dev libhiredis-dev libsystemd-dev"
# lua-cjson: the demo upstream (run) and the test kit (test); the gateway's JSON is its own
pkgs_run="luajit2 lua-socket lua-cjson curl"
pkgs_test="lua-busted lua-socket lua-cjson procps redis-server faketime openssl curl chromium prometheus python3-prometheus-client"
pkgs_fuzz="clang libclang-rt-14-dev"
pkgs_bench="wrk apache2-utils nginx haproxy procps luajit2 lua-socket curl strace linux-perf libnginx-mod-http-ndk libnginx-mod-http-lua lua-resty-core lua-resty-lrucache redis-server openssl"

want=""
for group in "$@"; do
    case "$group" in
    build) want="$want $pkgs_build" ;;
    run) want="$want $pkgs_build $pkgs_run" ;;
    test) want="$want $pkgs_build $pkgs_test" ;;
    fuzz) want="$want $pkgs_build $pkgs_fuzz" ;;
    bench) want="$want $pkgs_build $pkgs_bench" ;;
    *) echo "deps.sh: unknown group \"$group\"" >&2; exit 2 ;;
    esac
done

missing=""
for p in $want; do
    case " $missing " in *" $p "*) continue ;; esac
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" != 0 ]; then
    echo "ricochet needs these Debian packages:$missing" >&2
    echo "install them with:" >&2
    echo "  sudo apt-get update && sudo apt-get install -y$missing" >&2
    exit 1
fi
echo "installing:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# shellcheck disable=SC2086
apt-get install -y -q --no-install-recommends $missing
