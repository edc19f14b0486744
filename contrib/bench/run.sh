#!/bin/sh
# run.sh: the proxy benchmark. wrk drives three reverse proxies, one worker
# each, all in front of the same upstream (an nginx serving a 1 KiB and a
# 64 KiB file): nginx `proxy_pass`, HAProxy in http mode, and ricochet. Rounds
# are interleaved so every proxy sees the same machine; prints a table of
# requests/s, p99 and the proxy worker's CPU time a request (its run time from
# /proc/PID/schedstat over the run, over the requests wrk completed), each
# also as a ratio to nginx's. The scenarios: 1k and 64k with keep-alive,
# 1k-close and 64k-close (`Connection: close`: a new client connection a
# request), tls-1k and tls-64k (keep-alive over TLS the proxy terminates: the
# same ECDSA P-256 certificate, TLSv1.2 and 1.3, plain HTTP to the upstream).
#
# knobs: BENCH_SCENARIOS (the list above, in that order), BENCH_DURATION (s per run, 5), BENCH_ROUNDS (3), BENCH_CONNECTIONS
# (50), BENCH_THREADS (1), BENCH_WARMUP (s per proxy and size, 1; 0 skips),
# BENCH_STRACE=1 (after the table, for each scenario, count each proxy worker's system calls per
# request with `strace -c` during a BENCH_STRACE_DURATION (3) s wrk run),
# BENCH_PIN=1 (wrk on CPU 0; the upstream and the proxies on CPU 1, so the
# proxy's CPU cost per request decides; it did not reduce the spread here),
# RICOCHET_BIN (build/ricochet), BENCH_KEEP=1 (keep the temp dir and its logs),
# RICOCHET_BASELINE=PATH (a second ricochet build, "ricochet0", in the same
# interleaved rounds: an A/B of two builds in one run), BENCH_SCRIPTS (1; 0
# skips the route-script rows: at 1k only, "ricochet+script" is ricochet's
# config plus a route script and "nginx+lua" nginx's plus lua-nginx-module
# blocks doing the same work; every run then sends X-Request-Id: abc).
# POSIX sh: it runs under dash.
set -eu
cd "$(dirname "$0")/../.."
BIN=${RICOCHET_BIN:-$PWD/build/ricochet}
DURATION=${BENCH_DURATION:-5}
ROUNDS=${BENCH_ROUNDS:-3}
CONNS=${BENCH_CONNECTIONS:-50}
THREADS=${BENCH_THREADS:-1}
WARMUP=${BENCH_WARMUP:-1}
STRACE=${BENCH_STRACE:-0}
STRACE_DURATION=${BENCH_STRACE_DURATION:-3}
PIN=${BENCH_PIN:-0}
BASELINE=${RICOCHET_BASELINE:-}
SCRIPTS=${BENCH_SCRIPTS:-1}
PROXIES="nginx haproxy ricochet"
[ -n "$BASELINE" ] && PROXIES="$PROXIES ricochet0"
SIZES="1k 64k"
SCENARIOS=${BENCH_SCENARIOS:-1k 64k 1k-close 64k-close tls-1k tls-64k}
# The script rows run at 1k only, each next to the row it adds to.
SCRIPT_SIZE=1k
SCRIPT_PROXIES="nginx nginx+lua haproxy ricochet ricochet+script"
[ -n "$BASELINE" ] && SCRIPT_PROXIES="$SCRIPT_PROXIES ricochet0"
# Sent by every wrk run and every check when the script rows are on, so a
# script row differs from its plain row by the script alone.
HEADER="X-Request-Id: abc"
# Debian's lua-nginx-module (libnginx-mod-http-lua) and the NDK it needs first
NGX_NDK=/usr/lib/nginx/modules/ndk_http_module.so
NGX_LUA=/usr/lib/nginx/modules/ngx_http_lua_module.so
ALL=$PROXIES
[ "$SCRIPTS" = 1 ] && ALL=$SCRIPT_PROXIES

# The proxies run in a scenario: the script rows at SCRIPT_SIZE with keep-alive only.
proxies_at() { # scenario
    if [ "$SCRIPTS" = 1 ] && [ "$1" = "$SCRIPT_SIZE" ]; then echo "$SCRIPT_PROXIES"; else echo "$PROXIES"; fi
}

# A scenario's file: 1k or 64k.
size_of() { # scenario
    case "$1" in *1k*) echo 1k ;; *64k*) echo 64k ;; *) die "unknown scenario $1" ;; esac
}

# die, need_tools, bench_tmpdir, free_ports, wait_port
. contrib/bench/lib.sh

need_tools wrk nginx haproxy luajit curl awk openssl
[ -x "$BIN" ] || die "$BIN is missing: run make first"
[ -z "$BASELINE" ] || [ -x "$BASELINE" ] || die "RICOCHET_BASELINE=$BASELINE is not an executable"
if [ "$SCRIPTS" = 1 ]; then
    { [ -f "$NGX_NDK" ] && [ -f "$NGX_LUA" ]; } ||
        die "$NGX_LUA or $NGX_NDK is missing (contrib/deps.sh bench installs libnginx-mod-http-lua; BENCH_SCRIPTS=0 skips the script rows)"
fi
SRV_PIN="" WRK_PIN=""
if [ "$PIN" = 1 ]; then
    command -v taskset >/dev/null 2>&1 || die "BENCH_PIN=1 needs taskset (util-linux)"
    SRV_PIN="taskset -c 1" WRK_PIN="taskset -c 0"
fi

bench_tmpdir
make_certs

# Eleven distinct free ports: all bound at once, then released.
# shellcheck disable=SC2046
set -- $(free_ports 11) || die "cannot pick free ports (luajit with lua-socket is needed)"
[ $# -eq 11 ] || die "cannot pick free ports"
uport=$1 nport=$2 hport=$3 rport=$4 bport=$5 nlport=$6 rsport=$7
ntport=$8 htport=$9 rtport=${10} btport=${11} # the TLS-terminating listeners

port_of() {
    case "$1" in
    upstream) echo "$uport" ;;
    nginx) echo "$nport" ;;
    haproxy) echo "$hport" ;;
    ricochet) echo "$rport" ;;
    ricochet0) echo "$bport" ;;
    nginx+lua) echo "$nlport" ;;
    ricochet+script) echo "$rsport" ;;
    esac
}

tls_port_of() {
    case "$1" in
    nginx) echo "$ntport" ;;
    haproxy) echo "$htport" ;;
    ricochet) echo "$rtport" ;;
    ricochet0) echo "$btport" ;;
    esac
}

# The URL a proxy is driven at in a scenario.
url_of() { # name scenario
    case "$2" in
    tls-*) echo "https://127.0.0.1:$(tls_port_of "$1")/$(size_of "$2")" ;;
    *) echo "http://127.0.0.1:$(port_of "$1")/$(size_of "$2")" ;;
    esac
}

bytes_of() {
    case "$1" in
    1k) echo 1024 ;;
    64k) echo 65536 ;;
    esac
}

# --- the upstream: nginx, one worker, two fixed-size static files ------------
mkdir -p "$dir/www" "$dir/upstream/logs" "$dir/nginx/logs"
# nginx started as root serves the files as its unprivileged worker user
chmod 755 "$dir" "$dir/www"
head -c 1024 /dev/zero | tr '\0' 'a' > "$dir/www/1k"
head -c 65536 /dev/zero | tr '\0' 'b' > "$dir/www/64k"
chmod 644 "$dir/www/1k" "$dir/www/64k"

cat > "$dir/upstream/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $dir/upstream/nginx.pid;
error_log $dir/upstream/logs/error.log error;
events { worker_connections 1024; }
http {
    access_log off;
    default_type application/octet-stream;
    sendfile on;
    tcp_nopush on;
    open_file_cache max=16 inactive=1h;
    open_file_cache_valid 1h;
    etag off;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    server {
        listen 127.0.0.1:$uport;
        root $dir/www;
        location = /1k { }
        location = /64k { }
        # the checks: the idempotency key the proxy sent, echoed back
        location = /key { add_header X-Seen-Key "\$http_idempotency_key"; return 200 "key\\n"; }
        location / { return 404; }
    }
}
CONF
$SRV_PIN nginx -p "$dir/upstream" -c "$dir/upstream/nginx.conf" 2> "$dir/upstream.err" &
pids="$pids $!"
upid=$!

# --- proxy 1: nginx proxy_pass with a keep-alive upstream pool ---------------
cat > "$dir/nginx/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $dir/nginx/nginx.pid;
error_log $dir/nginx/logs/error.log error;
events { worker_connections 1024; }
http {
    access_log off;
    upstream backend { server 127.0.0.1:$uport; keepalive 64; }
    server {
        listen 127.0.0.1:$nport;
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
    # the TLS listener (the tls-* scenarios)
    server {
        listen 127.0.0.1:$ntport ssl;
        ssl_certificate $dir/leaf.pem;
        ssl_certificate_key $dir/leaf.key;
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_session_cache builtin;
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
}
CONF
$SRV_PIN nginx -p "$dir/nginx" -c "$dir/nginx/nginx.conf" 2> "$dir/nginx.err" &
pids="$pids $!"
npid=$!

# --- proxy 1+lua: the same nginx, plus lua-nginx-module doing the script's work
if [ "$SCRIPTS" = 1 ]; then
    mkdir -p "$dir/nginx+lua/logs"
    { echo "load_module $NGX_NDK;"; echo "load_module $NGX_LUA;"; } > "$dir/nginx+lua/nginx.conf"
    # on_request: the header read, the key set; classify: the status compared
    sed -e '/# the TLS listener/,/^    }$/d' \
        -e "s|$dir/nginx/|$dir/nginx+lua/|g" -e "s/127.0.0.1:$nport;/127.0.0.1:$nlport;/" \
        -e '/proxy_pass http:\/\/backend;/i\
            access_by_lua_block {\
                local id = ngx.var.http_x_request_id or "none"\
                ngx.req.set_header("Idempotency-Key", "k-" .. id)\
            }\
            header_filter_by_lua_block {\
                if ngx.status == 503 then ngx.ctx.retry = true end\
            }' "$dir/nginx/nginx.conf" >> "$dir/nginx+lua/nginx.conf"
    # the lua module needs lua-resty-core and will not start without it: check first
    nginx -t -p "$dir/nginx+lua" -c "$dir/nginx+lua/nginx.conf" > "$dir/nginx+lua.t" 2>&1 ||
        die "nginx+lua: nginx -t failed (lua-resty-core is needed): $(cat "$dir/nginx+lua.t")"
    $SRV_PIN nginx -p "$dir/nginx+lua" -c "$dir/nginx+lua/nginx.conf" 2> "$dir/nginx+lua.err" &
    pids="$pids $!"
    nlpid=$!
fi

# --- proxy 2: HAProxy, one thread, server connections reused -----------------
{
    haproxy_head
    cat <<CONF
frontend fe
    bind 127.0.0.1:$hport
    default_backend be
frontend fe_tls
    bind 127.0.0.1:$htport ssl crt $dir/combined.pem alpn http/1.1 ssl-min-ver TLSv1.2
    default_backend be
backend be
    server up1 127.0.0.1:$uport
CONF
} > "$dir/haproxy.cfg"
$SRV_PIN haproxy -db -f "$dir/haproxy.cfg" > "$dir/haproxy.err" 2>&1 &
pids="$pids $!"
hpid=$!

# --- proxy 3: ricochet --------------------------------------------------------
cat > "$dir/ricochet.conf" <<CONF
worker_processes 1;
error_log stderr error;
http {
    access_log off;
    upstream backend { server 127.0.0.1:$uport; keepalive 64; }
    server { listen 127.0.0.1:$rport; location / { proxy_pass http://backend; } }
    server { listen 127.0.0.1:$rtport ssl; ssl_certificate $dir/leaf.pem; ssl_certificate_key $dir/leaf.key; location / { proxy_pass http://backend; } }
}
CONF
$SRV_PIN "$BIN" -p "$dir" -c "$dir/ricochet.conf" 2> "$dir/ricochet.err" &
pids="$pids $!"
rpid=$!

if [ -n "$BASELINE" ]; then
    mkdir -p "$dir/base"
    sed -e "s/127.0.0.1:$rport;/127.0.0.1:$bport;/" -e "s/127.0.0.1:$rtport ssl;/127.0.0.1:$btport ssl;/" \
        "$dir/ricochet.conf" > "$dir/base/ricochet.conf"
    $SRV_PIN "$BASELINE" -p "$dir/base" -c "$dir/base/ricochet.conf" 2> "$dir/ricochet0.err" &
    pids="$pids $!"
    bpid=$!
fi

# --- proxy 3+script: the same ricochet, plus a route script in the location ---
if [ "$SCRIPTS" = 1 ]; then
    mkdir -p "$dir/script"
    cat > "$dir/script/route.lua" <<'LUA'
local route = {}
function route.on_request(req)
    local id = req:header("X-Request-Id") or "none"
    req:set_idempotency_key("k-" .. id)
end
function route.classify(res, attempt)
    if res and res.status == 503 then return "retry" end
end
return route
LUA
    sed -e "/127.0.0.1:$rtport ssl;/d" -e "s/127.0.0.1:$rport;/127.0.0.1:$rsport;/" \
        -e 's|location / { proxy_pass|location / { script route.lua; proxy_pass|' \
        "$dir/ricochet.conf" > "$dir/script/ricochet.conf"
    grep -q 'script route.lua;' "$dir/script/ricochet.conf" || die "cannot add the script to ricochet's config"
    $SRV_PIN "$BIN" -p "$dir/script" -c "$dir/script/ricochet.conf" 2> "$dir/ricochet+script.err" &
    pids="$pids $!"
    rspid=$!
fi

wait_port upstream "$uport" "$upid"
wait_port nginx "$nport" "$npid"
wait_port haproxy "$hport" "$hpid"
wait_port ricochet "$rport" "$rpid"
[ -z "$BASELINE" ] || wait_port ricochet0 "$bport" "$bpid"
if [ "$SCRIPTS" = 1 ]; then
    wait_port nginx+lua "$nlport" "$nlpid"
    wait_port ricochet+script "$rsport" "$rspid"
fi

# The process doing the proxying: the single worker of nginx and ricochet,
# HAProxy's only process.
worker_of() {
    case "$1" in
    nginx) pgrep -P "$npid" | head -n 1 ;;
    haproxy) echo "$hpid" ;;
    ricochet) pgrep -P "$rpid" | head -n 1 ;;
    ricochet0) pgrep -P "$bpid" | head -n 1 ;;
    nginx+lua) pgrep -P "$nlpid" | head -n 1 ;;
    ricochet+script) pgrep -P "$rspid" | head -n 1 ;;
    esac
}

# curl with the benchmark's request header (when the script rows are on)
hcurl() {
    if [ "$SCRIPTS" = 1 ]; then curl -H "$HEADER" "$@"; else curl "$@"; fi
}

# --- sanity: one request per proxy and scenario: 200 and the exact body ---
for scenario in $SCENARIOS; do
    size=$(size_of "$scenario")
    for name in upstream $(proxies_at "$scenario"); do
        case "$name:$scenario" in
        upstream:*) url="http://127.0.0.1:$uport/$size" ;;
        *) url=$(url_of "$name" "$scenario") ;;
        esac
        want=$(bytes_of "$size")
        got=$(hcurl -sS -m 5 --cacert "$dir/ca.pem" -o "$dir/body" -w '%{http_code} %{size_download}' "$url" 2> "$dir/curl.err") ||
            got="curl failed: $(cat "$dir/curl.err")"
        if [ "$got" != "200 $want" ] || ! cmp -s "$dir/body" "$dir/www/$size"; then
            echo "bench: sanity check failed: curl $url" >&2
            echo "bench:   wanted \"200 $want\" and the file's bytes, got \"$got\"" >&2
            [ -s "$dir/$name.err" ] && { echo "bench: $name's stderr:" >&2; cat "$dir/$name.err" >&2; }
            [ -f "$dir/$name/logs/error.log" ] && { echo "bench: $name's error log:" >&2; cat "$dir/$name/logs/error.log" >&2; }
            exit 1
        fi
    done
done

# --- sanity: the key reaches the upstream through both script rows ----------
# (the upstream echoes the Idempotency-Key it got in X-Seen-Key; "-": none),
# and only through them
if [ "$SCRIPTS" = 1 ]; then
    for name in nginx nginx+lua ricochet ricochet+script; do
        case "$name" in *+*) want="200 k-abc" ;; *) want="200 -" ;; esac
        url="http://127.0.0.1:$(port_of "$name")/key"
        got=$(hcurl -sS -m 5 -D - -o /dev/null "$url" 2> "$dir/curl.err" | tr -d '\r' |
            awk 'BEGIN { k = "-" } NR == 1 { s = $2 } tolower($1) == "x-seen-key:" { k = $2 } END { print s, k }') ||
            got="curl failed: $(cat "$dir/curl.err")"
        if [ "$got" != "$want" ]; then
            echo "bench: sanity check failed: curl -H '$HEADER' $url" >&2
            echo "bench:   wanted \"$want\" (status, the X-Seen-Key echoed by the upstream), got \"$got\"" >&2
            [ -s "$dir/$name.err" ] && { echo "bench: $name's stderr:" >&2; cat "$dir/$name.err" >&2; }
            [ -f "$dir/$name/logs/error.log" ] && { echo "bench: $name's error log:" >&2; cat "$dir/$name/logs/error.log" >&2; }
            exit 1
        fi
        case "$name" in *+*) echo "check: $name sends the upstream Idempotency-Key: k-abc" ;; esac
    done
fi

workers=""
for name in $ALL; do
    w=$(worker_of "$name")
    [ -n "$w" ] || die "no worker process found for $name"
    workers="$workers $name=$w"
done

# A proxy that died or whose worker was replaced (a crash the master repaired)
# invalidates the run.
check_alive() { # name
    for kv in $workers; do
        [ "${kv%%=*}" = "$1" ] || continue
        w=${kv#*=}
        now=$(worker_of "$1" || true)
        if ! kill -0 "$w" 2>/dev/null || [ "$now" != "$w" ]; then
            echo "bench: $1's worker $w is gone (now: ${now:-none}) after: $2" >&2
            [ -s "$dir/$1.err" ] && { echo "bench: $1's stderr:" >&2; cat "$dir/$1.err" >&2; }
            [ -f "$dir/$1/logs/error.log" ] && { echo "bench: $1's error log:" >&2; cat "$dir/$1/logs/error.log" >&2; }
            exit 1
        fi
    done
}

# wrk prints "Requests/sec: N", with --latency "99% X{us,ms,s}", and on
# trouble "Non-2xx or 3xx responses: N" and "Socket errors: connect N, ...".
# -> "rps p99_ms errors cpu_us" in $dir/last (not via $(...): a failure must end the script)
# wrk_run NAME SCENARIO SECONDS: runs wrk into $dir/wrk.out; $cmd is its command line
wrk_run() {
    url=$(url_of "$1" "$2")
    cmd="wrk -t$THREADS -c$CONNS -d${3}s --latency"
    case "$2" in *-close) close=1 ;; *) close=0 ;; esac
    set -- "-t$THREADS" "-c$CONNS" "-d${3}s" --latency
    if [ "$SCRIPTS" = 1 ]; then
        set -- "$@" -H "$HEADER"
        cmd="$cmd -H \"$HEADER\""
    fi
    if [ "$close" = 1 ]; then
        set -- "$@" -H "Connection: close"
        cmd="$cmd -H \"Connection: close\""
    fi
    cmd="$cmd $url"
    # shellcheck disable=SC2086 # the pinning prefix splits on purpose
    $WRK_PIN wrk "$@" "$url" > "$dir/wrk.out" 2>&1
}

# A process's time on a CPU so far, in ns (the first field of its schedstat).
run_ns() { # pid
    awk '{ print $1 }' "/proc/$1/schedstat"
}

run_wrk() { # name scenario seconds
    rw_pid=$(worker_of "$1")
    rw_ns=$(run_ns "$rw_pid")
    wrk_run "$@" || die "$cmd failed: $(cat "$dir/wrk.out")"
    rw_ns=$(($(run_ns "$rw_pid") - rw_ns))
    check_alive "$1" "$cmd"
    awk -v ns="$rw_ns" '
    /requests in/ { reqs = $1 }
    /Requests\/sec/ { rps = $2 }
    $1 == "99%" {
        v = $2; u = v; sub(/^[0-9.]+/, "", u); sub(/[a-z]+$/, "", v)
        p99 = (u == "us") ? v / 1000 : (u == "s") ? v * 1000 : (u == "m") ? v * 60000 : v
    }
    /Non-2xx or 3xx responses/ { err += $NF }
    /Socket errors/ { gsub(/,/, ""); err += $4 + $6 + $8 + $10 }
    END {
        if (rps == "" || p99 == "" || reqs + 0 == 0) exit 1
        printf "%s %.3f %d %.2f\n", rps, p99, err, ns / 1000 / reqs
    }' "$dir/wrk.out" > "$dir/last" || die "cannot read wrk output of $cmd: $(cat "$dir/wrk.out")"
}

echo "upstream: nginx $(nginx -v 2>&1 | sed 's|.*/||'), 1 worker, static /1k (1024 B) and /64k (65536 B)"
echo "proxies: nginx proxy_pass, $(haproxy -v | awk 'NR == 1 {print "HAProxy " $3}'), ricochet $("$BIN" -v 2>&1 | awk 'NR == 1 {print $NF}'); one worker each"
echo "scenarios: $SCENARIOS (*-close: -H 'Connection: close'; tls-*: https to the proxy's TLS listener)"
if [ "$SCRIPTS" = 1 ]; then
    echo "each run: wrk -t$THREADS -c$CONNS -d${DURATION}s --latency -H '$HEADER' http://127.0.0.1:PORT/{1k,64k}"
    echo "at $SCRIPT_SIZE also nginx+lua (lua-nginx-module $(dpkg-query -W -f='${Version}' libnginx-mod-http-lua 2>/dev/null | sed 's/^[0-9]*://; s/-[^-]*$//')) and ricochet+script: the same configs plus the same work in Lua"
else
    echo "each run: wrk -t$THREADS -c$CONNS -d${DURATION}s --latency http://127.0.0.1:PORT/{1k,64k}"
fi
if [ "$PIN" = 1 ]; then
    echo "$ROUNDS interleaved rounds ($ALL); wrk pinned to CPU 0, upstream and proxies to CPU 1"
else
    echo "$ROUNDS interleaved rounds ($ALL), $(nproc 2>/dev/null || echo '?') CPUs shared by wrk, proxy and upstream"
fi
echo

if [ "$WARMUP" != 0 ]; then
    for scenario in $SCENARIOS; do
        for name in $(proxies_at "$scenario"); do
            run_wrk "$name" "$scenario" "$WARMUP"
        done
    done
fi

: > "$dir/results"
printf '%-6s %-9s %-15s %12s %10s %7s %8s\n' round scenario proxy 'requests/s' 'p99 ms' errors 'cpu us'
round=1
while [ $round -le "$ROUNDS" ]; do
    for scenario in $SCENARIOS; do
        for name in $(proxies_at "$scenario"); do
            run_wrk "$name" "$scenario" "$DURATION"
            read -r rps p99 errs cpu < "$dir/last"
            printf '%-6s %-9s %-15s %12s %10s %7s %8s\n' "$round" "$scenario" "$name" "$rps" "$p99" "$errs" "$cpu"
            echo "$scenario $name $rps $p99 $errs $round $cpu" >> "$dir/results"
        done
    done
    round=$((round + 1))
done

echo
echo "summary: requests/s mean over $ROUNDS rounds, p99 median over rounds; cpu: the proxy worker's CPU time a"
echo "request, mean over rounds; each ratio is to nginx's in the same scenario"
awk -v sizes="$SCENARIOS" -v proxies="$ALL" -v scripts="$SCRIPTS" -v ssize="$SCRIPT_SIZE" '
{ k = $1 " " $2; n[k]++; sum[k] += $3; p[k, n[k]] = $4; err[k] += $5; r[k, $6] = $3; cpu[k] += $7; if ($6 > rounds) rounds = $6 }
# the mean requests/s of a script row over its plain row, and the same per round
function ratio(a, b,    ka, kb, i, line) {
    ka = ssize " " a; kb = ssize " " b
    if (!n[ka] || !n[kb]) return
    line = ""
    for (i = 1; i <= rounds; i++) if ((ka, i) in r && (kb, i) in r) line = line sprintf(" %.3f", r[ka, i] / r[kb, i])
    printf "%s %-26s %6.3f   (by round:%s)\n", ssize, a " / " b, (sum[ka] / n[ka]) / (sum[kb] / n[kb]), line
}
function median(k,    i, j, t, a, m) {
    m = n[k]
    for (i = 1; i <= m; i++) a[i] = p[k, i]
    for (i = 2; i <= m; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
}
END {
    printf "%-9s %-15s %12s %10s %9s %8s %9s %7s\n", "scenario", "proxy", "requests/s", "p99 ms", "vs nginx", "cpu us", "vs nginx", "errors"
    ns = split(sizes, S, " "); np = split(proxies, P, " ")
    for (i = 1; i <= ns; i++) {
        base = sum[S[i] " nginx"] / n[S[i] " nginx"]
        cbase = cpu[S[i] " nginx"] / n[S[i] " nginx"]
        for (j = 1; j <= np; j++) {
            k = S[i] " " P[j]
            if (!n[k]) continue
            mean = sum[k] / n[k]
            printf "%-9s %-15s %12.0f %10.2f %9.2f %8.2f %9.2f %7d\n", S[i], P[j], mean, median(k), mean / base,
                cpu[k] / n[k], (cpu[k] / n[k]) / cbase, err[k]
        }
    }
    if (scripts == 1) {
        print ""
        print "the cost of the same work in Lua: mean requests/s with it / without it"
        ratio("ricochet+script", "ricochet")
        ratio("nginx+lua", "nginx")
    }
}' "$dir/results"

for name in $ALL; do check_alive "$name" "the last run"; done
for name in $ALL; do
    for log in "$dir/$name.err" "$dir/$name/logs/error.log"; do
        [ -s "$log" ] || continue
        echo
        echo "$name logged $(wc -l < "$log") lines at error level (${log#"$dir"/}); the first 5:"
        head -n 5 "$log"
    done
done

# --- optional: system calls per request --------------------------------------
if [ "$STRACE" = 1 ]; then
    command -v strace >/dev/null 2>&1 || die "strace is missing"
    echo
    echo "system calls per request: strace -c -f -p WORKER during wrk -t$THREADS -c$CONNS -d${STRACE_DURATION}s (slowed by strace)"
    for scenario in $SCENARIOS; do
        for name in $(proxies_at "$scenario"); do
            w=$(worker_of "$name")
            strace -c -f -p "$w" -o "$dir/strace.out" 2> "$dir/strace.err" &
            spid=$!
            sleep 0.5
            wrk_run "$name" "$scenario" "$STRACE_DURATION" || true
            kill -INT "$spid" 2>/dev/null || true
            wait "$spid" || true
            check_alive "$name" "$cmd under strace"
            reqs=$(awk '/requests in/ {print $1}' "$dir/wrk.out")
            [ "${reqs:-0}" -gt 0 ] || die "no requests in $cmd under strace: $(cat "$dir/wrk.out")"
            # strace -c: "% time seconds usecs/call calls [errors] syscall", then a "total" line
            awk -v name="$name" -v scenario="$scenario" -v reqs="$reqs" '
            $1 ~ /^[0-9.]+$/ && $NF != "total" && NF >= 5 {
                c[$NF] = $4; e[$NF] = (NF == 6) ? $5 : 0; order[++m] = $NF; total += $4
            }
            END {
                line = ""
                for (i = 1; i <= m; i++) {
                    k = order[i]
                    if (c[k] / reqs < 0.01) continue
                    line = line sprintf(" %s %.2f", k, c[k] / reqs)
                    if (e[k] / reqs >= 0.01) line = line sprintf(" (%.2f failed)", e[k] / reqs)
                    line = line ","
                }
                sub(/,$/, "", line)
                printf "%-9s %-15s %7d requests %5.2f calls/request:%s\n", scenario, name, reqs, total / reqs, line
            }' "$dir/strace.out"
        done
    done
fi
