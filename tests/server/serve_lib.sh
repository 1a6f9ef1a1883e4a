# serve_lib.sh - helpers the test_serve_*.sh tests source: a scratch folder removed on exit,
# the tiny random model, servers on free ports, bounded waits, and the failure count.
# Every wait polls a condition against a deadline; none sleeps a fixed time and hopes.
# shellcheck shell=bash
set -u
bin=${GPTOSS_BIN:?run through ctest}
src=${GPTOSS_SOURCE_DIR:?run through ctest}
here="$src/tests/server"
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
key=test-key-123
export NODE_PATH="$src/node_modules"
cd "$src" || exit 1 # node resolves packages from the checkout's node_modules

# Sanitizer builds run several times slower; deadlines stretch with them.
slow=1
[ "${GPTOSS_SANITIZE:-0}" = 1 ] && slow=6

# make_tiny : the tiny random model in $work/tiny.
make_tiny() {
  "$bin" make-model --preset tiny -o "$work/tiny" >/dev/null 2>&1 || { echo "FAIL: make-model"; exit 1; }
}

# wait_until SECONDS WHAT CMD... : runs CMD every 0.1 s until it succeeds; false (and a
# failure naming WHAT) when SECONDS (times $slow) pass first.
wait_until() {
  local limit=$(($1 * slow)) what=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@"; do
    if [ $SECONDS -ge $deadline ]; then fail "$what (waited ${limit} s)"; return 1; fi
    sleep 0.1
  done
}

# launch NAME MODEL_DIR ARGS... : starts on a free port; sets $port and $pid.
launch() {
  local name=$1 dir=$2; shift 2
  "$bin" serve -m "$dir" --served-model-name tiny --port 0 -t 2 "$@" >"$work/$name.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  port=""
  local deadline=$((SECONDS + 30 * slow))
  while [ $SECONDS -lt $deadline ]; do
    port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$work/$name.log" 2>/dev/null | head -1)
    [ -n "$port" ] && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  fail "$name: no port in log: $(cat "$work/$name.log")"
  return 1
}

health_code() { curl -s -m 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health"; }
healthy() { [ "$(health_code)" = 200 ]; }

# wait_ready NAME : waits for /health 200 on $port.
wait_ready() {
  wait_until 60 "$1: /health never answered 200: $(tail -5 "$work/$1.log")" healthy
}

# start_server NAME ARGS... : the tiny model, ready to serve.
start_server() {
  local name=$1; shift
  launch "$name" "$work/tiny" "$@" && wait_ready "$name"
}

# stop_server PID NAME : SIGTERM, then expects exit status 0 once requests in flight drained
# (the server gives them up to --drain-timeout, 60 s; on a loaded machine they take a while).
stop_server() {
  local p=$1 name=$2
  kill -TERM "$p" 2>/dev/null
  local limit=$((90 * slow))
  local deadline=$((SECONDS + limit))
  while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
  if kill -0 "$p" 2>/dev/null; then fail "$name: still running $limit s after SIGTERM"; kill -9 "$p"; fi
  wait "$p"; local rc=$?
  [ $rc -eq 0 ] || fail "$name: exit status $rc after SIGTERM: $(tail -5 "$work/$name.log")"
}

# metric URL NAME : the value of a gauge/counter in /metrics (empty when absent).
metric() {
  curl -s -m 5 "$1/metrics" | sed -n "s/^$2{[^}]*} \([0-9.eE+-]*\)$/\1/p" | head -1
}

node_check() { timeout $((240 * slow)) node "$here/server_client.mjs" "$@" || fail "node client mode $1"; }

# finish : the test's exit status.
finish() {
  if [ $failures -ne 0 ]; then
    echo "$failures failure(s)"
    exit 1
  fi
  echo "passed"
  exit 0
}
