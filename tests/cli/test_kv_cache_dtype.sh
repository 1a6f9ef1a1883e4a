#!/usr/bin/env bash
# test_kv_cache_dtype.sh - the --kv-cache-dtype option of run, chat, serve and bench: bf16 and
# fp8 are accepted everywhere, anything else is a usage error (exit 2) naming the option and
# quoting the value, every command documents it, and the value reaches the backend: on the
# CPU backend (which emulates an FP8 cache) fp8 changes the logits `run --logits` dumps,
# `run -p` generates with it, and `serve` says so at start-up and answers a completion. What
# an FP8 cache computes is checked in tests/backend (CPU) and tests/cuda (GPU).
set -u
bin="${GPTOSS_BIN:?}"
dir="$(mktemp -d)"
server_pid=""
trap '[ -n "$server_pid" ] && kill -9 "$server_pid" 2>/dev/null; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$bin" make-model --config "$GPTOSS_SOURCE_DIR/tests/golden/configs/swa.json" -o "$dir/small" >/dev/null 2>&1 ||
    fail "make-model --config swa.json"
"$bin" make-model --preset tiny -o "$dir/tiny" >/dev/null 2>&1 || fail "make-model --preset tiny"

# expect_usage NAME ARGS...: exit status 2 and a message naming --kv-cache-dtype
expect_usage() {
    local name="$1"
    shift
    "$bin" "$@" >"$dir/out" 2>"$dir/err" </dev/null
    local rc=$?
    [ $rc -eq 2 ] || fail "$name: exit $rc, want 2 ($(cat "$dir/err"))"
    grep -q -- "--kv-cache-dtype" "$dir/err" || fail "$name: the error does not name --kv-cache-dtype: $(cat "$dir/err")"
}

for bad in bogus "" FP8 BF16 fp16 e4m3 "fp8,bf16" " fp8" "fp8 "; do
    expect_usage "run --tokens '$bad'" run -m "$dir/small" --tokens "1 2 3" -n 1 --kv-cache-dtype "$bad"
    expect_usage "run -p '$bad'" run -m "$dir/small" -p hi --kv-cache-dtype "$bad"
    expect_usage "chat '$bad'" chat -m "$dir/small" --kv-cache-dtype "$bad"
    expect_usage "serve '$bad'" serve -m "$dir/small" --port 0 --kv-cache-dtype "$bad"
    expect_usage "bench '$bad'" bench --random-weights tiny --kv-cache-dtype "$bad"
done
grep -q "bf16 or fp8, not 'fp8 '" "$dir/err" || fail "the error does not quote the value: $(cat "$dir/err")"

# The option without its value is an incomplete option, as for every other option.
for cmd in "run -m $dir/small --tokens 1" "run -m $dir/small -p hi" "chat -m $dir/small" "serve -m $dir/small" \
    "bench --random-weights tiny"; do
    # shellcheck disable=SC2086
    "$bin" $cmd --kv-cache-dtype >/dev/null 2>"$dir/err" </dev/null
    rc=$?
    [ $rc -eq 2 ] || fail "gptoss $cmd --kv-cache-dtype (no value): exit $rc, want 2"
    grep -q -- "--kv-cache-dtype" "$dir/err" || fail "gptoss $cmd --kv-cache-dtype: $(cat "$dir/err")"
done

# Both values are accepted: run --tokens prints ids; the logits differ between the two (the
# CPU backend rounds K and V through e4m3 with fp8) but are the same for bf16 and the default.
for dtype in bf16 fp8; do
    "$bin" run -m "$dir/small" --tokens "5 17 300 42 7 99 1 250 13 8 64 51 3 77 91 2 33 400" -n 4 --backend cpu -t 2 \
        --kv-cache-dtype $dtype --logits "$dir/logits-$dtype" >"$dir/ids-$dtype" 2>"$dir/err" ||
        fail "run --kv-cache-dtype $dtype: $(cat "$dir/err")"
    grep -qE '^[0-9]+( [0-9]+)*$' "$dir/ids-$dtype" || fail "run --kv-cache-dtype $dtype printed: $(cat "$dir/ids-$dtype")"
done
"$bin" run -m "$dir/small" --tokens "5 17 300 42 7 99 1 250 13 8 64 51 3 77 91 2 33 400" -n 0 --backend cpu -t 2 \
    --logits "$dir/logits-default" >/dev/null 2>"$dir/err" || fail "run (default cache): $(cat "$dir/err")"
cmp -s "$dir/logits-default" "$dir/logits-bf16" || fail "--kv-cache-dtype bf16 is not the default"
cmp -s "$dir/logits-bf16" "$dir/logits-fp8" && fail "--kv-cache-dtype fp8 did not change the logits"

# The chat path: run -p generates with an FP8 cache; a model too small for text fails for
# that reason (exit 1), not because of the option.
"$bin" run -m "$dir/tiny" -p "Hello there" -n 4 --date 2025-06-28 -t 2 --backend cpu --kv-cache-dtype fp8 \
    >"$dir/out" 2>"$dir/err" || fail "run -p --kv-cache-dtype fp8: $(cat "$dir/err")"
grep -qE '^finish: (length|stop|tool_calls); [0-9]+ tokens' "$dir/err" || fail "run -p fp8: no finish line: $(cat "$dir/err")"
"$bin" chat -m "$dir/small" --backend cpu --kv-cache-dtype fp8 </dev/null >/dev/null 2>"$dir/err"
rc=$?
[ $rc -eq 1 ] && grep -q "vocab_size" "$dir/err" || fail "chat --kv-cache-dtype fp8 on a small model: exit $rc: $(cat "$dir/err")"

# bench accepts both values (it then runs on a GPU, or says why it cannot: exit 1, not 2).
for dtype in bf16 fp8; do
    "$bin" bench --random-weights tiny -p 16 -n 4 -r 1 --kv-cache-dtype $dtype >/dev/null 2>"$dir/err"
    rc=$?
    [ $rc -ne 2 ] && ! grep -q -- "--kv-cache-dtype" "$dir/err" || fail "bench --kv-cache-dtype $dtype: exit $rc: $(cat "$dir/err")"
done

# serve: the start-up line says what the pages hold, and a completion is served.
"$bin" serve -m "$dir/tiny" --backend cpu --port 0 -t 2 --kv-blocks 64 --kv-cache-dtype fp8 >"$dir/serve.log" 2>&1 &
server_pid=$!
port=""
for _ in $(seq 1 300); do
    grep -q " serve: ready in" "$dir/serve.log" && break
    kill -0 "$server_pid" 2>/dev/null || fail "serve --kv-cache-dtype fp8 exited: $(cat "$dir/serve.log")"
    sleep 0.1
done
port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$dir/serve.log" | head -1)
[ -n "$port" ] && grep -q " serve: ready in" "$dir/serve.log" || fail "serve did not become ready: $(cat "$dir/serve.log")"
grep -q "KV cache (fp8 emulated in fp32 pages) 64 blocks x 16 tokens = 1024 tokens" "$dir/serve.log" ||
    fail "serve start-up does not name the FP8 cache: $(cat "$dir/serve.log")"
code=$(curl -s -m 30 -o "$dir/reply.json" -w '%{http_code}' "http://127.0.0.1:$port/v1/completions" \
    -H 'Content-Type: application/json' -d '{"model":"tiny","prompt":"Hello","max_tokens":4}')
[ "$code" = 200 ] && grep -q '"choices"' "$dir/reply.json" || fail "completion with an FP8 cache: $code $(cat "$dir/reply.json")"
kill -TERM "$server_pid"
wait "$server_pid" 2>/dev/null
server_pid=""

# Every command documents the option.
for cmd in "run --tokens x" "run -p x" chat serve bench; do
    # shellcheck disable=SC2086
    "$bin" $cmd --help | grep -q -- "--kv-cache-dtype bf16|fp8" || fail "gptoss $cmd --help does not document --kv-cache-dtype"
done
echo "ok: --kv-cache-dtype values checked in run (both paths), chat, serve and bench; fp8 reaches the CPU backend"
