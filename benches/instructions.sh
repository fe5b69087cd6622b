#!/usr/bin/env bash
# User-space instructions per proxied request, counted rather than timed: the gateway runs
# under valgrind's callgrind with instrumentation off, wrk warms it up, then instrumentation is
# switched on for DURATION seconds of wrk (POST v1 verify with valid credentials, CONNS
# connections) and the count is divided by the requests wrk made. Two runs of one build agree
# within about 0.5 %, whatever else the machine is doing, where CPU time moves by ±10 % on a
# shared VM: use it to compare builds step by step (`benches/compare.sh` for CPU and latency).
#
# Under valgrind the token's SHA-256 runs in software (about 3.5k instructions; natively the
# CPU's SHA extensions make it a few hundred), so totals overstate that part but compare
# builds exactly.
#
# Environment (defaults): GATEWAY_BIN (build in release) LOG_LEVEL (warn: no access log; info
#   writes the access log to a file outside the config's directory) CONNS (16) DURATION (5)
#   PORT (8093) BACKEND_PORT (9003) TOP (0: the count only; N also prints the N functions with
#   the most instructions, inclusive, per request) OUT (where callgrind's file is kept; a
#   temporary directory by default)
# Needs valgrind, wrk and nginx (the static backend): `apt-get install valgrind wrk
# nginx-light` on Debian.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CONNS=${CONNS:-16}
DURATION=${DURATION:-5}
PORT=${PORT:-8093}
BACKEND_PORT=${BACKEND_PORT:-9003}
LOG_LEVEL=${LOG_LEVEL:-warn}
TOP=${TOP:-0}

die() { echo "instructions.sh: $*" >&2; exit 1; }
for tool in valgrind callgrind_control callgrind_annotate wrk nginx curl; do
  command -v "$tool" >/dev/null || die "$tool is missing (apt-get install valgrind wrk nginx-light curl)"
done
if [ -z "${GATEWAY_BIN:-}" ]; then
  (cd "$ROOT" && cargo build --release --quiet)
  GATEWAY_BIN=$ROOT/target/release/agent-gateway
fi

WORK=$(mktemp -d /tmp/agent-gateway-instructions.XXXXXX)
OUT=${OUT:-$WORK/callgrind.out}
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  [ -f "$WORK/backend.pid" ] && kill "$(cat "$WORK/backend.pid")" 2>/dev/null || true
}
trap cleanup EXIT

# The static v2 backend: every request answered 200 with a small JSON body.
cat >"$WORK/backend.conf" <<EOF
worker_processes 1;
daemon on;
pid $WORK/backend.pid;
error_log $WORK/backend.err warn;
events { worker_connections 1024; }
http {
    access_log off;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$BACKEND_PORT;
        location / {
            default_type application/json;
            return 200 '{"status_code":200,"message_code":0,"message":"OK","transaction_id":"tx-1"}';
        }
    }
}
EOF
nginx -p "$WORK" -c "$WORK/backend.conf"

mkdir "$WORK/config" "$WORK/logs"
TOKEN_SHA256=$(printf '%s' secret | "$GATEWAY_BIN" hash-token)
cat >"$WORK/config/gateway.toml" <<EOF
[listen]
proxy = "127.0.0.1:$PORT"
[server]
threads = 1
grace_period_seconds = 0
[v1]
default_service = "DEFAULT"
[upstream]
addresses = ["127.0.0.1:$BACKEND_PORT"]
[[auth.agents]]
id = "agent-1"
token_sha256 = "$TOKEN_SHA256"
EOF
cat >"$WORK/post-verify.lua" <<'EOF'
wrk.method = "POST"
wrk.path = "/api/v1/verify/request"
wrk.body = '{"business_code":"KYC-BASIC","allow_multiple_read":true}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["X-Auth-Token"] = "secret"
wrk.headers["X-Service-Agent-Id"] = "agent-1"
EOF

env -u RUST_LOG valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$OUT" \
  "$GATEWAY_BIN" run --config "$WORK/config/gateway.toml" --log-format json \
  --log-level "$LOG_LEVEL" >"$WORK/logs/gateway.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 120); do
  curl -s -o /dev/null "http://127.0.0.1:$PORT/" && break
  kill -0 "${PIDS[0]}" 2>/dev/null || { cat "$WORK/logs/gateway.log" >&2; die "the gateway exited"; }
  sleep 0.5
done
url="http://127.0.0.1:$PORT"
wrk -t1 -c"$CONNS" -d2s -s "$WORK/post-verify.lua" "$url" >/dev/null
callgrind_control -i on "${PIDS[0]}" >/dev/null
out=$(wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$WORK/post-verify.lua" "$url")
callgrind_control -i off "${PIDS[0]}" >/dev/null
callgrind_control -d "${PIDS[0]}" >/dev/null
kill "${PIDS[0]}"
wait "${PIDS[0]}" 2>/dev/null || true

requests=$(awk '/requests in/ {print $1}' <<<"$out")
non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
[ -z "$non2xx" ] || die "wrk got $non2xx answers other than 2xx: the gateway did not do the job"
dump=$(ls "$OUT".* | tail -1)
total=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
echo "$requests requests, $total instructions: $((total / requests)) per request (log level $LOG_LEVEL, $CONNS connections)"
if [ "$TOP" -gt 0 ]; then
  # The inclusive table's first TOP rows, each divided by the requests.
  callgrind_annotate --inclusive=yes --auto=no "$dump" 2>/dev/null | python3 -c '
import re, sys
requests, top = int(sys.argv[1]), int(sys.argv[2])
rows = [m for m in (re.match(r"\s*([\d,]+) \([ \d.]+%\)\s+(.*)", l) for l in sys.stdin) if m]
for m in rows[1:top + 1]:
    count = int(m[1].replace(",", ""))
    print(f"{count / requests:8.0f}  {m[2]}")
' "$requests" "$TOP"
fi
