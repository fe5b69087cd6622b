#!/usr/bin/env bash
# agent-gateway next to nginx and HAProxy doing the same job (the configs in shared/peers),
# in one command, on this machine.
#
# It installs what is missing (nginx, haproxy, wrk), builds the gateway in release, starts the
# static v2 backend (nginx, 127.0.0.1:9000), agent-gateway (:8083), nginx (:8081) and HAProxy
# (:8082), each proxy pinned to PROXY_CPU and every load generator (and the backend) to LOAD_CPU.
# Then, in ROUNDS alternating rounds over TARGETS, it measures for each:
#   max req/s      wrk -t1 -c$CONNS -d${DURATION}s with post-verify.lua (POST v1 verify, auth)
#   p50/p99        `agent-gateway load` at a fixed LAT_RATE (open model: latency from each
#                  request's intended start, so no coordinated omission; wrk2 is not packaged)
#                  with the default operation mix, LAT_CONNS connections, LAT_DURATION seconds
#   CPU s/100k     utime+stime of the proxy's processes (/proc/PID/stat) per 100k requests,
#                  during the max run and during the fixed-rate run
#   RSS            idle (VmRSS after start-up), peak (VmHWM at the end) and VmRSS while
#                  IDLE_CONNS client connections are open and idle after one request each
#   backend conns  the most connections from the proxy to the backend seen while those
#                  IDLE_CONNS connections send their request at once (ss, every 50 ms)
#   load/wrk       the load generator's own overhead: `agent-gateway load --rate max` (closed
#                  model, one thread, CONNS connections, POST v1 verify only) right after wrk's
#                  max run, on the same CPU and target; its req/s over wrk's, per round
#                  (LOAD_VS_WRK=0 skips it)
# and prints medians over the rounds with each one's ratio to nginx, and the gateway's CPU over
# nginx's round by round (median and quartiles). `direct` is wrk straight to the backend: the
# ceiling any proxy can reach here (the backend shares LOAD_CPU with wrk).
#
# Environment (defaults): ROUNDS (3) DURATION (10) LAT_RATE (5000; 0 skips the fixed rate)
#   LAT_DURATION (15: p99 then rests on 750 samples per round rather than 250 at 5 s, which
#   moved it by 2x between rounds) LAT_CONNS (16) CONNS (64) IDLE_CONNS (1000; 0 skips them)
#   PROXY_CPU (0) LOAD_CPU (1)
#   PEERS (../shared/peers from the repo) TARGETS ("direct agent-gateway rl-local rl-redis nginx
#   haproxy"; may be empty)
#   GATEWAY_BIN (skip the build and run this binary) GATEWAY_SERVER (extra lines for the
#   gateway's [server] table, e.g. "work_stealing = false") GATEWAY_LOG_LEVEL (warn: no access
#   log, like the peers' access_log off; "info" logs every request to a file)
#   Every gateway runs with `threads = 1` (it has one CPU) unless its [server] lines set threads.
#   GATEWAY_UPSTREAM (extra lines for its [upstream] table, e.g.
#   "max_connections_per_address = 64"; GATEWAY_B_UPSTREAM for agent-gateway-b)
#   A second gateway variant for A/B runs, agent-gateway-b on :8084, starts when any of
#   GATEWAY_B_BIN, GATEWAY_B_SERVER, GATEWAY_B_UPSTREAM, GATEWAY_B_LOG_LEVEL is set, and joins
#   the default TARGETS; the table then also gives agent-gateway-b's CPU over agent-gateway's,
#   round by round (median and quartiles). Many short rounds of CPU alone, e.g. the access
#   log's cost: TARGETS="agent-gateway agent-gateway-b" GATEWAY_B_LOG_LEVEL=info LAT_RATE=0
#   IDLE_CONNS=0 ROUNDS=30 DURATION=3;
#   nginx-log (:8090) is the nginx peer with an access log: a JSON line of the gateway's
#   fields to a file, through a 64 KiB buffer flushed at least every 100 ms (the gateway's
#   log writer's batch and period). Named with nginx in TARGETS, the table gives its CPU over
#   nginx's round by round, as for agent-gateway-b: the two proxies' access logs side by side,
#   TARGETS="agent-gateway agent-gateway-b nginx nginx-log" GATEWAY_B_LOG_LEVEL=info LAT_RATE=0
#   IDLE_CONNS=0 ROUNDS=12 DURATION=3;
#   GATEWAY_B_OUT: where agent-gateway-b's log goes instead of a file in the run's directory;
#   /dev/null measures the access log's formatting without the file it is written to, and
#   "pipe" sends it through a pipe to a `cat` on LOAD_CPU that writes the file, as a container
#   runtime reads a container's stdout. The gateways' configs are in a directory of their own
#   ($WORK/config), so that their logs' writes are no events for their config watchers.
#   GATEWAY_B_CPUS (PROXY_CPU) is the CPU list it is pinned to: "0,1" with
#   GATEWAY_B_SERVER="threads = 2" measures two threads sharing both cores with the load.
#   Tracing: agent-gateway-trace-0.01 (:8088) and agent-gateway-trace-1 (:8089) are the same
#   gateway with [tracing] on at sample_ratio 0.01 and 1.0 (wrk sends no traceparent, so the
#   ratio decides), exporting over OTLP/HTTP to a sink (nginx answering 200 on :14318, on
#   LOAD_CPU); agent-gateway is the same gateway with tracing off. Name them in TARGETS, e.g.
#   TARGETS="agent-gateway agent-gateway-trace-0.01 agent-gateway-trace-1"; the table then
#   also gives their ratios to agent-gateway, and the spans each exported and dropped.
#   RESULTS (a file to keep the per-round TSV in) LOAD_VS_WRK (1) LOAD_VS_H2LOAD (1)
#   HTTP/2: H2_TARGETS (none by default; "agent-gateway nginx-h2" measures the gateway and nginx
#   doing the same job over h2c, nginx-h2 being the peer config with `listen ... http2`) with
#   h2load -c H2_CONNS (8) -m H2_STREAMS (32) for DURATION seconds, in ROUNDS alternating rounds:
#   req/s and CPU s/100k, in a table of their own. Right after each h2load run, h2load's job
#   done by the load generator (`agent-gateway load --http2 --rate max`, closed model, one
#   thread, H2_CONNS connections × H2_STREAMS streams, POST v1 verify only) on the same CPU and
#   target: its req/s over h2load's, per round (LOAD_VS_H2LOAD=0 skips it). Only the h2 table:
#   TARGETS="" H2_TARGETS=agent-gateway.
#   The per-agent rate limit's two backends, on the same binary: rl-local (:8085, in-process
#   buckets) and rl-redis (:8086, a redis-server on 127.0.0.1:6399 pinned to LOAD_CPU, with the
#   load), each with the benchmark's agent limited far above what it can send, so that every
#   request asks the limiter and none is refused. Compare the two with each other;
#   agent-gateway (no limit) is the cost of neither.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PEERS=${PEERS:-$ROOT/../shared/peers}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
LAT_RATE=${LAT_RATE:-5000}
LAT_DURATION=${LAT_DURATION:-15}
LAT_CONNS=${LAT_CONNS:-16}
CONNS=${CONNS:-64}
IDLE_CONNS=${IDLE_CONNS:-1000}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
GATEWAY_SERVER=${GATEWAY_SERVER:-}
GATEWAY_UPSTREAM=${GATEWAY_UPSTREAM:-}
GATEWAY_LOG_LEVEL=${GATEWAY_LOG_LEVEL:-warn}
LOAD_VS_WRK=${LOAD_VS_WRK:-1}
LOAD_VS_H2LOAD=${LOAD_VS_H2LOAD:-1}
B_ENABLED=0
if [ -n "${GATEWAY_B_BIN:-}${GATEWAY_B_SERVER:-}${GATEWAY_B_UPSTREAM:-}${GATEWAY_B_LOG_LEVEL:-}" ]; then
  B_ENABLED=1
fi
GATEWAY_B_SERVER=${GATEWAY_B_SERVER:-}
GATEWAY_B_UPSTREAM=${GATEWAY_B_UPSTREAM:-}
GATEWAY_B_CPUS=${GATEWAY_B_CPUS:-$PROXY_CPU}
GATEWAY_B_LOG_LEVEL=${GATEWAY_B_LOG_LEVEL:-$GATEWAY_LOG_LEVEL}
if [ -z "${TARGETS+set}" ]; then
  TARGETS="direct agent-gateway rl-local rl-redis nginx haproxy"
  [ "$B_ENABLED" = 1 ] && TARGETS="direct agent-gateway agent-gateway-b rl-local rl-redis nginx haproxy"
fi

log() { printf '%s %s\n' "$(date +%T)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# --- what is missing --------------------------------------------------------------------------
need=()
command -v nginx >/dev/null || need+=(nginx-light)
command -v haproxy >/dev/null || need+=(haproxy)
command -v wrk >/dev/null || need+=(wrk)
command -v curl >/dev/null || need+=(curl)
[ -n "${H2_TARGETS:-}" ] && { command -v h2load >/dev/null || need+=(nghttp2-client); }
command -v python3 >/dev/null || need+=(python3)
command -v taskset >/dev/null || need+=(util-linux)
if [[ " $TARGETS " == *" rl-redis "* ]]; then
  command -v redis-server >/dev/null || need+=(redis-server)
  command -v redis-cli >/dev/null || need+=(redis-tools)
fi
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" \
    || { [[ " ${need[*]} " == *" nginx-light "* ]] && apt-get install -y -qq --no-install-recommends "${need[@]/nginx-light/nginx}"; }
fi
[ -d "$PEERS" ] || die "peer configs not found at $PEERS (set PEERS)"
[ "$(nproc --all)" -gt "$LOAD_CPU" ] || die "CPU $LOAD_CPU does not exist (set PROXY_CPU/LOAD_CPU)"

# --- build ------------------------------------------------------------------------------------
if [ -z "${GATEWAY_BIN:-}" ]; then
  log "building agent-gateway (release)"
  (cd "$ROOT" && cargo build --release --quiet --bin agent-gateway)
  target_dir=$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
  GATEWAY_BIN=$target_dir/release/agent-gateway
fi
[ -x "$GATEWAY_BIN" ] || die "no gateway binary at $GATEWAY_BIN"
GATEWAY_B_BIN=${GATEWAY_B_BIN:-$GATEWAY_BIN}
LOAD_BIN=$GATEWAY_BIN

# --- start everything, stop it on exit --------------------------------------------------------
WORK=$(mktemp -d /tmp/agent-gateway-compare.XXXXXX)
# The gateways' configs, away from the logs written in $WORK.
CONF=$WORK/config
mkdir "$CONF"
PIDS=()
cleanup() {
  set +e
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for _ in $(seq 50); do
    alive=0
    for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

declare -A PORT=([direct]=9000 [agent-gateway]=8083 [agent-gateway-b]=8084 [rl-local]=8085 [rl-redis]=8086 [nginx]=8081 [haproxy]=8082 [nginx-h2]=8087
  [nginx-log]=8090 [agent-gateway-trace-0.01]=8088 [agent-gateway-trace-1]=8089)
REDIS_PORT=6399
# The tracing variants' admin listeners (their span counters) and the OTLP sink they export to.
declare -A ADMIN_PORT=([agent-gateway-trace-0.01]=9186 [agent-gateway-trace-1]=9187)
OTLP_SINK_PORT=14318
H2_TARGETS=${H2_TARGETS:-}
H2_CONNS=${H2_CONNS:-8}
H2_STREAMS=${H2_STREAMS:-32}
declare -A MAINPID=()
# Where a target's output (a gateway's log) goes, when not to a file in $WORK.
declare -A OUT=()
[ -n "${GATEWAY_B_OUT:-}" ] && OUT[agent-gateway-b]=$GATEWAY_B_OUT

for port in 9000 8081 8082 8083 8084 8085 8086 8087 8088 8089 8090 9186 9187 "$REDIS_PORT" "$OTLP_SINK_PORT"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    die "127.0.0.1:$port is already in use (a previous run, or a demo?)"
  fi
done

# Peer configs: copied, run in the foreground, pid and log files in $WORK.
for f in backend-nginx.conf gateway-nginx.conf gateway-haproxy.cfg post-verify.lua; do
  # nginx's worker_connections (4096 in the peers) raised to hold IDLE_CONNS and their upstreams.
  sed -e "s#/tmp/peer-#$WORK/peer-#g" -e 's/^daemon on;/daemon off;/' \
    -e "s/worker_connections [0-9]*;/worker_connections $((2 * IDLE_CONNS + 4096));/" \
    "$PEERS/$f" >"$WORK/$f"
done
# nginx doing the same job over h2c: the same config, listening for HTTP/2 with prior knowledge.
sed -e 's/listen 127.0.0.1:8081 /listen 127.0.0.1:8087 http2 /' \
  -e "s#$WORK/peer-gateway-nginx#$WORK/peer-gateway-nginx-h2#g" \
  "$WORK/gateway-nginx.conf" >"$WORK/gateway-nginx-h2.conf"
grep -q 'listen 127.0.0.1:8087 http2' "$WORK/gateway-nginx-h2.conf" \
  || die "could not make the h2c variant of $PEERS/gateway-nginx.conf"
# nginx with an access log of the gateway's line: its fields, in its order, JSON-escaped; what
# nginx cannot know (the operation, the auth outcome) is written as the gateway writes it here,
# and nginx's times are its own (seconds, to the millisecond).
cat >"$WORK/nginx-access-log.conf" <<EOF
log_format gateway escape=json '{"timestamp":"\$time_iso8601","level":"INFO","message":"request",'
    '"request_id":"\$request_id","protocol":"\$server_protocol","method":"\$request_method",'
    '"path":"\$request_uri","upstream_path":"\$uri","api_version":"v1","operation":"verify_request",'
    '"agent_id":"\$http_x_service_agent_id","status":\$status,"duration_ms":\$request_time,'
    '"upstream_ms":\$upstream_response_time,"bytes_in":\$request_length,"bytes_out":\$bytes_sent,'
    '"auth":"ok","client_aborted":false,"client_addr":"\$remote_addr",'
    '"user_agent":"\$http_user_agent","target":"agent_gateway::access"}';
access_log $WORK/nginx-access.log gateway buffer=64k flush=100ms;
EOF
sed -e 's/listen 127.0.0.1:8081 /listen 127.0.0.1:8090 /' \
  -e "s#$WORK/peer-gateway-nginx#$WORK/peer-gateway-nginx-log#g" \
  -e "s#^    access_log off;#    include $WORK/nginx-access-log.conf;#" \
  "$WORK/gateway-nginx.conf" >"$WORK/gateway-nginx-log.conf"
grep -q "include $WORK/nginx-access-log.conf" "$WORK/gateway-nginx-log.conf" \
  || die "could not make the logging variant of $PEERS/gateway-nginx.conf"

# The agent and token wrk sends (shared/peers/post-verify.lua), stored as its digest.
TOKEN_SHA256=$(printf '%s' secret | "$GATEWAY_BIN" hash-token)
gateway_config() { # port, extra [server] lines, [admin port, lines after the agent's token: its own keys, then tables, extra [upstream] lines]
  cat <<EOF
[listen]
proxy = "127.0.0.1:$1"
${3:+admin = \"127.0.0.1:$3\"}
[server]
$(case "$2" in *threads*) ;; *) echo "threads = 1" ;; esac)
grace_period_seconds = 0
$2
[v1]
default_service = "DEFAULT"
[upstream]
addresses = ["127.0.0.1:9000"]
${5:-}
[[auth.agents]]
id = "agent-1"
token_sha256 = "$TOKEN_SHA256"
EOF
  printf '%s\n' "${4:-}"
}
gateway_config 8083 "$GATEWAY_SERVER" "" "" "$GATEWAY_UPSTREAM" >"$CONF/gateway.toml"
gateway_config 8084 "$GATEWAY_B_SERVER" "" "" "$GATEWAY_B_UPSTREAM" >"$CONF/gateway-b.toml"
# A limit no run reaches: every request is decided, none refused.
RL_AGENT='rate_limit_per_second = 1000000000
burst = 1000000000'
gateway_config 8085 "$GATEWAY_SERVER" "" "$RL_AGENT" >"$CONF/rl-local.toml"
gateway_config 8086 "$GATEWAY_SERVER" "" "$RL_AGENT
[rate_limit]
backend = \"redis\"
redis_url = \"redis://127.0.0.1:$REDIS_PORT/0\"
on_redis_error = \"deny\"" >"$CONF/rl-redis.toml"
for ratio in 0.01 1; do
  t=agent-gateway-trace-$ratio
  gateway_config "${PORT[$t]}" "$GATEWAY_SERVER" "${ADMIN_PORT[$t]}" "[tracing]
otlp_endpoint = \"http://127.0.0.1:$OTLP_SINK_PORT\"
sample_ratio = $ratio" >"$CONF/$t.toml"
done
# The OTLP collector stand-in: takes each export request and answers 200.
cat >"$WORK/otlp-sink.conf" <<EOF
worker_processes 1;
daemon off;
pid $WORK/otlp-sink.pid;
error_log $WORK/otlp-sink.err warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_max_body_size 0;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$OTLP_SINK_PORT;
        location / { return 200; }
    }
}
EOF

start() { # name, cpu, command...
  local name=$1 cpu=$2
  shift 2
  if [ "${OUT[$name]:-}" = pipe ]; then
    taskset -c "$cpu" "$@" > >(exec taskset -c "$LOAD_CPU" cat >"$WORK/$name.out") 2>&1 &
  else
    taskset -c "$cpu" "$@" >"${OUT[$name]:-$WORK/$name.out}" 2>&1 &
  fi
  PIDS+=($!)
  MAINPID[$name]=$!
  disown "$!" # no job notices from bash when cleanup stops it
}

wait_port() { # name, port
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$2") 2>/dev/null && return 0
    kill -0 "${MAINPID[$1]}" 2>/dev/null || { cat "$WORK/$1.out" >&2; die "$1 exited"; }
    sleep 0.1
  done
  die "$1 did not listen on :$2"
}

# Each proxy must do the job before it is measured: auth checked, v1 rewritten.
check_job() { # name, port
  local ok bad
  ok=$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$2/api/v1/verify/request" \
    -H 'Content-Type: application/json' -H 'X-Service-Agent-Id: agent-1' -H 'X-Auth-Token: secret' \
    -d '{"business_code":"KYC-BASIC"}' -D "$WORK/$1.headers")
  [ "$ok" = 200 ] || die "$1: authorized POST answered $ok"
  if [ "$1" != direct ]; then
    grep -qi '^x-upstream-path: /api/v2/verify/DEFAULT/request' "$WORK/$1.headers" \
      || die "$1: v1 path not rewritten: $(cat "$WORK/$1.headers")"
    bad=$(curl -s -o /dev/null -w '%{http_code}' -X POST "http://127.0.0.1:$2/api/v1/verify/request" \
      -H 'X-Service-Agent-Id: agent-1' -H 'X-Auth-Token: wrong' -d '{}')
    [ "$bad" = 401 ] || die "$1: bad token answered $bad"
  fi
  # rl-redis must have decided in Redis (on_redis_error = "deny": a Redis failure is a 429).
  if [ "$1" = rl-redis ]; then
    redis-cli -p "$REDIS_PORT" INFO commandstats | grep -q '^cmdstat_evalsha:calls=' \
      || die "$1: Redis was not asked"
  fi
}

log "starting backend, proxies (CPU $PROXY_CPU) and load generators (CPU $LOAD_CPU) in $WORK"
start backend "$LOAD_CPU" nginx -p "$WORK" -c "$WORK/backend-nginx.conf"
MAINPID[direct]=${MAINPID[backend]}
wait_port backend 9000
if [[ " $TARGETS " == *" rl-redis "* ]]; then
  start redis "$LOAD_CPU" redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --save '' \
    --appendonly no --dir "$WORK"
  wait_port redis "$REDIS_PORT"
fi
if [[ " $TARGETS " == *" agent-gateway-trace-"* ]]; then
  start otlp-sink "$LOAD_CPU" nginx -p "$WORK" -c "$WORK/otlp-sink.conf"
  wait_port otlp-sink "$OTLP_SINK_PORT"
fi
for t in $TARGETS $H2_TARGETS; do
  [ -n "${MAINPID[$t]:-}" ] && continue
  case $t in
    direct) ;;
    agent-gateway)
      start "$t" "$PROXY_CPU" env -u RUST_LOG "$GATEWAY_BIN" run --config "$CONF/gateway.toml" \
        --log-format json --log-level "$GATEWAY_LOG_LEVEL" ;;
    agent-gateway-b)
      start "$t" "$GATEWAY_B_CPUS" env -u RUST_LOG "$GATEWAY_B_BIN" run --config "$CONF/gateway-b.toml" \
        --log-format json --log-level "$GATEWAY_B_LOG_LEVEL" ;;
    rl-local | rl-redis | agent-gateway-trace-*)
      start "$t" "$PROXY_CPU" env -u RUST_LOG "$GATEWAY_BIN" run --config "$CONF/$t.toml" \
        --log-format json --log-level "$GATEWAY_LOG_LEVEL" ;;
    nginx) start "$t" "$PROXY_CPU" nginx -p "$WORK" -c "$WORK/gateway-nginx.conf" ;;
    haproxy) start "$t" "$PROXY_CPU" haproxy -f "$WORK/gateway-haproxy.cfg" ;;
    nginx-h2) start "$t" "$PROXY_CPU" nginx -p "$WORK" -c "$WORK/gateway-nginx-h2.conf" ;;
    nginx-log) start "$t" "$PROXY_CPU" nginx -p "$WORK" -c "$WORK/gateway-nginx-log.conf" ;;
    *) die "unknown target $t" ;;
  esac
done
for t in $TARGETS; do
  wait_port "$t" "${PORT[$t]}"
  check_job "$t" "${PORT[$t]}"
done
for t in $H2_TARGETS; do
  wait_port "$t" "${PORT[$t]}"
  code=$(curl -s -o /dev/null -w '%{http_version} %{http_code}' --http2-prior-knowledge -X POST \
    "http://127.0.0.1:${PORT[$t]}/api/v1/verify/request" -H 'Content-Type: application/json' \
    -H 'X-Service-Agent-Id: agent-1' -H 'X-Auth-Token: secret' -d '{"business_code":"KYC-BASIC"}')
  [ "$code" = "2 200" ] || die "$t: h2c POST answered $code"
done

# --- /proc readings (a target's processes: the main pid and its children) --------------------
pids_of() { echo "${MAINPID[$1]}" $(pgrep -P "${MAINPID[$1]}" || true); }
cpu_ticks() { # sum of utime+stime
  local sum=0 p
  for p in $(pids_of "$1"); do
    sum=$((sum + $(sed 's/^.*) //' "/proc/$p/stat" | awk '{print $12 + $13}')))
  done
  echo "$sum"
}
status_kb() { # name, field (VmRSS, VmHWM): summed over the processes
  local sum=0 p
  for p in $(pids_of "$1"); do
    sum=$((sum + $(awk -v f="$2:" '$1 == f {print $2}' "/proc/$p/status")))
  done
  echo "$sum"
}
HZ=$(getconf CLK_TCK)
backend_conns() { # established connections from a target's processes to the backend (:9000)
  local pat
  pat=$(pids_of "$1" | tr ' ' '\n' | sed 's/.*/pid=&,/' | paste -sd'|')
  ss -Htnp state established '( dport = :9000 )' 2>/dev/null | grep -cE "$pat" || true
}

RESULTS_TSV=$WORK/results.tsv
: >"$RESULTS_TSV"
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$RESULTS_TSV"; }

for t in $TARGETS; do
  [ "$t" = direct ] && continue
  record 0 "$t" idle_rss_mib "$(awk -v k="$(status_kb "$t" VmRSS)" 'BEGIN {printf "%.1f", k / 1024}')"
done

cat >"$WORK/idle_conns.py" <<'EOF'
# Opens N connections, sends one request on each, reads each answer, then holds them idle.
import socket, sys, time
port, n, ready = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
req = (b"GET /api/v1/transaction/tx-1/status HTTP/1.1\r\nHost: 127.0.0.1\r\n"
       b"X-Service-Agent-Id: agent-1\r\nX-Auth-Token: secret\r\n\r\n")
socks = []
for _ in range(n):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(req)
    socks.append(s)
ok = 0
for s in socks:
    s.settimeout(5)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    ok += data.startswith(b"HTTP/1.1 200")
with open(ready, "w") as f:
    f.write(str(ok))
time.sleep(60)
EOF

# The load generator's JSON report on stdin, doing another tool's job: its req/s and errors as
# PREFIX_rps and PREFIX_errors, and its req/s over the other tool's as RATIO.
record_load_vs() { # round, target, the other tool's req/s, PREFIX, RATIO
  python3 -c '
import json, sys
r, t, other_rps, prefix, ratio, path = sys.argv[1:7]
rep = json.load(sys.stdin)
rps, errors = rep["throughput_rps"], rep["errors"]["total"]
with open(path, "a") as f:
    f.write(f"{r}\t{t}\t{prefix}_rps\t{rps:.1f}\n")
    f.write(f"{r}\t{t}\t{prefix}_errors\t{errors}\n")
    f.write(f"{r}\t{t}\t{ratio}\t{rps / float(other_rps):.4f}\n")
' "$1" "$2" "$3" "$4" "$5" "$RESULTS_TSV"
}

# --- the rounds -------------------------------------------------------------------------------
measure() { # round, target
  local r=$1 t=$2 port=${PORT[$2]} url out c0 c1 reqs rps errs
  url=http://127.0.0.1:$port
  # Warm-up: connections, pools, caches.
  taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d1s -s "$WORK/post-verify.lua" "$url" >/dev/null

  c0=$(cpu_ticks "$t")
  out=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$WORK/post-verify.lua" "$url")
  c1=$(cpu_ticks "$t")
  reqs=$(awk '/requests in/ {print $1}' <<<"$out")
  rps=$(awk '/^Requests\/sec/ {print $2}' <<<"$out")
  errs=$(awk '/Non-2xx/ {n += $NF} /Socket errors/ {gsub(",", ""); n += $4 + $6 + $8 + $10} END {print n + 0}' <<<"$out")
  record "$r" "$t" max_rps "$rps"
  record "$r" "$t" max_errors "$errs"
  [ "$t" != direct ] && record "$r" "$t" cpu_s_per_100k_max \
    "$(awk -v d=$((c1 - c0)) -v n="$reqs" -v hz="$HZ" 'BEGIN {printf "%.3f", d / hz / n * 100000}')"

  if [ "$LOAD_VS_WRK" = 1 ]; then
    # wrk's job done by the load generator: closed model, one thread, CONNS connections.
    out=$(taskset -c "$LOAD_CPU" "$LOAD_BIN" load --target "$url" --rate max \
      --duration "${DURATION}s" --connections "$CONNS" --threads 1 --api v1 \
      --mix verify_request=1 --agent-id agent-1 --token secret --json 2>/dev/null)
    record_load_vs "$r" "$t" "$rps" load_max load_vs_wrk <<<"$out"
  fi

  # The fixed rate: latency, and CPU at that rate (LAT_RATE=0 skips it).
  if [ "$LAT_RATE" != 0 ]; then
    c0=$(cpu_ticks "$t")
    out=$(taskset -c "$LOAD_CPU" "$LOAD_BIN" load --target "$url" --rate "$LAT_RATE" \
      --duration "${LAT_DURATION}s" --connections "$LAT_CONNS" --api v1 \
      --agent-id agent-1 --token secret --json 2>/dev/null)
    c1=$(cpu_ticks "$t")
    python3 - "$r" "$t" "$((c1 - c0))" "$HZ" "$out" "$RESULTS_TSV" "$t" <<'EOF'
import json, sys
r, t, ticks, hz, out, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
rep = json.loads(out)
rows = [("p50_ms", rep["latency_ms"]["p50"]), ("p99_ms", rep["latency_ms"]["p99"]),
        ("p999_ms", rep["latency_ms"]["p99_9"]), ("rate_errors", rep["errors"]["total"])]
if t != "direct" and rep["responses"]:
    rows.append(("cpu_s_per_100k_rate", ticks / hz / rep["responses"] * 100000))
with open(path, "a") as f:
    for k, v in rows:
        f.write(f"{r}\t{t}\t{k}\t{v:.4g}\n" if isinstance(v, float) else f"{r}\t{t}\t{k}\t{v}\n")
EOF
  fi

  # Idle connections (IDLE_CONNS=0 skips them).
  if [ "$t" != direct ] && [ "$IDLE_CONNS" != 0 ]; then
    rm -f "$WORK/ready"
    taskset -c "$LOAD_CPU" python3 "$WORK/idle_conns.py" "$port" "$IDLE_CONNS" "$WORK/ready" &
    local held=$! most=0 now
    for _ in $(seq 300); do
      now=$(backend_conns "$t")
      [ "$now" -gt "$most" ] && most=$now
      [ -s "$WORK/ready" ] && break
      sleep 0.05
    done
    record "$r" "$t" backend_conns_burst "$most"
    sleep 0.2
    record "$r" "$t" rss_idle_conns_mib "$(awk -v k="$(status_kb "$t" VmRSS)" 'BEGIN {printf "%.1f", k / 1024}')"
    record "$r" "$t" idle_conns_ok "$(cat "$WORK/ready" 2>/dev/null || echo 0)"
    kill "$held" 2>/dev/null
    wait "$held" 2>/dev/null || true
    sleep 0.3
  fi
  log "round $r $t: $rps req/s"
}

# h2load over h2c: the same v1 verify request as wrk's, many streams per connection.
measure_h2() { # round, target
  local r=$1 t=$2 url out c0 c1 reqs rps errs
  url=http://127.0.0.1:${PORT[$2]}/api/v1/verify/request
  printf '%s' '{"business_code":"KYC-BASIC","allow_multiple_read":true}' >"$WORK/h2-body.json"
  set -- -c "$H2_CONNS" -m "$H2_STREAMS" -d "$WORK/h2-body.json" -H 'content-type: application/json' \
    -H 'x-service-agent-id: agent-1' -H 'x-auth-token: secret'
  taskset -c "$LOAD_CPU" h2load "$@" -n 2000 "$url" >/dev/null
  c0=$(cpu_ticks "$t")
  out=$(taskset -c "$LOAD_CPU" h2load "$@" -D "$DURATION" "$url")
  c1=$(cpu_ticks "$t")
  reqs=$(awk '/^requests:/ {print $8}' <<<"$out")
  rps=$(awk '/^finished in/ {print $4}' <<<"$out")
  errs=$(awk '/^requests:/ {print $10 + $12}' <<<"$out")
  record "$r" "$t" h2_rps "$rps"
  record "$r" "$t" h2_errors "${errs:-0}"
  record "$r" "$t" h2_cpu_s_per_100k \
    "$(awk -v d=$((c1 - c0)) -v n="$reqs" -v hz="$HZ" 'BEGIN {printf "%.3f", d / hz / n * 100000}')"
  log "round $r $t (h2): $rps req/s"

  if [ "$LOAD_VS_H2LOAD" = 1 ]; then
    # h2load's job done by the load generator: closed model, one thread, the same connections
    # and streams.
    out=$(taskset -c "$LOAD_CPU" "$LOAD_BIN" load --target "http://127.0.0.1:${PORT[$t]}" \
      --http2 --connections "$H2_CONNS" --streams "$H2_STREAMS" --rate max \
      --duration "${DURATION}s" --threads 1 --api v1 --mix verify_request=1 \
      --agent-id agent-1 --token secret --json 2>/dev/null)
    record_load_vs "$r" "$t" "$rps" load_h2 load_vs_h2load <<<"$out"
    log "round $r $t (h2): load generator $(awk -v t="$t" '$2 == t && $3 == "load_h2_rps" {v = $4} END {print v}' "$RESULTS_TSV") req/s"
  fi
}

for r in $(seq "$ROUNDS"); do
  for t in $TARGETS; do
    measure "$r" "$t"
  done
  for t in $H2_TARGETS; do
    measure_h2 "$r" "$t"
  done
done
for t in $TARGETS; do
  [ "$t" = direct ] && continue
  record "$ROUNDS" "$t" peak_rss_mib "$(awk -v k="$(status_kb "$t" VmHWM)" 'BEGIN {printf "%.1f", k / 1024}')"
done
# What the tracing variants did with their spans over the whole run.
for t in $TARGETS; do
  [ -n "${ADMIN_PORT[$t]:-}" ] || continue
  metrics=$(curl -s "http://127.0.0.1:${ADMIN_PORT[$t]}/metrics")
  for series in exported dropped_queue_full dropped_export_failed; do
    case $series in
      exported) name='agent_gateway_trace_spans_exported_total' ;;
      dropped_queue_full) name='agent_gateway_trace_spans_dropped_total{reason="queue_full"}' ;;
      dropped_export_failed) name='agent_gateway_trace_spans_dropped_total{reason="export_failed"}' ;;
    esac
    record "$ROUNDS" "$t" "spans_$series" \
      "$(awk -v n="$name" '$1 == n {print $2; found = 1} END {if (!found) print 0}' <<<"$metrics")"
  done
done
[ -n "${RESULTS:-}" ] && cp "$RESULTS_TSV" "$RESULTS"

# --- the table --------------------------------------------------------------------------------
[ -n "$TARGETS" ] && python3 - "$RESULTS_TSV" "$TARGETS" <<EOF
import statistics, sys
from collections import defaultdict
path, targets = sys.argv[1], sys.argv[2].split()
vals = defaultdict(list)
for line in open(path):
    r, t, k, v = line.rstrip("\n").split("\t")
    vals[(t, k)].append(float(v))
cols = [("max_rps", "max req/s", "{:.0f}"), ("p50_ms", "p50 ms", "{:.3f}"),
        ("p99_ms", "p99 ms", "{:.3f}"), ("p999_ms", "p99.9 ms", "{:.3f}"),
        ("cpu_s_per_100k_max", "CPU s/100k @max", "{:.3f}"),
        ("cpu_s_per_100k_rate", "CPU s/100k @${LAT_RATE}/s", "{:.3f}"),
        ("idle_rss_mib", "idle RSS MiB", "{:.1f}"), ("peak_rss_mib", "peak RSS MiB", "{:.1f}"),
        ("rss_idle_conns_mib", "RSS +${IDLE_CONNS} conns MiB", "{:.1f}"),
        ("backend_conns_burst", "backend conns (burst)", "{:.0f}"),
        ("load_vs_wrk", "load/wrk req/s", "{:.2f}x")]
med = {(t, k): statistics.median(vals[(t, k)]) for t in targets for k, _, _ in cols if vals[(t, k)]}
w = 16
nw = max([w] + [len(t) + 1 for t in targets])  # the target column fits the longest name
print()
print(f"medians of ${ROUNDS} rounds; proxies on CPU ${PROXY_CPU}, wrk/load/backend on CPU ${LOAD_CPU}; "
      f"max: wrk -t1 -c${CONNS} -d${DURATION}s; latency: agent-gateway load --rate ${LAT_RATE} "
      f"-c ${LAT_CONNS} ${LAT_DURATION}s (from intended start)")
print("target".ljust(nw) + "".join(h.rjust(w + 4) for _, h, _ in cols))
for t in targets:
    print(t.ljust(nw) + "".join((f.format(med[(t, k)]) if (t, k) in med else "-").rjust(w + 4) for k, _, f in cols))
if "nginx" in targets:
    print("ratio to nginx")
    for t in targets:
        if t == "nginx":
            continue
        cells = []
        for k, _, _ in cols:
            if k == "load_vs_wrk":  # already a ratio, to wrk
                cells.append("-".rjust(w + 4))
                continue
            a, b = med.get((t, k)), med.get(("nginx", k))
            cells.append((f"{a / b:.2f}x" if a is not None and b else "-").rjust(w + 4))
        print(t.ljust(nw) + "".join(cells))
base = "agent-gateway"
traced = [t for t in targets if t.startswith("agent-gateway-trace-")]
if base in targets and traced:
    print("ratio to agent-gateway (tracing off)")
    for t in traced:
        cells = []
        for k, _, _ in cols:
            if k == "load_vs_wrk":  # already a ratio, to wrk
                cells.append("-".rjust(w + 4))
                continue
            a, b = med.get((t, k)), med.get((base, k))
            cells.append((f"{a / b:.3f}x" if a is not None and b else "-").rjust(w + 4))
        print(t.ljust(nw) + "".join(cells))
# Each variant against the build or setting it is compared with, and the gateway against
# nginx, round by round: each round's two figures were taken moments apart, so their ratio
# varies less than either.
for a_name, b_name in [("nginx", base), (base, "agent-gateway-b"), ("nginx", "nginx-log")]:
    if a_name not in targets or b_name not in targets:
        continue
    for k, h, _ in [c for c in cols if c[0].startswith("cpu_s_per_100k")]:
        pairs = [b / a for a, b in zip(vals[(a_name, k)], vals[(b_name, k)]) if a]
        if len(pairs) >= 2:
            q = statistics.quantiles(pairs, n=4)
            print(f"{b_name} / {a_name}, {h}, per round: median {statistics.median(pairs):.3f}x "
                  f"(quartiles {q[0]:.3f}-{q[2]:.3f}, {len(pairs)} rounds)")
for t in traced:
    spans = {k: int(vals[(t, f"spans_{k}")][0]) if vals[(t, f"spans_{k}")] else 0
             for k in ("exported", "dropped_queue_full", "dropped_export_failed")}
    print(f"{t} spans over the run: {spans['exported']} exported, "
          f"{spans['dropped_queue_full']} dropped (queue full), "
          f"{spans['dropped_export_failed']} dropped (export failed)")
errs = {t: sum(vals[(t, "max_errors")]) + sum(vals[(t, "rate_errors")])
        + sum(vals[(t, "load_max_errors")]) for t in targets}
conns = {t: min(vals[(t, "idle_conns_ok")]) for t in targets if vals[(t, "idle_conns_ok")]}
print("errors (wrk non-2xx + socket errors, load errors at the fixed rate and at max), all rounds:",
      ", ".join(f"{t} {int(n)}" for t, n in errs.items()))
print("idle connections answered 200 (min over rounds):",
      ", ".join(f"{t} {int(n)}/${IDLE_CONNS}" for t, n in conns.items()))
print()
print("per round max req/s:", "; ".join(f"{t} " + " ".join(f"{v:.0f}" for v in vals[(t, 'max_rps')]) for t in targets))
print("per round p99 ms:   ", "; ".join(f"{t} " + " ".join(f"{v:.3f}" for v in vals[(t, 'p99_ms')]) for t in targets))
if any(vals[(t, "load_vs_wrk")] for t in targets):
    print("load generator / wrk req/s, same job, connections and CPU, per round:",
          "; ".join(f"{t} " + " ".join(f"{v:.2f}x" for v in vals[(t, 'load_vs_wrk')]) for t in targets))
EOF

if [ -n "$H2_TARGETS" ]; then python3 - "$RESULTS_TSV" "$H2_TARGETS" <<EOF
import statistics, sys
from collections import defaultdict
path, targets = sys.argv[1], sys.argv[2].split()
vals = defaultdict(list)
for line in open(path):
    r, t, k, v = line.rstrip("\n").split("\t")
    vals[(t, k)].append(float(v))
print()
print(f"HTTP/2 (h2c): medians of ${ROUNDS} rounds of h2load -c ${H2_CONNS} -m ${H2_STREAMS} -D ${DURATION}, "
      f"proxies on CPU ${PROXY_CPU}, h2load and backend on CPU ${LOAD_CPU}")
print("target".ljust(16) + "req/s".rjust(12) + "CPU s/100k".rjust(14) + "errors".rjust(10)
      + "load req/s".rjust(14) + "load/h2load".rjust(14))
med = {}
for t in targets:
    rps, cpu = statistics.median(vals[(t, "h2_rps")]), statistics.median(vals[(t, "h2_cpu_s_per_100k")])
    med[t] = (rps, cpu)
    load = (f"{statistics.median(vals[(t, 'load_h2_rps')]):.0f}".rjust(14)
            + f"{statistics.median(vals[(t, 'load_vs_h2load')]):.2f}x".rjust(14)) if vals[(t, "load_h2_rps")] else ""
    print(t.ljust(16) + f"{rps:.0f}".rjust(12) + f"{cpu:.3f}".rjust(14) + f"{sum(vals[(t, 'h2_errors')]):.0f}".rjust(10) + load)
if "nginx-h2" in med:
    base = med["nginx-h2"]
    for t in targets:
        if t != "nginx-h2":
            print(f"{t} to nginx-h2: {med[t][0] / base[0]:.2f}x req/s, {med[t][1] / base[1]:.2f}x CPU per request")
print("per round req/s:", "; ".join(f"{t} " + " ".join(f"{v:.0f}" for v in vals[(t, 'h2_rps')]) for t in targets))
if any(vals[(t, "load_vs_h2load")] for t in targets):
    print("load generator / h2load req/s, same job, connections, streams and CPU, per round:",
          "; ".join(f"{t} " + " ".join(f"{v:.2f}x" for v in vals[(t, 'load_vs_h2load')]) for t in targets))
    print("load generator errors (all rounds):",
          ", ".join(f"{t} {sum(vals[(t, 'load_h2_errors')]):.0f}" for t in targets))
EOF
fi
