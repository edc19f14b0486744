#!/bin/sh
# profile.sh: where a proxy worker's CPU goes. nginx and ricochet (one worker
# each) in front of one nginx upstream; for a 1 KiB and a 64 KiB answer, wrk
# (-t1 -c32, keep-alive) drives each proxy while `perf record` samples its
# worker; prints the top PROFILE_TOP (15) symbols of each, by their own
# samples (perf report --no-children): all of them (the kernel's TCP path
# dominates), then those of the process's own code and libraries; and the
# worker's CPU time a request over the sampled window (utime+stime from
# /proc; perf's own sampling adds to it, alike for both).
#
# knobs: PROFILE_SECONDS (8), PROFILE_TOP (15), RICOCHET_BIN (build/ricochet),
# BENCH_KEEP=1 (keep the temp dir with the perf.data files). POSIX sh.
set -eu
cd "$(dirname "$0")/../.."
BIN=${RICOCHET_BIN:-$PWD/build/ricochet}
SECONDS_=${PROFILE_SECONDS:-8}
TOP=${PROFILE_TOP:-15}

# die, need_tools, bench_tmpdir, free_ports, start_nginx_upstream, start_nginx_proxy,
# start_ricochet_proxy
. contrib/bench/lib.sh

need_tools wrk nginx perf luajit curl awk pgrep
[ -x "$BIN" ] || die "$BIN is missing: run make first"
bench_tmpdir

# shellcheck disable=SC2046
set -- $(free_ports 3) || die "cannot pick free ports"
uport=$1 nport=$2 rport=$3

head -c 1024 /dev/zero | tr '\0' 'a' > "$dir/1k"
head -c 65536 /dev/zero | tr '\0' 'a' > "$dir/64k"
chmod 755 "$dir"
chmod 644 "$dir/1k" "$dir/64k"
start_nginx_upstream "$uport"
start_nginx_proxy "$nport" "$uport"
start_ricochet_proxy "$rport" "$uport"

cpu_ticks() { # pid -> utime+stime in clock ticks
    awk '{ print $14 + $15 }' "/proc/$1/stat"
}

profile() { # name master_pid port size
    worker=$(pgrep -P "$2" | head -1)
    [ -n "$worker" ] || die "$1 has no worker"
    wrk -t1 -c32 -d"$((SECONDS_ + 2))"s "http://127.0.0.1:$3/$4" > "$dir/wrk.$1.$4" 2>&1 &
    wpid=$!
    sleep 1
    before=$(cpu_ticks "$worker")
    perf record -q -g -F 999 -o "$dir/perf.$1.$4" -p "$worker" -- sleep "$SECONDS_" 2> /dev/null
    after=$(cpu_ticks "$worker")
    wait "$wpid" || true
    rps=$(awk '/Requests\/sec:/ { print $2 }' "$dir/wrk.$1.$4")
    hz=$(getconf CLK_TCK)
    echo "== $1, $4: $rps requests/s; worker CPU $(awk -v t=$((after - before)) -v hz="$hz" -v r="$rps" -v s="$SECONDS_" \
        'BEGIN { printf "%.1f us a request", t / hz / (r * s) * 1e6 }')"
    perf report -q -i "$dir/perf.$1.$4" --no-children --stdio --sort symbol -g none 2> /dev/null \
        | awk 'NF && $1 ~ /%$/ { print $1, $2, $3 }' > "$dir/report.$1.$4"
    echo "-- all symbols"
    head -n "$TOP" "$dir/report.$1.$4"
    echo "-- the process's own code and its libraries ([.])"
    awk '$2 == "[.]"' "$dir/report.$1.$4" | head -n "$TOP"
    echo
}

for size in 1k 64k; do
    profile nginx "$npid" "$nport" "$size"
    profile ricochet "$rpid" "$rport" "$size"
done
