#!/usr/bin/env bash
# test_max_model_len.sh - serve's --max-model-len: by default the model's context (the tiny
# model's config says 131072, as gpt-oss's does), capped only by what the KV cache holds, with
# a start-up line saying so when it is; an explicit value beyond the model's context is lowered
# to it with a warning. /v1/models reports what is in force, and a prompt longer than 8192
# tokens (an old fixed default) is served.
. "$(dirname "$0")/cli_lib.sh"
"$bin" make-model --preset tiny -o "$work/tiny" >/dev/null 2>&1 || { fail "make-model"; finish; }
context=$(sed -n 's/.*"max_position_embeddings": *\([0-9]*\).*/\1/p' "$work/tiny/config.json")
[ "$context" = 131072 ] || fail "the tiny config's context is '$context', not 131072"

# max_len: max_model_len from /v1/models.
max_len() { models | sed -n 's/.*"max_model_len":\([0-9]*\).*/\1/p'; }

# 1. Default, on a cache that holds the whole context (CPU: 8192 pages of 16 tokens).
if start_serve "$work/default.log" "$bin" -m "$work/tiny" --kv-blocks 8192; then
    [ "$(max_len)" = 131072 ] || fail "default: max_model_len $(max_len), want 131072"
    grep -q "context 131072$" "$work/default.log" || fail "default: start-up line: $(cat "$work/default.log")"
    grep -q "max model length" "$work/default.log" && fail "default: a cap was logged: $(cat "$work/default.log")"
    # 8200 prompt tokens (ids 100..1099 repeated) and one generated token. Not under the
    # sanitizers: the prefill alone takes minutes there, and it tests no memory handling the
    # shorter requests of the suite do not.
    if [ "$slow" -eq 1 ]; then
        ids=$(seq 0 8199 | awk '{printf "%s%d", (NR > 1 ? "," : ""), 100 + $1 % 1000}')
        printf '{"model":"tiny","prompt":[%s],"max_tokens":1}' "$ids" >"$work/long.json"
        code=$(curl -s -m 300 -o "$work/long.out" -w '%{http_code}' \
            "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' -d @"$work/long.json")
        [ "$code" = 200 ] && grep -q '"prompt_tokens":8200' "$work/long.out" ||
            fail "an 8200-token prompt: $code $(head -c 300 "$work/long.out")"
    fi
    stop_serve
else
    fail "default server did not start"
fi

# 2. A cache of 64 pages (1024 tokens): the KV cache is the limit, and the log says so.
if start_serve "$work/small.log" "$bin" -m "$work/tiny" --kv-blocks 64; then
    [ "$(max_len)" = 1024 ] || fail "64 pages: max_model_len $(max_len), want 1024"
    grep -qE "INFO  serve: max model length 1024, not 131072: that is all the KV cache holds" "$work/small.log" ||
        fail "64 pages: no INFO line about the cap: $(cat "$work/small.log")"
    grep -q "context 1024$" "$work/small.log" || fail "64 pages: start-up line: $(cat "$work/small.log")"
    stop_serve
else
    fail "64-page server did not start"
fi

# 3. Explicit values: beyond the model's context (lowered, warned); beyond the cache (warned).
if start_serve "$work/big.log" "$bin" -m "$work/tiny" --kv-blocks 8192 --max-model-len 200000; then
    [ "$(max_len)" = 131072 ] || fail "--max-model-len 200000: max_model_len $(max_len), want 131072"
    grep -q "WARN  serve: --max-model-len 200000 is beyond the model's context; using 131072" "$work/big.log" ||
        fail "--max-model-len 200000: no warning: $(cat "$work/big.log")"
    stop_serve
else
    fail "--max-model-len 200000 server did not start"
fi
if start_serve "$work/capped.log" "$bin" -m "$work/tiny" --kv-blocks 64 --max-model-len 5000; then
    [ "$(max_len)" = 1024 ] || fail "--max-model-len 5000 on 64 pages: $(max_len), want 1024"
    grep -q "WARN  serve: max model length 1024, not 5000" "$work/capped.log" ||
        fail "--max-model-len 5000 on 64 pages: no warning: $(cat "$work/capped.log")"
    stop_serve
else
    fail "--max-model-len 5000 server did not start"
fi
if start_serve "$work/short.log" "$bin" -m "$work/tiny" --kv-blocks 64 --max-model-len 300; then
    [ "$(max_len)" = 300 ] || fail "--max-model-len 300: $(max_len)"
    grep -q "max model length" "$work/short.log" && fail "--max-model-len 300 fits, yet a cap was logged"
    stop_serve
else
    fail "--max-model-len 300 server did not start"
fi
finish
