#!/usr/bin/env bash
# test_fp8_layers.sh - the --fp8-layers option of run, chat, serve and bench: bad values are
# usage errors (exit 2) naming the option, FP8 layers asked of the CPU backend are refused the
# same way (they are a CUDA option), and `none` is accepted everywhere. What FP8 layers
# compute is checked on the GPU (tests/cuda); here no command gets as far as a GPU.
set -u
bin="${GPTOSS_BIN:?}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$bin" make-model --config "$GPTOSS_SOURCE_DIR/tests/golden/configs/swa.json" -o "$dir/small" >/dev/null 2>&1 ||
    fail "make-model --config swa.json"

# expect_usage NAME ARGS...: exit status 2 and a message naming --fp8-layers
expect_usage() {
    local name="$1"
    shift
    "$bin" "$@" >"$dir/out" 2>"$dir/err"
    local rc=$?
    [ $rc -eq 2 ] || fail "$name: exit $rc, want 2 ($(cat "$dir/err"))"
    grep -q -- "--fp8-layers" "$dir/err" || fail "$name: the error does not name --fp8-layers: $(cat "$dir/err")"
}

for bad in bogus "" "qkv," ",o" "qkv,,o" "QKV" "all,qkv" "lm-head"; do
    expect_usage "run --tokens --fp8-layers '$bad'" run -m "$dir/small" --tokens "1 2 3" -n 1 --fp8-layers "$bad"
    expect_usage "run -p --fp8-layers '$bad'" run -m "$dir/small" -p hi --fp8-layers "$bad"
    expect_usage "chat --fp8-layers '$bad'" chat -m "$dir/small" --fp8-layers "$bad"
    expect_usage "serve --fp8-layers '$bad'" serve -m "$dir/small" --port 0 --fp8-layers "$bad"
    expect_usage "bench --fp8-layers '$bad'" bench --random-weights tiny --fp8-layers "$bad"
done
grep -q "not 'lm-head'" "$dir/err" || fail "the error does not quote the value: $(cat "$dir/err")"

# The CPU backend computes in fp32: any FP8 layer is refused before a backend is created.
for good in qkv o lm_head all "qkv,o" "o,lm_head,qkv"; do
    expect_usage "run --backend cpu --fp8-layers $good" run -m "$dir/small" --tokens "1 2 3" -n 1 --backend cpu --fp8-layers "$good"
    expect_usage "run -p --backend cpu --fp8-layers $good" run -m "$dir/small" -p hi --backend cpu --fp8-layers "$good"
    expect_usage "chat --backend cpu --fp8-layers $good" chat -m "$dir/small" --backend cpu --fp8-layers "$good"
    expect_usage "serve --backend cpu --fp8-layers $good" serve -m "$dir/small" --port 0 --backend cpu --fp8-layers "$good"
done
grep -q "CUDA backend option" "$dir/err" || fail "the CPU refusal does not say why: $(cat "$dir/err")"

# none is the default and works on the CPU backend.
"$bin" run -m "$dir/small" --tokens "1 2 3" -n 2 --backend cpu --fp8-layers none -t 2 >"$dir/ids" 2>"$dir/err" ||
    fail "run --fp8-layers none: $(cat "$dir/err")"
grep -qE '^[0-9]+( [0-9]+)*$' "$dir/ids" || fail "run --fp8-layers none printed: $(cat "$dir/ids")"

# Every command documents the option.
for cmd in "run --tokens x" "run -p x" chat serve bench; do
    # shellcheck disable=SC2086
    "$bin" $cmd --help | grep -q -- "--fp8-layers LIST" || fail "gptoss $cmd --help does not document --fp8-layers"
done
echo "ok: --fp8-layers values checked in run (both paths), chat, serve and bench; refused on the CPU backend"
