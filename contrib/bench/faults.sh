#!/bin/sh
# faults.sh: the retry benchmark. Three reverse proxies, one worker each, all
# making at most 4 attempts per request (3 retries), in front of the same
# fault-injecting upstream (contrib/bench/fault_server.lua), through six
# scenarios: no faults (the sanity baseline), 30% random 503s, the same from an
# upstream that writes each answer's head and body in two sends (split: Nagle
# on, as Python's http.server), a brownout (every answer 503 from 1.25 s to
# 2.75 s of a 4 s run), a full outage, and slow answers (5% of answers take
# 1 s, the rest 5 ms: hedging's case).
# Each proxy gets two runs per scenario: closed loop (wrk: a fixed number of
# connections, each sending its next request when the last is answered) and
# open loop (build/openloop, contrib/bench/openloop.c: a fixed arrival rate,
# whatever the answers take). For each it reports the client's success rate
# (2xx among all requests, failed ones included), the upstream attempts per
# client request (the upstream's hit count / requests sent), the upstream's
# load and the p50 and p99 latency. Every run gets a freshly started proxy
# (ricochet's retry budget and pools start empty) and a freshly armed fault,
# so runs do not leak into each other.
#
# knobs: FAULTS_DURATION (s per run, 4), FAULTS_CONNECTIONS (wrk's, 8),
# FAULTS_THREADS (wrk's, 1), FAULTS_OPEN (1; 0 skips the open-loop runs),
# FAULTS_OPEN_RATE (openloop's requests/s, 1000), FAULTS_ROUNDS (1; more adds
# a summary over rounds), FAULTS_RATE (failure probability of the random
# scenario, 0.3), FAULTS_BROWNOUT ("1.25 2.75": from and to, seconds into the
# run), FAULTS_SLOW ("0.05 1000 5": the share of slow answers, their time and
# the others' time in ms), FAULTS_SCENARIOS ("baseline random split brownout
# outage slow"), FAULTS_PROXIES ("nginx haproxy ricochet ricochet-short
# ricochet-ratio ricochet-hedge"),
# FAULTS_SHORT_BACKOFF (the retry_backoff of ricochet-short, "10ms 100ms"),
# FAULTS_RATIO_BUDGET (the retry_budget of ricochet-ratio, "20% min=10/s"),
# FAULTS_HEDGE (the retry_hedge of ricochet-hedge, "auto"),
# RICOCHET_BIN (build/ricochet), OPENLOOP_BIN (build/openloop), BENCH_KEEP=1
# (keep the temp dir: configs, logs, wrk and openloop output).
# POSIX sh: it runs under dash.
set -eu
cd "$(dirname "$0")/../.."
# die, need_tools, bench_tmpdir, stop_one, free_ports, wait_port
. contrib/bench/lib.sh

BIN=${RICOCHET_BIN:-$PWD/build/ricochet}
OPENLOOP=${OPENLOOP_BIN:-$PWD/build/openloop}
DURATION=${FAULTS_DURATION:-4}
CONNS=${FAULTS_CONNECTIONS:-8}
THREADS=${FAULTS_THREADS:-1}
OPEN=${FAULTS_OPEN:-1}
OPEN_RATE=${FAULTS_OPEN_RATE:-1000}
ROUNDS=${FAULTS_ROUNDS:-1}
RATE=${FAULTS_RATE:-0.3}
BROWNOUT=${FAULTS_BROWNOUT:-1.25 2.75}
SLOW=${FAULTS_SLOW:-0.05 1000 5}
SCENARIOS=${FAULTS_SCENARIOS:-baseline random split brownout outage slow}
PROXIES=${FAULTS_PROXIES:-nginx haproxy ricochet ricochet-short ricochet-ratio ricochet-hedge}
SHORT_BACKOFF=${FAULTS_SHORT_BACKOFF:-10ms 100ms}
RATIO_BUDGET=${FAULTS_RATIO_BUDGET:-20% min=10/s}
HEDGE=${FAULTS_HEDGE:-auto}
ATTEMPTS=4 # every proxy: 4 attempts in total = 3 retries
TIMEOUT=30 # s: wrk's --timeout, openloop's -t

need_tools wrk nginx haproxy luajit curl awk pgrep
[ -x "$BIN" ] || die "$BIN is missing: run make first"
case "$OPEN" in
0) LOOPS=closed ;;
1) LOOPS="closed open"
   [ -x "$OPENLOOP" ] || die "$OPENLOOP is missing: make build/openloop (or FAULTS_OPEN=0)" ;;
*) die "FAULTS_OPEN is 0 or 1, not $OPEN" ;;
esac
set -f # the knobs are word lists, never patterns
# shellcheck disable=SC2086
set -- $BROWNOUT
[ $# -eq 2 ] || die "FAULTS_BROWNOUT wants two numbers: from and to (seconds)"
brown_from=$1 brown_to=$2
# shellcheck disable=SC2086
set -- $SLOW
[ $# -eq 3 ] || die "FAULTS_SLOW wants three numbers: the share of slow answers, their ms, the others' ms"
slow_share=$1 slow_ms=$2 fast_ms=$3
for s in $SCENARIOS; do
    case "$s" in baseline | random | split | brownout | outage | slow) ;; *) die "unknown scenario $s" ;; esac
done
for p in $PROXIES; do
    case "$p" in
    nginx | haproxy | ricochet | ricochet-short | ricochet-ratio | ricochet-hedge) ;;
    ricochet-budget) die "ricochet-budget is now ricochet-ratio (its retry_budget: FAULTS_RATIO_BUDGET)" ;;
    *) die "unknown proxy $p" ;;
    esac
done

bench_tmpdir

# The fault_server's arming query of a scenario.
fault_of() {
    case "$1" in
    baseline) echo "p=0" ;;
    random) echo "p=$RATE" ;;
    split) echo "p=$RATE&split=1" ;;
    brownout) echo "p=1&from=$brown_from&to=$brown_to" ;;
    outage) echo "p=1" ;;
    slow) echo "p=0&slow=$slow_share&slow_ms=$slow_ms&fast_ms=$fast_ms" ;;
    esac
}

# --- the upstream -------------------------------------------------------------
# shellcheck disable=SC2046
set -- $(free_ports 1) || die "cannot pick a free port (luajit with lua-socket is needed)"
uport=$1
luajit contrib/bench/fault_server.lua --port "$uport" > "$dir/upstream.out" 2> "$dir/upstream.err" &
pids="$pids $!"
upid=$!
wait_port upstream "$uport" "$upid"

# GETs a control path of the upstream; its answer goes to stdout.
ctl() { # path-and-query
    curl -sS -f -m 5 "http://127.0.0.1:$uport/__fault/$1" 2> "$dir/curl.err" ||
        die "upstream control $1 failed: $(cat "$dir/curl.err")"
}

# --- the proxies: configs ----------------------------------------------------
write_conf() { # proxy port rundir
    case "$1" in
    nginx)
        mkdir -p "$3/logs"
        # nginx retries only on the next server: the same one listed 4 times
        # (max_fails=0: never marked down) lets it make 4 attempts
        cat > "$3/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $3/nginx.pid;
error_log $3/logs/error.log error;
events { worker_connections 1024; }
http {
    access_log off;
    upstream backend {
        server 127.0.0.1:$uport max_fails=0;
        server 127.0.0.1:$uport max_fails=0;
        server 127.0.0.1:$uport max_fails=0;
        server 127.0.0.1:$uport max_fails=0;
        keepalive 64;
    }
    server {
        listen 127.0.0.1:$2;
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_next_upstream error timeout http_503;
            proxy_next_upstream_tries $ATTEMPTS;
        }
    }
}
CONF
        ;;
    haproxy)
        {
            haproxy_head
            cat <<CONF
    retries $((ATTEMPTS - 1))
    retry-on 503 conn-failure empty-response response-timeout
frontend fe
    bind 127.0.0.1:$2
    default_backend be
backend be
    server up1 127.0.0.1:$uport
CONF
        } > "$3/haproxy.cfg"
        ;;
    ricochet*)
        variant=""
        [ "$1" = ricochet-short ] && variant="retry_backoff $SHORT_BACKOFF;"
        [ "$1" = ricochet-ratio ] && variant="retry_budget $RATIO_BUDGET;"
        [ "$1" = ricochet-hedge ] && variant="retry_hedge $HEDGE;"
        cat > "$3/ricochet.conf" <<CONF
worker_processes 1;
error_log stderr error;
http {
    access_log off;
    retry_attempts $ATTEMPTS;
    $variant
    upstream backend { server 127.0.0.1:$uport; keepalive 64; }
    server { listen 127.0.0.1:$2; location / { proxy_pass http://backend; } }
}
CONF
        ;;
    esac
}

# Starts a proxy in $dir/$tag; sets ppid (the process started) and pport.
start_proxy() { # proxy tag
    # shellcheck disable=SC2046
    set -- "$1" "$2" $(free_ports 1) || die "cannot pick a free port"
    pport=$3
    rd=$dir/$2
    mkdir -p "$rd"
    write_conf "$1" "$pport" "$rd"
    case "$1" in
    nginx) nginx -p "$rd" -c "$rd/nginx.conf" 2> "$dir/$2.err" & ;;
    haproxy) haproxy -db -f "$rd/haproxy.cfg" > "$dir/$2.err" 2>&1 & ;;
    ricochet*) "$BIN" -p "$rd" -c "$rd/ricochet.conf" 2> "$dir/$2.err" & ;;
    esac
    ppid=$!
    pids="$pids $ppid"
    wait_port "$2" "$pport" "$ppid"
}

# The process doing the proxying: the single worker of nginx and ricochet,
# HAProxy's only process.
worker_of() { # proxy pid
    case "$1" in
    haproxy) echo "$2" ;;
    *) pgrep -P "$2" | head -n 1 ;;
    esac
}

# Both parsers write "requests ok all p50_ms p99_ms non2xx errors" to
# $dir/last: requests were sent, ok got a timely 2xx, all = ok + non2xx +
# errors, errors got no timely answer.

# wrk's report. "N requests in" counts every response, non-2xx and late
# (timed out) ones included; connect, read and write errors are requests
# without a response.
parse_wrk() {
    awk '
    /requests in/ { reqs = $1 }
    $1 == "50%" || $1 == "99%" {
        v = $2; u = v; sub(/^[0-9.]+/, "", u); sub(/[a-z]+$/, "", v)
        ms = (u == "us") ? v / 1000 : (u == "s") ? v * 1000 : (u == "m") ? v * 60000 : v
        if ($1 == "50%") p50 = ms; else p99 = ms
    }
    /Non-2xx or 3xx responses/ { non2xx = $NF }
    /Socket errors/ { gsub(/,/, ""); sock = $4 + $6 + $8; tmo = $10 }
    END {
        if (reqs == "" || p50 == "" || p99 == "") exit 1
        bad = non2xx + tmo
        if (bad > reqs) bad = reqs
        printf "%d %d %d %.2f %.2f %d %d\n", reqs, reqs - bad, reqs + sock, p50, p99, non2xx, sock + tmo
    }' "$dir/load.out" > "$dir/last"
}

# openloop's last line: "openloop: due=N sent=N refused=N done=N ok2xx=N ...".
# Every request due counts; refused ones (its connection limit), errors and
# timeouts are the errors.
parse_open() {
    awk '
    /^openloop: due=/ { for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }; n++ }
    END {
        if (!n || v["due"] == "" || v["p99_ms"] == "") exit 1
        printf "%d %d %d %.2f %.2f %d %d\n", v["sent"], v["ok2xx"], v["due"], v["p50_ms"], v["p99_ms"],
            v["non2xx"], v["errors"] + v["timeouts"] + v["refused"]
    }' "$dir/load.out" > "$dir/last"
}

# upstream stats "hits=N ok=N failed=N conns=N elapsed=S" -> "hits failed conns"
stats_of() {
    sed -n 's/^hits=\([0-9]*\) ok=[0-9]* failed=\([0-9]*\) conns=\([0-9]*\) .*/\1 \2 \3/p'
}

# One measured run: a fresh proxy, a sanity request, arm the fault, then wrk
# (closed loop) or openloop (open loop). Appends "scenario proxy loop requests
# ok all hits p50 p99 non2xx errors failed conns" to $dir/results (failed:
# upstream 503s; conns: upstream connections opened) and prints its row.
run_one() { # scenario proxy round loop
    tag="$1.$2.$3.$4"
    if [ "$2" = direct ]; then
        port=$uport
    else
        start_proxy "$2" "$tag"
        port=$pport
        ctl "arm?p=0" > /dev/null
        got=$(curl -sS -m 5 -w ' %{http_code}' "http://127.0.0.1:$port/sanity" 2> "$dir/curl.err") ||
            got="curl failed: $(cat "$dir/curl.err")"
        if [ "$got" != "ok
 200" ]; then
            echo "bench: sanity check failed: curl http://127.0.0.1:$port/sanity through $2" >&2
            echo "bench:   wanted \"ok\" and 200, got \"$got\"" >&2
            [ -s "$dir/$tag.err" ] && { echo "bench: $2's stderr:" >&2; cat "$dir/$tag.err" >&2; }
            exit 1
        fi
        worker=$(worker_of "$2" "$ppid")
        [ -n "$worker" ] || die "no worker process found for $2"
    fi
    url="http://127.0.0.1:$port/item"
    if [ "$4" = closed ]; then
        cmd="wrk -t$THREADS -c$CONNS -d${DURATION}s --timeout ${TIMEOUT}s --latency $url"
    else
        cmd="$OPENLOOP -r $OPEN_RATE -d $DURATION -t $TIMEOUT $url"
    fi
    ctl "arm?$(fault_of "$1")" > /dev/null
    # shellcheck disable=SC2086 # the command splits on purpose
    $cmd > "$dir/load.out" 2>&1 || die "$cmd failed: $(cat "$dir/load.out")"
    stats=$(ctl stats)
    cp "$dir/load.out" "$dir/$tag.out"
    if [ "$4" = closed ]; then
        parse_wrk || die "cannot read wrk output of $cmd: $(cat "$dir/load.out")"
    else
        parse_open || die "cannot read openloop output of $cmd: $(cat "$dir/load.out")"
    fi
    if [ "$2" != direct ]; then
        # a proxy that died or whose worker was replaced (a crash the master
        # repaired) invalidates the run
        now=$(worker_of "$2" "$ppid" || true)
        if ! kill -0 "$worker" 2>/dev/null || [ "$now" != "$worker" ]; then
            echo "bench: $2's worker $worker is gone (now: ${now:-none}) after: $cmd ($1)" >&2
            [ -s "$dir/$tag.err" ] && { echo "bench: $2's stderr:" >&2; cat "$dir/$tag.err" >&2; }
            [ -f "$dir/$tag/logs/error.log" ] && { echo "bench: $2's error log:" >&2; cat "$dir/$tag/logs/error.log" >&2; }
            exit 1
        fi
        stop_one "$ppid"
    fi
    read -r reqs ok all p50 p99 non2xx errs < "$dir/last"
    # shellcheck disable=SC2046
    set -- "$@" $(echo "$stats" | stats_of)
    [ $# -eq 7 ] || die "cannot read the upstream's stats: $stats"
    hits=$5 failed=$6 conns=$7
    echo "$1 $2 $4 $reqs $ok $all $hits $p50 $p99 $non2xx $errs $failed $conns" >> "$dir/results"
    awk -v s="$1" -v p="$2" -v r="$3" -v l="$4" -v reqs="$reqs" -v ok="$ok" -v all="$all" -v hits="$hits" \
        -v p50="$p50" -v p99="$p99" -v n2="$non2xx" -v e="$errs" -v d="$DURATION" -v c="$conns" 'BEGIN {
        printf "%-5s %-9s %-16s %-6s %8d %8.2f %9.2f %9.0f %9.2f %9.2f %8d %7d %7d\n", r, s, p, l, reqs,
            all ? 100 * ok / all : 0, reqs ? hits / reqs : 0, hits / d, p50, p99, n2, e, c
    }'
}

# This build's default of a ricochet directive ("default" when it cannot say).
default_of() { # directive
    v=$("$BIN" --directives 2>/dev/null | awk -F '\t' -v d="$1" '$1 == d { print $3; exit }') || v=""
    echo "${v:-default}"
}

echo "upstream: contrib/bench/fault_server.lua (LuaJIT, epoll, keep-alive), 200 \"ok\" or 503 without Retry-After"
echo "proxies: nginx $(nginx -v 2>&1 | sed 's|.*/||'), $(haproxy -v | awk 'NR == 1 {print "HAProxy " $3}'), ricochet $("$BIN" -v 2>&1 | awk 'NR == 1 {print $NF}'); one worker each, $ATTEMPTS attempts per request"
echo "  nginx: proxy_next_upstream error timeout http_503; proxy_next_upstream_tries $ATTEMPTS; the upstream listed $ATTEMPTS times"
echo "  haproxy: retries $((ATTEMPTS - 1)); retry-on 503 conn-failure empty-response response-timeout"
echo "  ricochet: retry_attempts $ATTEMPTS; the rest this build's defaults (retry_backoff $(default_of retry_backoff), retry_timeout $(default_of retry_timeout), retry_budget $(default_of retry_budget))"
echo "  ricochet-short: the same with retry_backoff $SHORT_BACKOFF; ricochet-ratio: the same with retry_budget $RATIO_BUDGET"
echo "  ricochet-hedge: the same with retry_hedge $HEDGE (nginx and HAProxy have no hedging)"
echo "scenarios: baseline (no faults), random ($RATE of upstream answers 503), split (random, each answer's head and body in two sends, Nagle on),"
echo "  brownout (all 503 from ${brown_from}s to ${brown_to}s), outage (all 503),"
echo "  slow ($slow_share of answers take ${slow_ms} ms, the rest ${fast_ms} ms; all 200)"
echo "each run: fresh proxy, freshly armed fault; $(nproc 2>/dev/null || echo '?') CPUs shared by the load generator, proxy and upstream"
echo "  closed loop: wrk -t$THREADS -c$CONNS -d${DURATION}s --timeout ${TIMEOUT}s --latency (each connection sends when its last answer is in)"
[ "$OPEN" = 1 ] &&
    echo "  open loop: openloop -r $OPEN_RATE -d $DURATION -t $TIMEOUT (a request due every 1/$OPEN_RATE s, whatever the answers take)"
echo
echo "success = timely 2xx / requests (closed: responses + socket errors; open: every request due);"
echo "attempts/req = upstream hits / requests sent (closed: the responses wrk completed); upstream/s = hits / ${DURATION}s;"
echo "p50, p99: closed from wrk (from sending), open from each request's due time to its last byte;"
echo "errors = requests without a timely answer (socket errors, timeouts, openloop's connection limit);"
echo "conns = upstream connections the proxy opened"
printf '%-5s %-9s %-16s %-6s %8s %8s %9s %9s %9s %9s %8s %7s %7s\n' round scenario proxy loop requests 'success%' attempts/req upstream/s 'p50 ms' 'p99 ms' non-2xx errors conns

: > "$dir/results"
round=1
while [ $round -le "$ROUNDS" ]; do
    for s in $SCENARIOS; do
        names=$PROXIES
        [ "$s" = baseline ] && names="direct $names"
        for name in $names; do
            for loop in $LOOPS; do
                run_one "$s" "$name" "$round" "$loop"
            done
        done
    done
    round=$((round + 1))
done

if [ "$ROUNDS" -gt 1 ]; then
    echo
    echo "summary over $ROUNDS rounds: success and attempts/req from the totals, p50 and p99 the medians of the rounds"
    awk -v d="$DURATION" '
    { k = $1 " " $2 " " $3; if (!(k in n)) order[++m] = k; n[k]++; reqs[k] += $4; ok[k] += $5; all[k] += $6
      hits[k] += $7; p50[k, n[k]] = $8; p99[k, n[k]] = $9; n2[k] += $10; e[k] += $11; c[k] += $13 }
    function median(p, k,    i, j, t, a, cnt) {
        cnt = n[k]
        for (i = 1; i <= cnt; i++) a[i] = p[k, i]
        for (i = 2; i <= cnt; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
        return (cnt % 2) ? a[(cnt + 1) / 2] : (a[cnt / 2] + a[cnt / 2 + 1]) / 2
    }
    END {
        printf "%-9s %-16s %-6s %8s %8s %9s %9s %9s %9s %8s %7s %7s\n", "scenario", "proxy", "loop", "requests", "success%", "attempts/req", "upstream/s", "p50 ms", "p99 ms", "non-2xx", "errors", "conns"
        for (i = 1; i <= m; i++) {
            k = order[i]; split(k, f, " ")
            printf "%-9s %-16s %-6s %8d %8.2f %9.2f %9.0f %9.2f %9.2f %8d %7d %7d\n", f[1], f[2], f[3], reqs[k] / n[k],
                all[k] ? 100 * ok[k] / all[k] : 0, reqs[k] ? hits[k] / reqs[k] : 0, hits[k] / (d * n[k]),
                median(p50, k), median(p99, k), n2[k], e[k], c[k] / n[k]
        }
    }' "$dir/results"
fi

# The baseline must be clean, in both loops: every proxy 100% and one attempt
# per request (in-flight requests when wrk stops may add a few hits;
# openloop waits for every answer). ricochet-hedge hedges what is slower than
# the upstream's p95 (never sooner than 1 ms): up to 10% more attempts there.
bad=$(awk '$1 == "baseline" && ($5 != $6 || $7 < $4 || $7 > $4 * ($2 == "ricochet-hedge" ? 1.10 : 1.01) + 25) { print $2 " (" $3 " loop)" }' "$dir/results")
if [ -n "$bad" ]; then
    echo
    echo "bench: the baseline (no faults) is not clean for: $bad (want 100% success and 1.00 attempts/request)" >&2
    exit 1
fi

set +f
for name in $PROXIES; do
    n=0
    for log in "$dir"/*."$name".*.err "$dir"/*."$name".*/logs/error.log; do
        [ -s "$log" ] || continue
        if [ $n = 0 ]; then
            echo
            echo "$name wrote to its error logs (at error level), the first 5 lines of each run's:"
        fi
        n=1
        echo "${log#"$dir"/}: $(wc -l < "$log") lines"
        head -n 5 "$log"
    done
done
