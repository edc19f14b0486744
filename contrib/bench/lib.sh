# lib.sh: helpers shared by the benchmarks in contrib/bench/.
# Sourced, not run; POSIX sh. Uses and sets the callers' globals: `dir` (the
# temp dir) and `pids` (every process to end at exit).

die() {
    echo "bench: $*" >&2
    exit 1
}

need_tools() { # tool...
    for tool in "$@"; do
        command -v "$tool" >/dev/null 2>&1 || die "$tool is missing (contrib/deps.sh bench installs it)"
    done
}

# Ends the processes in $pids: TERM, up to 3 s of grace, then KILL.
stop_pids() { # pid...
    for p in "$@"; do kill "$p" 2>/dev/null || true; done
    # give masters their grace, then make sure nothing is left
    i=0
    while [ $i -lt 30 ]; do
        alive=""
        for p in "$@"; do kill -0 "$p" 2>/dev/null && alive="$alive $p"; done
        [ -z "$alive" ] && break
        sleep 0.1
        i=$((i + 1))
    done
    for p in "$@"; do kill -9 "$p" 2>/dev/null || true; done
}

# Ends one process started earlier and forgets it.
stop_one() { # pid
    stop_pids "$1"
    wait "$1" 2>/dev/null || true
    rest=""
    for p in $pids; do [ "$p" = "$1" ] || rest="$rest $p"; done
    pids=$rest
}

# Makes the temp dir (in $dir) and arranges for it and every process in
# $pids to go at exit, also on ^C and TERM.
bench_tmpdir() {
    dir=$(mktemp -d /tmp/ricochet-bench.XXXXXX)
    pids=""
    trap bench_cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}

bench_cleanup() {
    trap - EXIT INT TERM
    # shellcheck disable=SC2086 # one pid per word
    stop_pids $pids
    if [ "${BENCH_KEEP:-0}" = 1 ]; then
        echo "bench: logs kept in $dir" >&2
    else
        rm -rf "$dir"
    fi
}

# A CA and a certificate for localhost and 127.0.0.1 (ECDSA P-256) in $dir:
# ca.pem, leaf.pem and leaf.key (readable by nginx's worker user), and
# combined.pem (HAProxy's crt: the certificate, then its key).
make_certs() {
    (
        cd "$dir"
        openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key \
            -out ca.pem -days 1 -subj "/CN=bench CA" 2> /dev/null
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout leaf.key \
            -out leaf.csr -subj "/CN=localhost" 2> /dev/null
        printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > ext.cnf
        openssl x509 -req -in leaf.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out leaf.pem \
            -days 1 -extfile ext.cnf 2> /dev/null
        cat leaf.pem leaf.key > combined.pem
        chmod 644 leaf.key
    ) || die "openssl could not make the certificates"
}

# Prints N distinct free ports on 127.0.0.1: all bound at once, then released.
free_ports() { # n
    luajit -e '
local socket = require("socket")
local s = {}
for i = 1, '"$1"' do
    s[i] = assert(socket.bind("127.0.0.1", 0))
    local _, p = s[i]:getsockname()
    io.write(p, " ")
end
for i = 1, '"$1"' do s[i]:close() end
'
}

# Whether something accepts connections on 127.0.0.1:PORT.
port_open() { # port
    luajit -e "local s=require('socket').connect('127.0.0.1',$1); os.exit(s and 0 or 1)" 2>/dev/null
}

wait_port() { # name port pid
    i=0
    while [ $i -lt 100 ]; do
        kill -0 "$3" 2>/dev/null || die "$1 exited at start; its log: $(cat "$dir/$1.err" 2>/dev/null)"
        port_open "$2" && return 0
        sleep 0.05
        i=$((i + 1))
    done
    die "$1 did not open 127.0.0.1:$2; its log: $(cat "$dir/$1.err" 2>/dev/null)"
}

# Reads a `wrk --latency` output file; prints "REQUESTS_PER_S P99_MS ERRORS"
# (errors: non-2xx answers plus socket errors).
# HAProxy's global and defaults sections, as every benchmark runs it: one
# thread, server connections reused; the caller's sections follow.
haproxy_head() {
    cat <<'CONF'
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
CONF
}

wrk_figures() { # file
    awk '
        /Requests\/sec:/ { rps = $2 }
        $1 == "99%" { v = $2; ms = v + 0
            if (v ~ /us$/) ms = ms / 1000; else if (v ~ /ms$/) ms = ms; else if (v ~ /s$/) ms = ms * 1000
            p99 = ms }
        /Non-2xx/ { bad += $4 }
        /Socket errors/ { bad += 1 }
        END { printf "%s %.3f %d\n", rps, p99, bad }' "$1"
}

# The warm-up (WARMUP seconds per row, 0: none), then ROUNDS interleaved
# rounds of DURATION seconds over ROWS, each run by the caller's
# `run_wrk ROW SECONDS` (which prints what wrk_figures does, and may add
# fields after those). Appends "ROUND ROW REQUESTS_PER_S P99_MS ERRORS ..."
# to $dir/results and prints it; strict (1): a run with errors stops the
# benchmark.
interleave_rounds() { # strict
    rounds_strict=$1
    if [ "$WARMUP" != 0 ]; then
        for row in $ROWS; do run_wrk "$row" "$WARMUP" > /dev/null; done
    fi
    round=1
    while [ "$round" -le "$ROUNDS" ]; do
        for row in $ROWS; do
            # shellcheck disable=SC2046 # three words, or more
            set -- $(run_wrk "$row" "$DURATION")
            if [ "$rounds_strict" = 1 ] && [ "${3:-0}" != 0 ]; then
                die "$row: $3 answers were not 2xx"
            fi
            echo "$round $row $*" | tee -a "$dir/results"
        done
        round=$((round + 1))
    done
}

# One worker each, keep-alive both ways: an nginx upstream serving $dir's
# files, an nginx proxy and a ricochet proxy in front of it (their dirs under
# $dir). Each waits for its port; pids in $upid, $npid, $rpid (and $pids).
start_nginx_upstream() { # port
    mkdir -p "$dir/upstream/logs"
    cat > "$dir/upstream/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $dir/upstream/nginx.pid;
error_log $dir/upstream/logs/error.log error;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 1000000;
    keepalive_timeout 300s;
    root $dir;
    server { listen 127.0.0.1:$1; location / { } }
}
CONF
    nginx -p "$dir/upstream" -c "$dir/upstream/nginx.conf" 2> "$dir/upstream.err" &
    upid=$!
    pids="$pids $upid"
    wait_port upstream "$1" "$upid"
}

start_nginx_proxy() { # port upstream_port
    mkdir -p "$dir/nginx/logs"
    cat > "$dir/nginx/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $dir/nginx/nginx.pid;
error_log $dir/nginx/logs/error.log error;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 1000000;
    upstream backend { server 127.0.0.1:$2; keepalive 64; }
    server {
        listen 127.0.0.1:$1;
        location / { proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection ""; }
    }
}
CONF
    nginx -p "$dir/nginx" -c "$dir/nginx/nginx.conf" 2> "$dir/nginx.err" &
    npid=$!
    pids="$pids $npid"
    wait_port nginx "$1" "$npid"
}

start_ricochet_proxy() { # port upstream_port [main-level directives]
    mkdir -p "$dir/ricochet/logs"
    cat > "$dir/ricochet/ricochet.conf" <<CONF
worker_processes 1;
error_log $dir/ricochet.log error;
${3:-}
http {
    access_log off;
    keepalive_requests 1000000;
    upstream backend { server 127.0.0.1:$2; keepalive 64; }
    server { listen 127.0.0.1:$1; location / { proxy_pass http://backend; } }
}
CONF
    "$BIN" -p "$dir/ricochet" -c "$dir/ricochet/ricochet.conf" 2> "$dir/ricochet.err" &
    rpid=$!
    pids="$pids $rpid"
    wait_port ricochet "$1" "$rpid"
}
