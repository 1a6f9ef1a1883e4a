#!/usr/bin/env bash
# test_serve_bench.sh - `gptoss bench-serve` against a live server: both endpoints, fixed
# concurrency levels and a request rate, with a JSON report whose counts are exact.
. "$(dirname "$0")/serve_lib.sh"
make_tiny

start_server a --api-key "$key" || exit 1
a_pid=$pid a_url="http://127.0.0.1:$port"
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
# --response-format: sent on every request (a plain-text format here: the server accepts it)
echo '{"type": "text"}' >"$work/format.json"
"$bin" bench-serve --url "$a_url" --api-key "$key" --endpoint chat --concurrency 2 --num-requests 2 --input-len 8 --output-len 3 \
  --response-format "$work/format.json" >"$work/bench3.txt" 2>&1 || fail "bench-serve --response-format: $(cat "$work/bench3.txt")"
grep -q "successful requests *2 / 2" "$work/bench3.txt" || fail "bench-serve --response-format: $(cat "$work/bench3.txt")"
echo '[1]' >"$work/bad-format.json"
"$bin" bench-serve --url "$a_url" --api-key "$key" --endpoint chat --concurrency 1 --num-requests 1 --input-len 8 --output-len 3 \
  --response-format "$work/bad-format.json" >"$work/bench4.txt" 2>&1 && fail "bench-serve took a response_format that is not an object"
grep -q "expected a JSON object" "$work/bench4.txt" || fail "bench-serve bad --response-format: $(cat "$work/bench4.txt")"
stop_server "$a_pid" a

finish
