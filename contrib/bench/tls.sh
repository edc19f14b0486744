#!/bin/sh
# tls.sh: TLS on both sides of the proxy, nginx, HAProxy and ricochet, one
# worker each, rounds interleaved. Prints requests/s (mean of the rounds),
# the ratio to nginx, p99 (median of the rounds) and the proxy's CPU time per
# request for every scenario:
#
# - upstream TLS: wrk (plain HTTP) drives nginx `proxy_pass https://`,
#   HAProxy `server ... ssl` and ricochet `proxy_pass https://` in front of
#   one nginx that terminates TLS with a certificate from a CA made for the
#   run (verified by every proxy, sessions reused, upstream connections kept
#   alive).
# - terminate, ...: clients speak TLS to the proxy (`listen ... ssl`, the
#   same ECDSA P-256 certificate and key, TLSv1.2 and TLSv1.3, session
#   tickets and a session cache), which forwards plain HTTP to one nginx
#   (keep-alive to it). Three clients: wrk with keep-alive (many requests per
#   TLS connection); wrk with `Connection: close` (a new connection per
#   request, and wrk resumes its last session on each: TLS 1.3 resumed
#   handshakes); ab (a new connection per request, never resumed: full
#   handshakes). A probe shows what the server sees of each (nginx's
#   $ssl_session_reused).
#
# A proxy that cannot terminate TLS (ricochet before `listen ... ssl`) is
# shown as failed in the termination rows, and the script then exits 1.
#
# knobs: BENCH_DURATION (s per run, 5), BENCH_ROUNDS (3), BENCH_CONNECTIONS
# (50), BENCH_WARMUP (s, 1; 0 skips), RICOCHET_BIN (build/ricochet),
# BENCH_KEEP=1 (keep the temp dir). POSIX sh: it runs under dash.
set -eu
cd "$(dirname "$0")/../.."
BIN=${RICOCHET_BIN:-$PWD/build/ricochet}
DURATION=${BENCH_DURATION:-5}
ROUNDS=${BENCH_ROUNDS:-3}
CONNS=${BENCH_CONNECTIONS:-50}
WARMUP=${BENCH_WARMUP:-1}
ROWS="nginx haproxy ricochet"

# die, need_tools, bench_tmpdir, free_ports, port_open, wait_port, stop_one,
# wrk_figures, interleave_rounds, make_certs
. contrib/bench/lib.sh

need_tools wrk ab nginx haproxy openssl luajit curl awk pgrep
[ -x "$BIN" ] || die "$BIN is missing: run make first"
bench_tmpdir

# shellcheck disable=SC2046
set -- $(free_ports 9) || die "cannot pick free ports (luajit with lua-socket is needed)"
[ $# -eq 9 ] || die "cannot pick free ports"
# upstream (TLS), upstream (plain), the upstream-TLS proxies, the terminating
# proxies, and nginx's handshake probe
uport=$1 pport=$2 nport=$3 hport=$4 rport=$5 ntport=$6 htport=$7 rtport=$8 probeport=$9

mode=up # up | keepalive | resumed | full: what run_wrk runs
port_of() {
    case "$mode:$1" in
    up:nginx) echo "$nport" ;;
    up:haproxy) echo "$hport" ;;
    up:ricochet) echo "$rport" ;;
    *:nginx) echo "$ntport" ;;
    *:haproxy) echo "$htport" ;;
    *:ricochet) echo "$rtport" ;;
    esac
}

make_certs

# --- the upstream: nginx, a 1 KiB answer over TLS and over plain HTTP -------------
mkdir -p "$dir/upstream/logs" "$dir/nginx/logs" "$dir/nginx-term/logs" "$dir/ricochet" \
    "$dir/ricochet-term"
head -c 1024 /dev/zero | tr '\0' 'a' > "$dir/1k"
chmod 755 "$dir"
chmod 644 "$dir/1k" "$dir/leaf.key"
cat > "$dir/upstream/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $dir/upstream/nginx.pid;
error_log $dir/upstream/logs/error.log error;
events { worker_connections 1024; }
http {
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    ssl_session_cache shared:up:1m;
    root $dir;
    server {
        listen 127.0.0.1:$uport ssl;
        ssl_certificate $dir/leaf.pem;
        ssl_certificate_key $dir/leaf.key;
        location = /1k { }
        location / { return 404; }
    }
    server {
        listen 127.0.0.1:$pport;
        location = /1k { }
        location / { return 404; }
    }
}
CONF
nginx -p "$dir/upstream" -c "$dir/upstream/nginx.conf" 2> "$dir/upstream.err" &
pids="$pids $!"
wait_port upstream "$uport" $!
wait_port upstream "$pport" $!

# --- upstream TLS: the proxies, each verifying the upstream with the CA ------------
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
            proxy_pass https://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate $dir/ca.pem;
            proxy_ssl_name localhost;
            proxy_ssl_server_name on;
            proxy_ssl_session_reuse on;
        }
    }
}
CONF
nginx -p "$dir/nginx" -c "$dir/nginx/nginx.conf" 2> "$dir/nginx.err" &
npid=$!
pids="$pids $npid"
wait_port nginx "$nport" $npid

{
    haproxy_head
    cat <<CONF
frontend fe
    bind 127.0.0.1:$hport
    default_backend be
backend be
    server up1 127.0.0.1:$uport ssl verify required ca-file $dir/ca.pem sni str(localhost) verifyhost localhost
CONF
} > "$dir/haproxy.cfg"
haproxy -db -f "$dir/haproxy.cfg" > "$dir/haproxy.err" 2>&1 &
hpid=$!
pids="$pids $hpid"
wait_port haproxy "$hport" $hpid

cat > "$dir/ricochet/ricochet.conf" <<CONF
worker_processes 1;
error_log $dir/ricochet.log error;
http {
    access_log off;
    upstream backend { server 127.0.0.1:$uport; keepalive 64; }
    server {
        listen 127.0.0.1:$rport;
        location / {
            proxy_ssl_trusted_certificate $dir/ca.pem;
            proxy_ssl_name localhost;
            proxy_pass https://backend;
        }
    }
}
CONF
"$BIN" -p "$dir/ricochet" -c "$dir/ricochet/ricochet.conf" 2> "$dir/ricochet.err" &
rpid=$!
pids="$pids $rpid"
wait_port ricochet "$rport" $rpid

# sanity: each proxy returns the file's exact bytes
for row in $ROWS; do
    got=$(curl -s "http://127.0.0.1:$(port_of "$row")/1k" | wc -c)
    [ "$got" = 1024 ] || die "$row answered $got bytes, not 1024; logs: $(cat "$dir/$row.err" "$dir/$row.log" 2>/dev/null | head -5)"
done

ab_figures() { # file -> "REQUESTS_PER_S P99_MS ERRORS" from `ab` (p99 in whole ms)
    awk '
        /^Requests per second:/ { rps = $4 }
        /^Failed requests:/ { bad += $3 }
        /^Non-2xx responses:/ { bad += $3 }
        $1 == "99%" { p99 = $2 }
        END { printf "%s %.3f %d\n", rps, p99, bad }' "$1"
}

# The proxy's process (its master) for $mode, set as each starts.
pid_of() { # row
    case "$mode:$1" in
    up:nginx) echo "$npid" ;;
    up:haproxy) echo "$hpid" ;;
    up:ricochet) echo "$rpid" ;;
    *:nginx) echo "$ntpid" ;;
    *:haproxy) echo "$htpid" ;;
    *:ricochet) echo "$rtpid" ;;
    esac
}

# CPU time (user + system, in clock ticks) a process and its children (the
# workers) have used so far.
cpu_ticks() { # pid
    for p in "$1" $(pgrep -P "$1"); do
        # the fields after "(comm) ": utime and stime are the 12th and 13th
        sed 's/.*) //' "/proc/$p/stat" 2> /dev/null || true
    done | awk '{ t += $12 + $13 } END { print t + 0 }'
}
TICK=$(getconf CLK_TCK)

run_wrk() { # row seconds -> "rps p99_ms errors cpu_us_per_request", the client of $mode
    rw_url=https://127.0.0.1:$(port_of "$1")/1k
    rw_row=$1 rw_secs=$2
    rw_cpu=$(cpu_ticks "$(pid_of "$rw_row")")
    set --
    case "$mode" in
    up) rw_url=http://127.0.0.1:$(port_of "$rw_row")/1k ;;
    resumed) set -- -H "Connection: close" ;;
    esac
    if [ "$mode" = full ]; then
        # HTTP/1.0, a new connection per request, each with a new SSL object
        # that offers no session: full handshakes. -n after -t: -t alone
        # stops at 50000 requests.
        ab -r -q -c "$CONNS" -t "$rw_secs" -n 1000000 "$rw_url" > "$dir/ab.out" 2>&1 ||
            die "ab failed on $rw_row: $(tail -5 "$dir/ab.out")"
        rw_figures=$(ab_figures "$dir/ab.out")
    else
        wrk -t1 -c"$CONNS" -d"${rw_secs}s" --latency "$@" "$rw_url" > "$dir/wrk.out" 2>&1 ||
            die "wrk failed on $rw_row: $(cat "$dir/wrk.out")"
        rw_figures=$(wrk_figures "$dir/wrk.out")
    fi
    rw_cpu=$(($(cpu_ticks "$(pid_of "$rw_row")") - rw_cpu))
    echo "$rw_figures" | awk -v t="$rw_cpu" -v hz="$TICK" -v s="$rw_secs" \
        '{ printf "%s %s %s %.1f\n", $1, $2, $3, ($1 > 0 ? t / hz * 1e6 / ($1 * s) : 0) }'
}

# Runs the interleaved rounds of $mode over $ROWS; keeps them in $dir/all as
# "MODE ROUND ROW REQUESTS_PER_S P99_MS ERRORS CPU_US_PER_REQUEST".
run_mode() { # mode
    mode=$1
    echo "-- $mode"
    : > "$dir/results"
    interleave_rounds 0
    sed "s/^/$mode /" "$dir/results" >> "$dir/all"
}

run_mode up

# --- termination: TLS from the clients, plain HTTP to the upstream -----------------
# The upstream-TLS proxies go; each terminating proxy is a process of its own.
stop_one "$npid"
stop_one "$hpid"
stop_one "$rpid"
mode=keepalive

cat > "$dir/nginx-term/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $dir/nginx-term/nginx.pid;
error_log $dir/nginx-term/logs/error.log error;
events { worker_connections 1024; }
http {
    access_log off;
    ssl_certificate $dir/leaf.pem;
    ssl_certificate_key $dir/leaf.key;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_cache builtin;
    ssl_session_tickets on;
    upstream plain { server 127.0.0.1:$pport; keepalive 64; }
    server {
        listen 127.0.0.1:$ntport ssl;
        location / {
            proxy_pass http://plain;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
    }
    # the handshake probe: what the clients' new connections resume
    log_format handshake '\$ssl_protocol \$ssl_cipher \$ssl_session_reused';
    server {
        listen 127.0.0.1:$probeport ssl;
        access_log $dir/handshakes.log handshake;
        root $dir;
        location = /1k { }
    }
}
CONF
nginx -p "$dir/nginx-term" -c "$dir/nginx-term/nginx.conf" 2> "$dir/nginx-term.err" &
ntpid=$!
pids="$pids $ntpid"
wait_port nginx-term "$ntport" $ntpid

{
    haproxy_head
    cat <<CONF
frontend fe
    bind 127.0.0.1:$htport ssl crt $dir/combined.pem alpn http/1.1 ssl-min-ver TLSv1.2
    default_backend be
backend be
    server up1 127.0.0.1:$pport
CONF
} > "$dir/haproxy-term.cfg"
haproxy -db -f "$dir/haproxy-term.cfg" > "$dir/haproxy-term.err" 2>&1 &
htpid=$!
pids="$pids $htpid"
wait_port haproxy-term "$htport" $htpid

# ricochet's TLS defaults: TLSv1.2 and TLSv1.3, ALPN http/1.1, session
# tickets, a builtin session cache. keepalive 64 as for nginx: the default 32
# is below the 50 connections, and the pool would churn (one new upstream
# connection every 8-9 requests, for nginx and ricochet alike).
cat > "$dir/ricochet-term/ricochet.conf" <<CONF
worker_processes 1;
error_log $dir/ricochet-term.log error;
http {
    upstream plain { server 127.0.0.1:$pport; keepalive 64; }
    server {
        listen 127.0.0.1:$rtport ssl;
        ssl_certificate $dir/leaf.pem;
        ssl_certificate_key $dir/leaf.key;
        location / { proxy_pass http://plain; }
    }
}
CONF
"$BIN" -p "$dir/ricochet-term" -c "$dir/ricochet-term/ricochet.conf" 2> "$dir/ricochet-term.err" &
rtpid=$!
pids="$pids $rtpid"
# Not wait_port: a ricochet that cannot terminate TLS fails its rows, not the run.
failed=""
i=0
while :; do
    if ! kill -0 "$rtpid" 2> /dev/null; then
        failed="it exited at start: $(head -3 "$dir/ricochet-term.err" "$dir/ricochet-term.log" 2> /dev/null | grep -v '^==>' | grep . | head -3)"
        break
    fi
    port_open "$rtport" && break
    i=$((i + 1))
    [ $i -lt 100 ] || { failed="it did not open 127.0.0.1:$rtport"; break; }
    sleep 0.05
done

# sanity: each answers the file's exact bytes over TLS, with a certificate
# that verifies
term_rows=""
for row in $ROWS; do
    [ "$row" = ricochet ] && [ -n "$failed" ] && continue
    got=$(curl -s --cacert "$dir/ca.pem" "https://127.0.0.1:$(port_of "$row")/1k" | wc -c)
    if [ "$got" != 1024 ]; then
        why="$row answered $got bytes over TLS, not 1024; logs: $(cat "$dir/$row-term.err" "$dir/$row-term.log" 2>/dev/null | head -5)"
        [ "$row" = ricochet ] || die "$why"
        failed=$why
        continue
    fi
    term_rows="$term_rows $row"
done

# What each negotiates with OpenSSL's client (-alpn http/1.1), and whether it
# resumes the session it handed out: printed, and compared to nginx.
tls_facts() { # port -> "PROTOCOL CIPHER GROUP ALPN VERIFY RESUMED"
    rm -f "$dir/sess"
    for pass in new again; do
        if [ "$pass" = new ]; then sess="-sess_out $dir/sess"; else sess="-sess_in $dir/sess"; fi
        # shellcheck disable=SC2086 # two words
        printf 'GET /1k HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n' |
            timeout 10 openssl s_client -connect "127.0.0.1:$1" -servername localhost \
                -CAfile "$dir/ca.pem" -alpn http/1.1 $sess -ign_eof > "$dir/s_client.$pass" 2>&1 || true
    done
    awk '
        FILENAME ~ /new$/ && /^(New|Reused), / && !p { p = $2; c = $5; sub(/,$/, "", p) }
        FILENAME ~ /new$/ && /^Server Temp Key:/ && !g { g = $4; sub(/,$/, "", g) }
        FILENAME ~ /new$/ && /^ALPN protocol:/ { a = $3 }
        FILENAME ~ /new$/ && /^Verify return code:/ && v == "" { v = ($4 == 0 ? "verified" : "unverified") }
        FILENAME ~ /again$/ && /^Reused, / { r = "resumes" }
        END { printf "%s %s %s %s %s %s\n", p ? p : "-", c ? c : "-", g ? g : "-", a ? a : "no-ALPN", v ? v : "-", r ? r : "no-resumption" }
    ' "$dir/s_client.new" "$dir/s_client.again"
}
echo "-- what each terminating proxy negotiates (openssl s_client -alpn http/1.1)"
base=""
for row in $term_rows; do
    facts=$(tls_facts "$(port_of "$row")")
    # the protocol, cipher and group must be nginx's
    key=$(echo "$facts" | cut -d' ' -f1-3)
    other=""
    [ -n "$base" ] && [ "$key" != "$base" ] && other=" (nginx: $base)"
    [ -z "$base" ] && base=$key
    printf '%-9s %s%s\n' "$row" "$facts" "$other"
done

# The handshake probe: nginx logs $ssl_session_reused for each connection.
handshakes() { # -> "RESUMED of CONNECTIONS (PROTOCOL CIPHER)"
    awk '{ n++; if ($3 == "r") r++; if (!p) p = $1 " " $2 } END { printf "%d of %d (%s)", r, n, p }' "$dir/handshakes.log"
    : > "$dir/handshakes.log"
}
wrk -t1 -c4 -d1s -H "Connection: close" "https://127.0.0.1:$probeport/1k" > /dev/null 2>&1 ||
    die "wrk failed on the handshake probe"
probe_wrk=$(handshakes)
ab -r -q -c4 -t1 -n 1000000 "https://127.0.0.1:$probeport/1k" > /dev/null 2>&1 ||
    die "ab failed on the handshake probe"
probe_ab=$(handshakes)
echo "-- handshakes nginx saw resumed: wrk -H 'Connection: close' $probe_wrk, ab $probe_ab"

ROWS=$term_rows
run_mode keepalive
run_mode resumed
run_mode full

# --- the table -------------------------------------------------------------------
echo
echo "TLS: 1 KiB, $CONNS connections, ${DURATION}s x $ROUNDS rounds, 1 worker each; requests/s: the mean of the rounds, p99: the median"
awk -v failed="$failed" '
    { k = $1 " " $3; n[k]++; rps[k] += $4; p99[k] = p99[k] " " $5; err[k] += $6; cpu[k] += $7 }
    END {
        split("up keepalive resumed full", modes, " ")
        name["up"] = "upstream TLS (verified, pooled)"
        name["keepalive"] = "terminate, keep-alive"
        name["resumed"] = "terminate, new connections, resumed"
        name["full"] = "terminate, new connections, full"
        split("nginx haproxy ricochet", order, " ")
        printf "%-36s %-9s %11s %9s %8s %7s %9s\n", "scenario", "proxy", "requests/s", "vs nginx", "p99 ms", "errors", "CPU us/r"
        for (j = 1; j <= 4; j++) {
            mo = modes[j]
            base = rps[mo " nginx"] / n[mo " nginx"]
            for (i = 1; i <= 3; i++) {
                k = mo " " order[i]
                if (!n[k]) { printf "%-36s %-9s %11s\n", name[mo], order[i], "FAILED"; continue }
                m = split(p99[k], v, " ")
                # the median p99 of the rounds
                for (a = 1; a <= m; a++) for (b = a + 1; b <= m; b++) if (v[b] + 0 < v[a] + 0) { t = v[a]; v[a] = v[b]; v[b] = t }
                printf "%-36s %-9s %11.0f %8.2fx %8.2f %7d %9.1f\n", name[mo], order[i], rps[k] / n[k], rps[k] / n[k] / base, v[int((m + 1) / 2)], err[k], cpu[k] / n[k]
            }
        }
    }' "$dir/all"
echo "CPU us/r: the proxy's CPU time (all its processes) per request, the mean of the rounds"
echo "resumed: wrk -H 'Connection: close', which offers each new connection the session of its last one (nginx saw $probe_wrk resumed)"
echo "full: ab, a full handshake per request (nginx saw $probe_ab resumed); its p99 is in whole ms"
for log in "$dir/ricochet.log" "$dir/ricochet-term.log"; do
    if [ -s "$log" ]; then
        echo "ricochet's $(basename "$log"): $(wc -l < "$log") lines, the first:"
        head -3 "$log"
    fi
done
if [ -n "$failed" ]; then
    echo "bench: ricochet cannot terminate TLS: $failed" >&2
    exit 1
fi
