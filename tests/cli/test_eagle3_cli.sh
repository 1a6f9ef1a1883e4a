#!/usr/bin/env bash
# test_eagle3_cli.sh - EAGLE3 drafting from the command line: make-model writes a random head
# for the tiny target; run --tokens gives the same ids with --draft eagle3 as without (greedy
# and seeded sampling) on the CPU backend; a missing, broken or mismatched head is an error
# naming the problem; run, chat, serve and bench --engine document --draft-model; bench
# --engine runs eagle3 rows. Exactness itself is tested in tests/engine/test_eagle3_draft.c.
set -u
bin="${GPTOSS_BIN:?}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$bin" make-model --preset tiny -o "$dir/t" >/dev/null 2>&1 || fail "make-model tiny"
"$bin" make-model --preset eagle3-tiny -o "$dir/h" >"$dir/out" 2>&1 || fail "make-model eagle3-tiny: $(cat "$dir/out")"
grep -q "EAGLE3 head" "$dir/out" || fail "make-model eagle3-tiny said: $(cat "$dir/out")"
grep -q '"LlamaForCausalLMEagle3"' "$dir/h/config.json" || fail "no architectures in the head config"
"$bin" make-model --config "$GPTOSS_SOURCE_DIR/tests/support/micro_vocab.json" -o "$dir/m" \
    >/dev/null 2>&1 || fail "make-model micro"

prompt="5 6 7 8 5 6 7 8 5 6 7 8 5 6 900 901 902"
for sampling in "" "--temperature 1 --top-p 0.9 --seed 11"; do
    # shellcheck disable=SC2086
    want="$("$bin" run -m "$dir/t" --backend cpu --tokens "$prompt" -n 30 --ignore-eos $sampling 2>/dev/null)" ||
        fail "run without drafts"
    [ -n "$want" ] || fail "run printed nothing"
    ks="1 4"
    [ "${GPTOSS_SANITIZE:-0}" = 1 ] && ks=4 # several times slower there: the release pass runs both
    for k in $ks; do
        # shellcheck disable=SC2086
        got="$("$bin" run -m "$dir/t" --backend cpu --tokens "$prompt" -n 30 --ignore-eos $sampling \
            --draft eagle3 --draft-model "$dir/h" --num-speculative-tokens $k 2>"$dir/err")" ||
            fail "run --draft eagle3 -k $k: $(cat "$dir/err")"
        [ "$got" = "$want" ] || fail "run --draft eagle3 k=$k ($sampling): '$got', without drafts '$want'"
    done
done

expect_error() { # NAME TEXT ARGS...
    local name="$1" text="$2"
    shift 2
    "$bin" "$@" >"$dir/out" 2>"$dir/err" </dev/null
    local rc=$?
    [ $rc -ne 0 ] || fail "$name: succeeded"
    [ $rc -lt 128 ] || fail "$name: crashed ($rc)"
    grep -q -- "$text" "$dir/err" || fail "$name: the error does not say '$text': $(cat "$dir/err")"
}
expect_error "no --draft-model" "--draft-model" run -m "$dir/t" --backend cpu --tokens 1 --draft eagle3
expect_error "no head folder" "config.json" run -m "$dir/t" --backend cpu --tokens 1 \
    --draft eagle3 --draft-model "$dir/none"
expect_error "vocabulary mismatch" "201088" run -m "$dir/m" --backend cpu --tokens 1 \
    --draft eagle3 --draft-model "$dir/h"
mkdir "$dir/broken" && cp "$dir/h/config.json" "$dir/broken/" &&
    head -c 1000 "$dir/h/model.safetensors" >"$dir/broken/model.safetensors"
expect_error "truncated head" "model.safetensors" run -m "$dir/t" --backend cpu --tokens 1 \
    --draft eagle3 --draft-model "$dir/broken"
expect_error "unknown head preset" "eagle3-7b" make-model --preset eagle3-7b -o "$dir/x"

for cmd in "run" "chat" "serve" "bench --engine"; do
    # shellcheck disable=SC2086
    "$bin" $cmd --help >"$dir/help" 2>&1 || fail "$cmd --help"
    grep -q -- "--draft-model" "$dir/help" || fail "$cmd --help does not document --draft-model"
    grep -q -- "eagle3" "$dir/help" || fail "$cmd --help does not name eagle3"
done

"$bin" bench --engine -m "$dir/t" --backend cpu -p 8 -n 12 -k 2 -r 1 --draft eagle3 \
    --draft-model "$dir/h" >"$dir/bench" 2>&1 || fail "bench --engine --draft eagle3: $(cat "$dir/bench")"
grep -q "^| 1 | eagle3 | 2 |" "$dir/bench" || fail "no eagle3 row: $(cat "$dir/bench")"
echo "ok"
