#!/bin/sh
# tls.sh: TLS to the upstream, pooled. wrk (plain HTTP) drives nginx
# `proxy_pass https://`, HAProxy `server ... ssl` and ricochet `proxy_pass
# https://`, one worker each, all in front of one nginx that terminates TLS
# with a certificate from a CA made for the run (verified by every proxy,
# sessions reused, upstream connections kept alive); rounds are
# interleaved. Prints requests/s (mean of the rounds), the ratio to nginx
# and p99. The termination rows (listen ... ssl) come with the downstream
# half of TLS.
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

# die, need_tools, bench_tmpdir, free_ports, wait_port, wrk_figures, interleave_rounds
. contrib/bench/lib.sh

need_tools wrk nginx haproxy openssl luajit curl awk
[ -x "$BIN" ] || die "$BIN is missing: run make first"
bench_tmpdir

# shellcheck disable=SC2046
set -- $(free_ports 4) || die "cannot pick free ports (luajit with lua-socket is needed)"
[ $# -eq 4 ] || die "cannot pick free ports"
uport=$1 nport=$2 hport=$3 rport=$4

port_of() {
    case "$1" in
    nginx) echo "$nport" ;;
    haproxy) echo "$hport" ;;
    ricochet) echo "$rport" ;;
    esac
}

# --- a CA and the upstream's certificate (localhost, 127.0.0.1) ---------------
(
    cd "$dir"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key \
        -out ca.pem -days 1 -subj "/CN=bench CA" 2> /dev/null
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout leaf.key \
        -out leaf.csr -subj "/CN=localhost" 2> /dev/null
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > ext.cnf
    openssl x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out leaf.pem \
        -days 1 -extfile ext.cnf 2> /dev/null
) || die "openssl could not make the certificates"

# --- the upstream: nginx terminating TLS, a 1 KiB answer -------------------------
mkdir -p "$dir/upstream/logs" "$dir/nginx/logs" "$dir/ricochet"
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
    server {
        listen 127.0.0.1:$uport ssl;
        ssl_certificate $dir/leaf.pem;
        ssl_certificate_key $dir/leaf.key;
        root $dir;
        location = /1k { }
        location / { return 404; }
    }
}
CONF
nginx -p "$dir/upstream" -c "$dir/upstream/nginx.conf" 2> "$dir/upstream.err" &
pids="$pids $!"
wait_port upstream "$uport" $!

# --- the proxies, each verifying the upstream with the CA --------------------------
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
pids="$pids $!"
wait_port nginx "$nport" $!

cat > "$dir/haproxy.cfg" <<CONF
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
frontend fe
    bind 127.0.0.1:$hport
    default_backend be
backend be
    server up1 127.0.0.1:$uport ssl verify required ca-file $dir/ca.pem sni str(localhost) verifyhost localhost
CONF
haproxy -db -f "$dir/haproxy.cfg" > "$dir/haproxy.err" 2>&1 &
pids="$pids $!"
wait_port haproxy "$hport" $!

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
pids="$pids $!"
wait_port ricochet "$rport" $!

# sanity: each proxy returns the file's exact bytes
for row in $ROWS; do
    got=$(curl -s "http://127.0.0.1:$(port_of "$row")/1k" | wc -c)
    [ "$got" = 1024 ] || die "$row answered $got bytes, not 1024; logs: $(cat "$dir/$row.err" "$dir/$row.log" 2>/dev/null | head -5)"
done

run_wrk() { # row seconds -> "rps p99_ms errors"
    wrk -t1 -c"$CONNS" -d"${2}s" --latency "http://127.0.0.1:$(port_of "$1")/1k" \
        > "$dir/wrk.out" 2>&1 || die "wrk failed on $1: $(cat "$dir/wrk.out")"
    wrk_figures "$dir/wrk.out"
}

interleave_rounds 0

echo
echo "TLS to the upstream (verified, pooled): 1 KiB, $CONNS connections, ${DURATION}s x $ROUNDS rounds, 1 worker"
awk '
    { n[$2]++; rps[$2] += $3; p99[$2] = p99[$2] " " $4; err[$2] += $5 }
    END {
        printf "%-10s %12s %10s %10s %8s\n", "proxy", "requests/s", "vs nginx", "p99 ms", "errors"
        split("nginx haproxy ricochet", order, " ")
        base = rps["nginx"] / n["nginx"]
        for (i = 1; i <= 3; i++) {
            r = order[i]
            m = split(p99[r], v, " ")
            # the median p99 of the rounds
            for (a = 1; a <= m; a++) for (b = a + 1; b <= m; b++) if (v[b] + 0 < v[a] + 0) { t = v[a]; v[a] = v[b]; v[b] = t }
            printf "%-10s %12.0f %9.2fx %10.2f %8d\n", r, rps[r] / n[r], rps[r] / n[r] / base, v[int((m + 1) / 2)], err[r]
        }
    }' "$dir/results"
