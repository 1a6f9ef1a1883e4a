#!/usr/bin/env bash
# test_serve.sh - `gptoss serve` end to end over real HTTP on loopback, CPU backend, tiny
# random model: the OpenAI endpoints through the official `openai` npm client and curl, bad
# requests, oversized and slow bodies, 200 concurrent streams, disconnects, overload (429),
# greedy outputs identical with the prefix cache on and off and alone vs. batched, SIGTERM
# drain, and `gptoss bench-serve` against it. Every wait has a timeout.
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

"$bin" make-model --preset tiny -o "$work/tiny" >/dev/null 2>&1 || { echo "FAIL: make-model"; exit 1; }

# launch NAME MODEL_DIR ARGS... : starts on a free port; sets $port and $pid.
launch() {
  local name=$1 dir=$2; shift 2
  "$bin" serve -m "$dir" --served-model-name tiny --port 0 -t 2 "$@" >"$work/$name.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  port=""
  for _ in $(seq 1 300); do
    port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$work/$name.log" | head -1)
    [ -n "$port" ] && return 0
    sleep 0.1
  done
  fail "$name: no port in log: $(cat "$work/$name.log")"
  return 1
}

# wait_ready NAME : waits for /health 200 on $port.
wait_ready() {
  for _ in $(seq 1 600); do
    [ "$(curl -s -m 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ] && return 0
    sleep 0.1
  done
  fail "$1: /health never answered 200: $(cat "$work/$1.log")"
  return 1
}

# start_server NAME ARGS... : the tiny model, ready to serve.
start_server() {
  local name=$1; shift
  launch "$name" "$work/tiny" "$@" && wait_ready "$name"
}

# stop_server PID NAME : SIGTERM, then expects exit status 0 within 30 s.
stop_server() {
  local p=$1 name=$2
  kill -TERM "$p" 2>/dev/null
  for _ in $(seq 1 300); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$p" 2>/dev/null; then fail "$name: still running 30 s after SIGTERM"; kill -9 "$p"; fi
  wait "$p"; local rc=$?
  [ $rc -eq 0 ] || fail "$name: exit status $rc after SIGTERM: $(tail -5 "$work/$name.log")"
}

node_check() { timeout 240 node "$here/server_client.mjs" "$@" || fail "node client mode $1"; }

# ---- usage errors -----------------------------------------------------------------------
"$bin" serve >"$work/out" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "make-model" "$work/out" || fail "serve without -m: exit $rc, must point at make-model: $(cat "$work/out")"

"$bin" serve -m "$work/missing" --port 0 >"$work/out" 2>&1; rc=$?
[ $rc -eq 1 ] && grep -q "missing" "$work/out" || fail "serve with a missing model folder: exit $rc: $(cat "$work/out")"

# ---- not ready while the weights load: config.json is a FIFO, so loading waits for us ----
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

# ---- server A: prefix cache on, API key, small body limit -------------------------------
start_server a --api-key "$key" --max-body-bytes 262144 || exit 1
a_pid=$pid a_port=$port
a_url="http://127.0.0.1:$a_port"
grep -q "KV cache .* tokens" "$work/a.log" || fail "start-up does not print the KV capacity: $(cat "$work/a.log")"
grep -q "http://127.0.0.1:$a_port" "$work/a.log" || fail "start-up does not print the URL"

# curl: the raw wire format of a stream (SSE framing, [DONE] last)
curl -sN -m 60 "$a_url/v1/chat/completions" -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
  -d '{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}' >"$work/sse.txt"
[ "$(grep -c '^data: ' "$work/sse.txt")" -ge 3 ] || fail "SSE: fewer than 3 data lines: $(head -c 300 "$work/sse.txt")"
[ "$(grep '^data: ' "$work/sse.txt" | tail -1)" = "data: [DONE]" ] || fail "SSE: last event is not [DONE]"
grep -q '"finish_reason":"length"' "$work/sse.txt" || fail "SSE: no finish_reason length"
code=$(curl -s -m 10 -o "$work/m.txt" -w '%{http_code}' "$a_url/metrics")
[ "$code" = 200 ] && grep -q '^# TYPE gptoss:time_to_first_token_seconds histogram' "$work/m.txt" || fail "/metrics: $code"
code=$(curl -s -m 10 -o /dev/null -w '%{http_code}' "$a_url/v1/models")
[ "$code" = 401 ] || fail "/v1/models without key: $code, expected 401"

node_check api "$a_url" "$key" tiny
node_check collect "$a_url" "$key" tiny "$work/with_cache.json"
node_check load "$a_url" "$key" tiny
node_check disconnect "$a_url" "$key" tiny

# bench-serve against server A (short): both endpoints, JSON written
"$bin" bench-serve --url "$a_url" --api-key "$key" --concurrency 1,4 --num-requests 4 --input-len 16 --output-len 4 \
  --json "$work/bench.json" >"$work/bench.txt" 2>&1 || fail "bench-serve failed: $(cat "$work/bench.txt")"
grep -q "output token throughput" "$work/bench.txt" || fail "bench-serve printed no throughput"
node -e '
const j = JSON.parse(require("fs").readFileSync(process.argv[1]));
const ok = j.runs.length === 2 && j.runs.every(r => r.completed === 4 && r.total_output_tokens === 16 && r.total_input_tokens === 64 &&
  r.mean_ttft_ms > 0 && r.p99_itl_ms >= r.median_itl_ms && r.output_throughput > 0);
if (!ok) { console.log(JSON.stringify(j)); process.exit(1); }' "$work/bench.json" || fail "bench-serve JSON wrong"
"$bin" bench-serve --url "$a_url/v1" --api-key "$key" --endpoint chat --request-rate 20 --num-requests 3 --input-len 8 --output-len 3 \
  >"$work/bench2.txt" 2>&1 || fail "bench-serve chat/rate failed: $(cat "$work/bench2.txt")"
grep -q "successful requests *3 / 3" "$work/bench2.txt" || fail "bench-serve chat: $(cat "$work/bench2.txt")"

# ---- server B: prefix cache off; the same greedy requests give the same outputs ---------
start_server b --api-key "$key" --no-prefix-cache || exit 1
b_pid=$pid b_url="http://127.0.0.1:$port"
node_check collect "$b_url" "$key" tiny "$work/without_cache.json"
node -e '
const fs = require("fs");
const a = JSON.parse(fs.readFileSync(process.argv[1])), b = JSON.parse(fs.readFileSync(process.argv[2]));
let bad = 0;
a.forEach((x, i) => { if (x.content !== b[i].content || x.reasoning !== b[i].reasoning) { console.log(`request ${i}: ${JSON.stringify(x)} vs ${JSON.stringify(b[i])}`); bad++; } });
if (!a.some(x => x.cached > 0)) { console.log("prefix cache never hit with the cache on"); bad++; }
if (b.some(x => x.cached > 0)) { console.log("cached tokens reported with the cache off"); bad++; }
process.exit(bad ? 1 : 0);' "$work/with_cache.json" "$work/without_cache.json" || fail "outputs differ with the prefix cache on vs off"
stop_server "$b_pid" b

# ---- SIGTERM drain on server A: an in-flight stream completes, then exit 0 --------------
curl -sN -m 60 "$a_url/v1/completions" -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
  -d '{"model":"tiny","prompt":"drain me","max_tokens":12,"ignore_eos":true,"stream":true}' >"$work/drain.txt" &
curl_pid=$!
sleep 0.5
stop_server "$a_pid" a
wait "$curl_pid"
grep -q '"finish_reason":"length"' "$work/drain.txt" && [ "$(tail -2 "$work/drain.txt" | head -1)" = "data: [DONE]" ] ||
  fail "SIGTERM did not let the in-flight stream finish: $(tail -c 300 "$work/drain.txt")"
grep -q "drained" "$work/a.log" || fail "server A did not report a drain: $(tail -3 "$work/a.log")"

# ---- server C: a tiny queue overflows into 429 and recovers -----------------------------
start_server c --api-key "$key" --max-num-seqs 1 --max-queue 2 || exit 1
c_pid=$pid
node_check overload "http://127.0.0.1:$port" "$key" tiny
stop_server "$c_pid" c

# ---- server D: requests that wait or generate longer than the idle timeout -------------
# One sequence per step and a 1 s idle timeout: a long answer (~2.1 s in a release build, ~45 s
# under the sanitizers and more beside other tests), then a stream and a
# plain request queued behind it for seconds with nothing to send. The idle timeout is for
# clients stalling while they send a request; none of these may be cut off by it.
start_server d --max-num-seqs 1 --idle-timeout 1 || exit 1
d_pid=$pid d_url="http://127.0.0.1:$port"
curl -s -m 400 -o "$work/long.json" -w '%{http_code}' "$d_url/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model":"tiny","prompt":"a long answer","max_tokens":550,"ignore_eos":true}' >"$work/long.code" &
long_pid=$!
sleep 0.3
curl -sN -m 400 "$d_url/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model":"tiny","prompt":"queued stream","max_tokens":4,"ignore_eos":true,"stream":true}' >"$work/queued.txt" &
queued_pid=$!
code=$(curl -s -m 400 -o "$work/queued.json" -w '%{http_code}' "$d_url/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model":"tiny","prompt":"queued plain","max_tokens":4,"ignore_eos":true}')
wait "$long_pid" "$queued_pid"
[ "$(cat "$work/long.code")" = 200 ] && [ "$(node -e 'const j=JSON.parse(require("fs").readFileSync(process.argv[1]));
  console.log(j.usage.completion_tokens)' "$work/long.json")" = 550 ] ||
  fail "a request generating past the idle timeout: $(cat "$work/long.code") $(head -c 300 "$work/long.json")"
[ "$code" = 200 ] && grep -q '"finish_reason":"length"' "$work/queued.json" ||
  fail "a request queued past the idle timeout: $code $(head -c 300 "$work/queued.json")"
grep -q '"finish_reason":"length"' "$work/queued.txt" && [ "$(tail -2 "$work/queued.txt" | head -1)" = "data: [DONE]" ] ||
  fail "a stream queued past the idle timeout: $(tail -c 300 "$work/queued.txt")"
"$bin" serve --idle-timeout 0 >"$work/out" 2>&1
[ $? -eq 2 ] && grep -q "idle-timeout" "$work/out" || fail "serve --idle-timeout 0 is not refused: $(cat "$work/out")"
stop_server "$d_pid" d

if [ $failures -ne 0 ]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "server tests passed"
