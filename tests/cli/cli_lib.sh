# cli_lib.sh - what the tests/cli shell tests share: a scratch folder removed on exit, failures
# counted, servers on free ports that are stopped on exit, and bounded waits.
# shellcheck shell=bash
set -u
bin="${GPTOSS_BIN:?run through ctest}"
work="$(mktemp -d)"
server_pids=()
cleanup() {
    for p in "${server_pids[@]}"; do kill -9 "$p" 2>/dev/null; done
    rm -rf "$work"
}
trap cleanup EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# Sanitizer builds run several times slower; deadlines stretch with them.
slow=1
[ "${GPTOSS_SANITIZE:-0}" = 1 ] && slow=6

# start_serve LOG BINARY ARGS...: `BINARY serve ARGS --port 0` in the background; sets $pid
# and $port once the server listens, and waits for GET /health 200. False (log printed) when
# it exits or is not ready in time.
start_serve() {
    local log=$1 binary=$2
    shift 2
    "$binary" serve "$@" --port 0 -t 2 >"$log" 2>&1 &
    pid=$!
    server_pids+=("$pid")
    port=""
    local deadline=$((SECONDS + 60 * slow))
    while [ $SECONDS -lt $deadline ] && kill -0 "$pid" 2>/dev/null; do
        [ -n "$port" ] || port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$log" 2>/dev/null | head -1)
        if [ -n "$port" ] &&
            [ "$(curl -s -m 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ]; then
            return 0
        fi
        sleep 0.1
    done
    echo "---- $log ----"
    cat "$log"
    return 1
}

# stop_serve: SIGTERM to $pid, and wait for it to exit.
stop_serve() {
    kill -TERM "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
}

# models: GET /v1/models of the server on $port.
models() { curl -s -m 10 "http://127.0.0.1:$port/v1/models"; }

finish() {
    if [ "$failures" -ne 0 ]; then
        echo "$failures failure(s)"
        exit 1
    fi
    echo PASS
}
