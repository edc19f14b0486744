#!/bin/sh
# idempotency.sh: what the idempotency store costs. wrk sends keyed POSTs (a
# new Idempotency-Key on every request, so each one is claimed, forwarded and
# its answer stored) through ricochet (one worker) with no store, with the
# LMDB store (idempotency_sync off, then on) and with the Redis store, all in
# front of one nginx upstream; rounds are interleaved so every row sees the
# same machine. Prints requests/s (the median of the rounds), the ratio to
# "no store" and the p99 latency, then checks that a repeated key is replayed.
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
ROWS=${BENCH_ROWS:-"none lmdb lmdb-sync redis"}

# die, need_tools, bench_tmpdir, free_ports, wait_port, wrk_figures, interleave_rounds
. contrib/bench/lib.sh

need_tools wrk nginx redis-server luajit curl awk
[ -x "$BIN" ] || die "$BIN is missing: run make first"
bench_tmpdir

# shellcheck disable=SC2046
set -- $(free_ports 6) || die "cannot pick free ports (luajit with lua-socket is needed)"
[ $# -eq 6 ] || die "cannot pick free ports"
uport=$1 redis_port=$2 p_none=$3 p_lmdb=$4 p_sync=$5 p_redis=$6

port_of() {
    case "$1" in
    none) echo "$p_none" ;;
    lmdb) echo "$p_lmdb" ;;
    lmdb-sync) echo "$p_sync" ;;
    redis) echo "$p_redis" ;;
    esac
}

store_of() {
    case "$1" in
    none) echo "off" ;;
    lmdb | lmdb-sync) echo "lmdb:$dir/$1.mdb" ;;
    redis) echo "redis://127.0.0.1:$redis_port" ;;
    esac
}

# --- the upstream: nginx, one worker, a small JSON answer to POST /pay ---------
mkdir -p "$dir/upstream/logs"
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
    client_body_buffer_size 16k;
    server {
        listen 127.0.0.1:$uport;
        location = /pay { default_type application/json; return 201 '{"id":"ch_1","status":"paid"}\n'; }
        location / { return 404; }
    }
}
CONF
nginx -p "$dir/upstream" -c "$dir/upstream/nginx.conf" 2> "$dir/upstream.err" &
pids="$pids $!"
wait_port upstream "$uport" $!

# --- Redis: private, nothing saved ----------------------------------------------
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
    --daemonize no > "$dir/redis.err" 2>&1 &
pids="$pids $!"
wait_port redis "$redis_port" $!

# --- one ricochet per row ---------------------------------------------------------
for row in $ROWS; do
    mkdir -p "$dir/$row"
    sync_line=""
    [ "$row" = lmdb-sync ] && sync_line="idempotency_sync on;"
    cat > "$dir/$row/ricochet.conf" <<CONF
worker_processes 1;
error_log $dir/$row.log warn;
http {
    access_log off;
    upstream backend { server 127.0.0.1:$uport; keepalive 64; }
    server {
        listen 127.0.0.1:$(port_of "$row");
        idempotency_store $(store_of "$row");
        $sync_line
        location / { proxy_pass http://backend; }
    }
}
CONF
    "$BIN" -p "$dir/$row" -c "$dir/$row/ricochet.conf" 2> "$dir/$row.err" &
    pids="$pids $!"
    wait_port "$row" "$(port_of "$row")" $!
done

# --- wrk: a new key per request ---------------------------------------------------
cat > "$dir/keyed.lua" <<'LUA'
-- every request a new Idempotency-Key: thread id, a random run tag, a counter
-- (wrk does not seed math.random: a table's address differs in every run)
math.randomseed(os.time() + tonumber(tostring({}):match("0x(%x+)"), 16))
local n, tag = 0, tostring(math.random(1, 1e9)) .. "-" .. tostring(os.time())
function request()
    n = n + 1
    return wrk.format("POST", "/pay", { ["Content-Type"] = "application/json",
        ["Idempotency-Key"] = tag .. "-" .. n }, '{"amount":1000,"currency":"eur"}')
end
LUA

# sanity: each row answers, and a store row replays a repeated key
for row in $ROWS; do
    port=$(port_of "$row")
    first=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Idempotency-Key: bench-check' \
        -d '{}' "http://127.0.0.1:$port/pay")
    [ "$first" = 201 ] || die "$row: POST /pay answered $first, not 201; log: $(cat "$dir/$row.log" 2>/dev/null)"
    again=$(curl -s -D - -o /dev/null -X POST -H 'Idempotency-Key: bench-check' -d '{}' \
        "http://127.0.0.1:$port/pay" | tr -d '\r' | grep -i '^Idempotent-Replayed: true' || true)
    if [ "$row" = none ]; then
        [ -z "$again" ] || die "none: replayed without a store"
    else
        [ -n "$again" ] || die "$row: a repeated key was not replayed; log: $(cat "$dir/$row.log" 2>/dev/null)"
    fi
done

run_wrk() { # row seconds -> "rps p99_ms"
    wrk -t1 -c"$CONNS" -d"${2}s" --latency -s "$dir/keyed.lua" "http://127.0.0.1:$(port_of "$1")/pay" \
        > "$dir/wrk.out" 2>&1 || die "wrk failed on $1: $(cat "$dir/wrk.out")"
    wrk_figures "$dir/wrk.out"
}

interleave_rounds 1 > /dev/null

median() { # row column (of $dir/results: round row rps p99 errors)
    awk -v r="$1" -v c="$2" '$2 == r { print $c }' "$dir/results" | sort -n |
        awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

base=$(median none 3)
echo
echo "keyed POSTs, a new key each: $CONNS connections, ${DURATION}s x $ROUNDS rounds (median), 1 worker"
printf '%-12s %12s %10s %10s\n' store "requests/s" "vs none" "p99 ms"
for row in $ROWS; do
    rps=$(median "$row" 3)
    p99=$(median "$row" 4)
    printf '%-12s %12.0f %9.2fx %10.2f\n' "$row" "$rps" "$(echo "$rps $base" | awk '{ print $1 / $2 }')" "$p99"
done
