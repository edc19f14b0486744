#!/bin/sh
# run.sh: wrk against ricochet and nginx, one worker each, on loopback; prints a table.
# Today ricochet answers every request itself (404: no proxying yet), so this
# measures the client side: accept, parse, answer, keep-alive. nginx does the
# same with `return 404`. Runs are interleaved so that both see the same machine.
set -eu
cd "$(dirname "$0")/../.."
BIN=${RICOCHET_BIN:-$PWD/build/ricochet}
DURATION=${BENCH_DURATION:-5}
ROUNDS=${BENCH_ROUNDS:-3}
CONNS=${BENCH_CONNECTIONS:-50}
THREADS=${BENCH_THREADS:-1}
dir=$(mktemp -d /tmp/ricochet-bench.XXXXXX)
pids=""
cleanup() {
    for p in $pids; do kill "$p" 2>/dev/null || true; done
    sleep 0.2
    rm -rf "$dir"
}
trap cleanup EXIT INT TERM

free_port() {
    luajit -e 'local s=require("socket").bind("127.0.0.1",0); local _,p=s:getsockname(); print(p); s:close()'
}

wait_port() {
    i=0
    while [ $i -lt 100 ]; do
        if luajit -e "local s=require('socket').connect('127.0.0.1',$1); os.exit(s and 0 or 1)" 2>/dev/null; then
            return 0
        fi
        sleep 0.05
        i=$((i + 1))
    done
    echo "port $1 did not open" >&2
    exit 1
}

rport=$(free_port)
nport=$(free_port)

cat > "$dir/ricochet.conf" <<CONF
worker_processes 1;
error_log stderr error;
http {
    server { listen 127.0.0.1:$rport; location / {} }
}
CONF
"$BIN" -p "$dir" -c "$dir/ricochet.conf" 2> "$dir/ricochet.err" &
pids="$pids $!"

mkdir -p "$dir/nginx/logs"
cat > "$dir/nginx/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $dir/nginx/nginx.pid;
error_log $dir/nginx/logs/error.log error;
events { worker_connections 1024; }
http {
    access_log off;
    keepalive_requests 1000;
    server { listen 127.0.0.1:$nport; location / { return 404 "404 Not Found\n"; } }
}
CONF
nginx -p "$dir/nginx" -c "$dir/nginx/nginx.conf" 2> "$dir/nginx.err" &
pids="$pids $!"
wait_port "$rport"
wait_port "$nport"

# wrk prints "Requests/sec: N" and, with --latency, "99% Xms"
run_wrk() { # port -> "rps p99"
    out=$(wrk -t"$THREADS" -c"$CONNS" -d"${DURATION}s" --latency "http://127.0.0.1:$1/" 2>&1)
    rps=$(echo "$out" | awk '/Requests\/sec/ {print $2}')
    p99=$(echo "$out" | awk '$1 == "99%" {print $2}')
    echo "$rps $p99"
}

echo "wrk -t$THREADS -c$CONNS -d${DURATION}s, $ROUNDS interleaved rounds, one worker each"
r_sum=0; n_sum=0
printf '%-6s %-10s %12s %10s\n' round server 'requests/s' p99
round=1
while [ $round -le "$ROUNDS" ]; do
    set -- $(run_wrk "$nport"); n=$1; np=$2
    set -- $(run_wrk "$rport"); r=$1; rp=$2
    printf '%-6s %-10s %12s %10s\n' "$round" nginx "$n" "$np"
    printf '%-6s %-10s %12s %10s\n' "$round" ricochet "$r" "$rp"
    r_sum=$(echo "$r_sum + $r" | bc -l); n_sum=$(echo "$n_sum + $n" | bc -l)
    round=$((round + 1))
done
printf 'mean: nginx %.0f req/s, ricochet %.0f req/s, ratio ricochet/nginx %.2f\n' \
    "$(echo "$n_sum / $ROUNDS" | bc -l)" "$(echo "$r_sum / $ROUNDS" | bc -l)" \
    "$(echo "$r_sum / $n_sum" | bc -l)"
