#!/bin/sh
# run.sh: `make run`: the demo upstream on 127.0.0.1:9000 (every third answer a 503)
# and the gateway on 127.0.0.1:8080 in front of it, until Ctrl-C.
set -eu
cd "$(dirname "$0")/../.."
BIN=${RICOCHET_BIN:-build/ricochet}
luajit tests/tools/fault_upstream.lua --port 9000 --max-seconds 86400 \
    --program contrib/demo/program.json > /dev/null &
upstream=$!
trap 'kill $upstream 2>/dev/null || true' EXIT INT TERM
echo "demo upstream on 127.0.0.1:9000 (every third answer is a 503)"
echo "gateway on http://127.0.0.1:8080/ — try: curl -i http://127.0.0.1:8080/"
echo "status page on http://127.0.0.1:9901/status, metrics on http://127.0.0.1:9901/metrics"
"$BIN" -p "$PWD" -c conf/ricochet.conf
