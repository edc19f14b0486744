#!/bin/sh
# reload.sh: a steady keep-alive load through nginx and ricochet (one worker
# each, a 1 KiB answer from one nginx upstream), without and with a reload of
# the proxy every RELOAD_EVERY seconds during the run (`nginx -s reload`,
# `ricochet -s reload`), rounds interleaved. Prints requests/s (mean of the
# rounds), p99 (median), the ratio with reloads to without, and what the
# clients lost: answers that were not 2xx and socket errors (wrk counts a
# read error when a keep-alive connection closes under a request).
#
# knobs: BENCH_DURATION (s per run, 5), BENCH_ROUNDS (3), BENCH_CONNECTIONS
# (50), BENCH_WARMUP (s, 1; 0 skips), RELOAD_EVERY (s, 0.5), RICOCHET_BIN
# (build/ricochet), BENCH_KEEP=1 (keep the temp dir). POSIX sh.
set -eu
cd "$(dirname "$0")/../.."
BIN=${RICOCHET_BIN:-$PWD/build/ricochet}
DURATION=${BENCH_DURATION:-5}
ROUNDS=${BENCH_ROUNDS:-3}
CONNS=${BENCH_CONNECTIONS:-50}
WARMUP=${BENCH_WARMUP:-1}
EVERY=${RELOAD_EVERY:-0.5}
ROWS="nginx nginx-reload ricochet ricochet-reload"

# die, need_tools, bench_tmpdir, free_ports, wrk_figures, interleave_rounds, start_nginx_upstream,
# start_nginx_proxy, start_ricochet_proxy
. contrib/bench/lib.sh

need_tools wrk nginx luajit curl awk
[ -x "$BIN" ] || die "$BIN is missing: run make first"
bench_tmpdir

# shellcheck disable=SC2046
set -- $(free_ports 3) || die "cannot pick free ports (luajit with lua-socket is needed)"
[ $# -eq 3 ] || die "cannot pick free ports"
uport=$1 nport=$2 rport=$3

head -c 1024 /dev/zero | tr '\0' 'a' > "$dir/1k"
chmod 755 "$dir"
chmod 644 "$dir/1k"
start_nginx_upstream "$uport"
start_nginx_proxy "$nport" "$uport"
start_ricochet_proxy "$rport" "$uport" "pid $dir/ricochet/ricochet.pid;"

for port in $nport $rport; do
    got=$(curl -s "http://127.0.0.1:$port/1k" | wc -c)
    [ "$got" = 1024 ] || die "127.0.0.1:$port answered $got bytes, not 1024"
done

reload_once() { # proxy
    case $1 in
    nginx) nginx -p "$dir/nginx" -c "$dir/nginx/nginx.conf" -s reload 2>> "$dir/reloads.err" ;;
    ricochet) "$BIN" -p "$dir/ricochet" -c "$dir/ricochet/ricochet.conf" -s reload \
        >> "$dir/reloads.out" 2>> "$dir/reloads.err" ;;
    esac
}

# Prints "REQUESTS_PER_S P99_MS LOST NON2XX SOCKET_ERRORS RELOADS" for ROW over SECONDS.
run_wrk() { # row seconds
    proxy=${1%-reload}
    port=$nport
    [ "$proxy" = ricochet ] && port=$rport
    out="$dir/wrk.$1.out"
    wrk -t1 -c"$CONNS" -d"$2"s --latency "http://127.0.0.1:$port/1k" > "$out" 2>&1 &
    wpid=$!
    n=0
    if [ "$1" != "$proxy" ]; then
        end=$(($(date +%s) + $2))
        while [ "$(date +%s)" -lt "$end" ] && kill -0 "$wpid" 2>/dev/null; do
            sleep "$EVERY"
            reload_once "$proxy" && n=$((n + 1))
        done
    fi
    wait "$wpid" || true
    set -- $(wrk_figures "$out")
    sock=$(awk '/Socket errors/ { gsub(",", ""); print $4 + $6 + $8 + $10; found = 1 } END { if (!found) print 0 }' "$out")
    non2xx=$(awk '/Non-2xx/ { print $4; found = 1 } END { if (!found) print 0 }' "$out")
    echo "$1 $2 $((non2xx + sock)) $non2xx $sock $n"
}

echo "proxies: nginx proxy_pass, ricochet; one worker each; wrk -t1 -c$CONNS -d${DURATION}s, keep-alive"
echo "reload rows: the proxy reloads its (unchanged) configuration every ${EVERY}s during the run"
echo
echo "round proxy requests/s p99_ms lost non2xx sockerr reloads"
: > "$dir/results"
interleave_rounds 0
echo
echo "summary: requests/s mean over rounds, p99 median, lost = non-2xx + socket errors (sum)"
printf '%-16s %12s %9s %7s %8s %s\n' proxy requests/s "p99 ms" lost reloads "with reloads / without"
awk -v rows="$ROWS" '
    { rps[$2] += $3; n[$2]++; p[$2, n[$2]] = $4; lost[$2] += $5; rel[$2] += $8 }
    END {
        k = split(rows, order, " ")
        for (i = 1; i <= k; i++) {
            r = order[i]
            m = n[r]
            for (a = 1; a <= m; a++) for (b = a + 1; b <= m; b++)
                if (p[r, b] < p[r, a]) { t = p[r, a]; p[r, a] = p[r, b]; p[r, b] = t }
            mean[r] = rps[r] / m
            ratio = ""
            base = r; sub(/-reload$/, "", base)
            if (base != r) ratio = sprintf("%.3f", mean[r] / mean[base])
            printf "%-16s %12.0f %9.2f %7d %8d %s\n", r, mean[r], p[r, int((m + 1) / 2)], lost[r], rel[r], ratio
        }
    }' "$dir/results"
if grep -q "refused\|failed" "$dir/reloads.err" 2>/dev/null; then
    echo "reload errors:" >&2
    head -5 "$dir/reloads.err" >&2
fi
