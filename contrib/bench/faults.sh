#!/bin/sh
# faults.sh: the retry benchmark. wrk drives three reverse proxies, one worker
# each, all making at most 4 attempts per request (3 retries), in front of the
# same fault-injecting upstream (contrib/bench/fault_server.lua), through four
# scenarios: no faults (the sanity baseline), 30% random 503s, a brownout
# (every answer 503 from 1.25 s to 2.75 s of a 4 s run) and a full outage.
# For each proxy it reports the client's success rate (2xx among all answers,
# socket errors included), the upstream attempts per client request (the
# upstream's hit count / requests wrk completed), the upstream's load and the
# p99 latency. Every run gets freshly started proxies (ricochet's retry budget
# and pools start empty), so runs do not leak into each other.
#
# knobs: FAULTS_DURATION (s per run, 4), FAULTS_CONNECTIONS (20),
# FAULTS_THREADS (1), FAULTS_ROUNDS (1; more adds a summary over rounds),
# FAULTS_RATE (failure probability of the random scenario, 0.3),
# FAULTS_BROWNOUT ("1.25 2.75": from and to, seconds into the run),
# FAULTS_SCENARIOS ("baseline random brownout outage"), FAULTS_PROXIES
# ("nginx haproxy ricochet ricochet-short ricochet-budget"),
# FAULTS_SHORT_BACKOFF (the retry_backoff of ricochet-short, "10ms 100ms"),
# FAULTS_BUDGET (the retry_budget of ricochet-budget, "50% min=10/s"), RICOCHET_BIN
# (build/ricochet), BENCH_KEEP=1 (keep the temp dir: configs, logs, wrk output).
# POSIX sh: it runs under dash.
set -eu
cd "$(dirname "$0")/../.."
# die, need_tools, bench_tmpdir, stop_one, free_ports, wait_port
. contrib/bench/lib.sh

BIN=${RICOCHET_BIN:-$PWD/build/ricochet}
DURATION=${FAULTS_DURATION:-4}
CONNS=${FAULTS_CONNECTIONS:-20}
THREADS=${FAULTS_THREADS:-1}
ROUNDS=${FAULTS_ROUNDS:-1}
RATE=${FAULTS_RATE:-0.3}
BROWNOUT=${FAULTS_BROWNOUT:-1.25 2.75}
SCENARIOS=${FAULTS_SCENARIOS:-baseline random brownout outage}
PROXIES=${FAULTS_PROXIES:-nginx haproxy ricochet ricochet-short ricochet-budget}
SHORT_BACKOFF=${FAULTS_SHORT_BACKOFF:-10ms 100ms}
BUDGET=${FAULTS_BUDGET:-50% min=10/s}
ATTEMPTS=4 # every proxy: 4 attempts in total = 3 retries

need_tools wrk nginx haproxy luajit curl awk pgrep
[ -x "$BIN" ] || die "$BIN is missing: run make first"
set -f # the knobs are word lists, never patterns
# shellcheck disable=SC2086
set -- $BROWNOUT
[ $# -eq 2 ] || die "FAULTS_BROWNOUT wants two numbers: from and to (seconds)"
brown_from=$1 brown_to=$2
for s in $SCENARIOS; do
    case "$s" in baseline | random | brownout | outage) ;; *) die "unknown scenario $s" ;; esac
done
for p in $PROXIES; do
    case "$p" in nginx | haproxy | ricochet | ricochet-short | ricochet-budget) ;; *) die "unknown proxy $p" ;; esac
done

bench_tmpdir

# The fault_server's arming query of a scenario.
fault_of() {
    case "$1" in
    baseline) echo "p=0" ;;
    random) echo "p=$RATE" ;;
    brownout) echo "p=1&from=$brown_from&to=$brown_to" ;;
    outage) echo "p=1" ;;
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
        cat > "$3/haproxy.cfg" <<CONF
global
    nbthread 1
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 75s
    http-reuse always
    retries $((ATTEMPTS - 1))
    retry-on 503 conn-failure empty-response response-timeout
frontend fe
    bind 127.0.0.1:$2
    default_backend be
backend be
    server up1 127.0.0.1:$uport
CONF
        ;;
    ricochet*)
        variant=""
        [ "$1" = ricochet-short ] && variant="retry_backoff $SHORT_BACKOFF;"
        [ "$1" = ricochet-budget ] && variant="retry_budget $BUDGET;"
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

# wrk's report -> "requests non2xx sockerr timeouts p99_ms" in $dir/last.
# "N requests in" counts every response, non-2xx and late (timed out) ones
# included; connect, read and write errors are requests without a response.
parse_wrk() {
    awk '
    /requests in/ { reqs = $1 }
    $1 == "99%" {
        v = $2; u = v; sub(/^[0-9.]+/, "", u); sub(/[a-z]+$/, "", v)
        p99 = (u == "us") ? v / 1000 : (u == "s") ? v * 1000 : (u == "m") ? v * 60000 : v
    }
    /Non-2xx or 3xx responses/ { non2xx = $NF }
    /Socket errors/ { gsub(/,/, ""); sock = $4 + $6 + $8; tmo = $10 }
    END {
        if (reqs == "" || p99 == "") exit 1
        printf "%d %d %d %d %.2f\n", reqs, non2xx, sock, tmo, p99
    }' "$dir/wrk.out" > "$dir/last"
}

# upstream stats "hits=N ok=N failed=N conns=N elapsed=S" -> "hits failed conns"
stats_of() {
    sed -n 's/^hits=\([0-9]*\) ok=[0-9]* failed=\([0-9]*\) conns=\([0-9]*\) .*/\1 \2 \3/p'
}

# One measured run: fresh proxy, a sanity request, arm the fault, wrk.
# Appends "scenario proxy requests ok all hits p99 non2xx sockerr failed conns"
# to $dir/results (failed: upstream 503s; conns: upstream connections opened).
run_one() { # scenario proxy round
    tag="$1.$2.$3"
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
    cmd="wrk -t$THREADS -c$CONNS -d${DURATION}s --timeout 30s --latency http://127.0.0.1:$port/item"
    ctl "arm?$(fault_of "$1")" > /dev/null
    # shellcheck disable=SC2086 # the command splits on purpose
    $cmd > "$dir/wrk.out" 2>&1 || die "$cmd failed: $(cat "$dir/wrk.out")"
    stats=$(ctl stats)
    cp "$dir/wrk.out" "$dir/$tag.wrk"
    parse_wrk || die "cannot read wrk output of $cmd: $(cat "$dir/wrk.out")"
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
    read -r reqs non2xx sock tmo p99 < "$dir/last"
    # shellcheck disable=SC2046
    set -- "$@" $(echo "$stats" | stats_of)
    [ $# -eq 6 ] || die "cannot read the upstream's stats: $stats"
    hits=$4 failed=$5 conns=$6
    # failures: non-2xx answers, late answers (both among the requests) and
    # requests that got no answer at all
    bad=$((non2xx + tmo))
    [ $bad -gt "$reqs" ] && bad=$reqs
    all=$((reqs + sock))
    ok=$((reqs - bad))
    echo "$1 $2 $reqs $ok $all $hits $p99 $non2xx $sock $failed $conns" >> "$dir/results"
    awk -v s="$1" -v p="$2" -v r="$3" -v reqs="$reqs" -v ok="$ok" -v all="$all" -v hits="$hits" \
        -v p99="$p99" -v n2="$non2xx" -v se="$sock" -v d="$DURATION" -v c="$conns" 'BEGIN {
        printf "%-5s %-9s %-16s %8d %8.2f %9.2f %9.0f %10.2f %8d %7d %7d\n", r, s, p, reqs,
            all ? 100 * ok / all : 0, reqs ? hits / reqs : 0, hits / d, p99, n2, se, c
    }'
}

echo "upstream: contrib/bench/fault_server.lua (LuaJIT, epoll, keep-alive), 200 \"ok\" or 503 without Retry-After"
echo "proxies: nginx $(nginx -v 2>&1 | sed 's|.*/||'), $(haproxy -v | awk 'NR == 1 {print "HAProxy " $3}'), ricochet $("$BIN" -v 2>&1 | awk 'NR == 1 {print $NF}'); one worker each, $ATTEMPTS attempts per request"
echo "  nginx: proxy_next_upstream error timeout http_503; proxy_next_upstream_tries $ATTEMPTS; the upstream listed $ATTEMPTS times"
echo "  haproxy: retries $((ATTEMPTS - 1)); retry-on 503 conn-failure empty-response response-timeout"
echo "  ricochet: retry_attempts $ATTEMPTS; the rest default (retry_backoff 250ms 5s 2 jitter=full, retry_timeout 30s, retry_budget 20% min=10/s)"
echo "  ricochet-short: the same with retry_backoff $SHORT_BACKOFF; ricochet-budget: the same with retry_budget $BUDGET"
echo "scenarios: baseline (no faults), random ($RATE of upstream answers 503), brownout (all 503 from ${brown_from}s to ${brown_to}s), outage (all 503)"
echo "each run: fresh proxy; wrk -t$THREADS -c$CONNS -d${DURATION}s --timeout 30s --latency; $(nproc 2>/dev/null || echo '?') CPUs shared by wrk, proxy and upstream"
echo
echo "success = 2xx / (responses + socket errors); attempts/req = upstream hits / responses; upstream/s = hits / ${DURATION}s;"
echo "conns = upstream connections the proxy opened"
printf '%-5s %-9s %-16s %8s %8s %9s %9s %10s %8s %7s %7s\n' round scenario proxy requests 'success%' attempts/req upstream/s 'p99 ms' non-2xx sockerr conns

: > "$dir/results"
round=1
while [ $round -le "$ROUNDS" ]; do
    for s in $SCENARIOS; do
        names=$PROXIES
        [ "$s" = baseline ] && names="direct $names"
        for name in $names; do
            run_one "$s" "$name" "$round"
        done
    done
    round=$((round + 1))
done

if [ "$ROUNDS" -gt 1 ]; then
    echo
    echo "summary over $ROUNDS rounds: success and attempts/req from the totals, p99 the median of the rounds"
    awk -v d="$DURATION" -v rounds="$ROUNDS" '
    { k = $1 " " $2; if (!(k in n)) order[++m] = k; n[k]++; reqs[k] += $3; ok[k] += $4; all[k] += $5; hits[k] += $6
      p[k, n[k]] = $7; n2[k] += $8; se[k] += $9; c[k] += $11 }
    function median(k,    i, j, t, a, c) {
        c = n[k]
        for (i = 1; i <= c; i++) a[i] = p[k, i]
        for (i = 2; i <= c; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
        return (c % 2) ? a[(c + 1) / 2] : (a[c / 2] + a[c / 2 + 1]) / 2
    }
    END {
        printf "%-9s %-16s %8s %8s %9s %9s %10s %8s %7s %7s\n", "scenario", "proxy", "requests", "success%", "attempts/req", "upstream/s", "p99 ms", "non-2xx", "sockerr", "conns"
        for (i = 1; i <= m; i++) {
            k = order[i]; split(k, f, " ")
            printf "%-9s %-16s %8d %8.2f %9.2f %9.0f %10.2f %8d %7d %7d\n", f[1], f[2], reqs[k] / n[k],
                100 * ok[k] / all[k], hits[k] / reqs[k], hits[k] / (d * n[k]), median(k), n2[k], se[k], c[k] / n[k]
        }
    }' "$dir/results"
fi

# The baseline must be clean: every proxy 100% and one attempt per request
# (in-flight requests when wrk stops may add a few hits).
bad=$(awk '$1 == "baseline" && ($4 != $5 || $6 < $3 || $6 > $3 * 1.01 + 25) { print $2 }' "$dir/results")
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
