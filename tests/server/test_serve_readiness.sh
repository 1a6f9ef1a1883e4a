#!/usr/bin/env bash
# test_serve_readiness.sh - while the weights load, /health and the API answer 503 (with an
# OpenAI error body); once loaded, /health answers 200. config.json is a FIFO, so loading
# waits for the test to write it: the "still loading" state lasts as long as the test wants.
. "$(dirname "$0")/serve_lib.sh"
make_tiny

mkdir "$work/slow"
for f in "$work/tiny"/*; do ln -s "$f" "$work/slow/"; done
rm "$work/slow/config.json" && mkfifo "$work/slow/config.json"
if launch slow "$work/slow"; then
  slow_pid=$pid
  code=$(curl -s -m 5 -o "$work/h.txt" -w '%{http_code}' "http://127.0.0.1:$port/health")
  [ "$code" = 503 ] || fail "/health while loading: $code, expected 503"
  code=$(curl -s -m 5 -o "$work/h.txt" -w '%{http_code}' "http://127.0.0.1:$port/v1/models")
  [ "$code" = 503 ] && grep -q '"error":{"message"' "$work/h.txt" || fail "/v1/models while loading: $code $(cat "$work/h.txt")"
  timeout 10 sh -c "cat '$work/tiny/config.json' > '$work/slow/config.json'" ||
    fail "the server never read config.json"
  wait_ready slow && stop_server "$slow_pid" slow
fi

finish
