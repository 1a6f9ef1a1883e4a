#!/usr/bin/env bash
# test_cuda_profile.sh - the --cuda-profile and --weights-in-host-memory options of run, chat,
# serve and bench: a bad profile is a usage error (exit 2) naming the option and its values,
# both options asked of the CPU backend are refused the same way (they are CUDA options),
# --cuda-profile auto is accepted everywhere, and every command documents both. What the
# profiles choose is checked on the GPU (scripts/gpu-check --profile); the profile logic
# itself in tests/backend/test_cuda_profile.c.
set -u
bin="${GPTOSS_BIN:?}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$bin" make-model --config "$GPTOSS_SOURCE_DIR/tests/golden/configs/swa.json" -o "$dir/small" >/dev/null 2>&1 ||
    fail "make-model --config swa.json"

# expect_usage NAME NEEDLE ARGS...: exit status 2 and a message containing NEEDLE
expect_usage() {
    local name="$1" needle="$2"
    shift 2
    "$bin" "$@" >"$dir/out" 2>"$dir/err"
    local rc=$?
    [ $rc -eq 2 ] || fail "$name: exit $rc, want 2 ($(cat "$dir/err"))"
    grep -q -- "$needle" "$dir/err" || fail "$name: the error does not say '$needle': $(cat "$dir/err")"
}

for bad in volta Ampere "" "ampere,ada" 80; do
    expect_usage "run --cuda-profile '$bad'" "--cuda-profile must be auto, ampere, ada or hopper" \
        run -m "$dir/small" --tokens "1 2 3" -n 1 --cuda-profile "$bad"
    expect_usage "run -p --cuda-profile '$bad'" "--cuda-profile" run -m "$dir/small" -p hi --cuda-profile "$bad"
    expect_usage "chat --cuda-profile '$bad'" "--cuda-profile" chat -m "$dir/small" --cuda-profile "$bad"
    expect_usage "serve --cuda-profile '$bad'" "--cuda-profile" serve -m "$dir/small" --port 0 --cuda-profile "$bad"
    expect_usage "bench --cuda-profile '$bad'" "--cuda-profile" bench --random-weights tiny --cuda-profile "$bad"
done

# The CPU backend has no kernel profiles and no device memory: both options are refused.
for p in ampere ada hopper; do
    expect_usage "run --backend cpu --cuda-profile $p" "CUDA backend option" \
        run -m "$dir/small" --tokens "1 2 3" -n 1 --backend cpu --cuda-profile $p
    expect_usage "serve --backend cpu --cuda-profile $p" "--cuda-profile is a CUDA backend option" \
        serve -m "$dir/small" --port 0 --backend cpu --cuda-profile $p
    expect_usage "chat --backend cpu --cuda-profile $p" "--cuda-profile" chat -m "$dir/small" --backend cpu --cuda-profile $p
done
expect_usage "run --backend cpu --weights-in-host-memory" "--weights-in-host-memory is a CUDA backend option" \
    run -m "$dir/small" --tokens "1 2 3" -n 1 --backend cpu --weights-in-host-memory
expect_usage "serve --backend cpu --weights-in-host-memory" "--weights-in-host-memory" \
    serve -m "$dir/small" --port 0 --backend cpu --weights-in-host-memory

# auto is the default and works on the CPU backend.
"$bin" run -m "$dir/small" --tokens "1 2 3" -n 2 --backend cpu --cuda-profile auto -t 2 >"$dir/ids" 2>"$dir/err" ||
    fail "run --cuda-profile auto: $(cat "$dir/err")"
grep -qE '^[0-9]+( [0-9]+)*$' "$dir/ids" || fail "run --cuda-profile auto printed: $(cat "$dir/ids")"

# Every command documents both options, the profiles by name.
for cmd in "run --tokens x" "run -p x" chat serve bench; do
    # shellcheck disable=SC2086
    "$bin" $cmd --help >"$dir/help" 2>&1
    grep -q -- "--cuda-profile auto|ampere|ada|hopper" "$dir/help" ||
        fail "gptoss $cmd --help does not document --cuda-profile: $(grep -- cuda "$dir/help")"
    grep -q "ampere (A100" "$dir/help" || fail "gptoss $cmd --help does not say what ampere is"
    grep -q -- "--weights-in-host-memory" "$dir/help" ||
        fail "gptoss $cmd --help does not document --weights-in-host-memory"
done
echo "ok: --cuda-profile values checked in run (both paths), chat, serve and bench; both options refused on the CPU backend; documented everywhere"
