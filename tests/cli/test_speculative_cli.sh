#!/usr/bin/env bash
# test_speculative_cli.sh - speculative decoding from the command line: run --tokens gives the
# same ids with --draft ngram as without (greedy and seeded sampling) on the CPU backend; bad
# --draft / --num-speculative-tokens values are usage errors naming the option; run, chat,
# serve and bench --engine document the options; bench --engine prints its rows, with every
# draft accepted at P = 1 and none at P = 0. Exactness itself is tested in
# tests/engine/test_speculative.c.
set -u
bin="${GPTOSS_BIN:?}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$bin" make-model --config "$GPTOSS_SOURCE_DIR/tests/support/micro_vocab.json" -o "$dir/m" \
    >/dev/null 2>&1 || fail "make-model"
prompt="5 6 7 8 5 6 7 8 5 6 7 8 5 6"

for sampling in "" "--temperature 1 --top-p 0.9 --seed 11"; do
    # shellcheck disable=SC2086
    want="$("$bin" run -m "$dir/m" --backend cpu --tokens "$prompt" -n 40 --ignore-eos $sampling 2>/dev/null)" ||
        fail "run without drafts"
    [ -n "$want" ] || fail "run printed nothing"
    for k in 1 3 7; do
        # shellcheck disable=SC2086
        got="$("$bin" run -m "$dir/m" --backend cpu --tokens "$prompt" -n 40 --ignore-eos $sampling \
            --draft ngram --num-speculative-tokens $k 2>/dev/null)" || fail "run --draft ngram -k $k"
        [ "$got" = "$want" ] || fail "run --draft ngram k=$k ($sampling): '$got', without drafts '$want'"
    done
done

expect_usage() { # NAME OPTION ARGS...
    local name="$1" option="$2"
    shift 2
    "$bin" "$@" >"$dir/out" 2>"$dir/err" </dev/null
    local rc=$?
    [ $rc -eq 2 ] || fail "$name: exit $rc, want 2 ($(cat "$dir/err"))"
    grep -q -- "$option" "$dir/err" || fail "$name: the error does not name $option: $(cat "$dir/err")"
}
expect_usage "run --draft bogus" --draft run -m "$dir/m" --tokens 1 --draft bogus
expect_usage "run --draft replay" --draft run -m "$dir/m" --tokens 1 --draft replay
expect_usage "serve --draft bogus" --draft serve -m "$dir/m" --draft bogus
expect_usage "chat -k 8" --num-speculative-tokens chat -m "$dir/m" --num-speculative-tokens 8
expect_usage "run -k 0" --num-speculative-tokens run -m "$dir/m" --tokens 1 --num-speculative-tokens 0
expect_usage "bench -k 9" -k bench --engine -m "$dir/m" -k 9
expect_usage "bench --accept 2" --accept bench --engine -m "$dir/m" --accept 0,2

for cmd in "run" "chat" "serve" "bench --engine"; do
    # shellcheck disable=SC2086
    "$bin" $cmd --help >"$dir/help" 2>&1 || fail "$cmd --help"
    grep -q -- "--draft" "$dir/help" || fail "$cmd --help does not document --draft"
    grep -q -- "--num-speculative-tokens" "$dir/help" || fail "$cmd --help: no --num-speculative-tokens"
done

"$bin" bench --engine -m "$dir/m" --backend cpu -p 8 -n 12 -k 2 --accept 0,1 -r 1 >"$dir/bench" 2>&1 ||
    fail "bench --engine: $(cat "$dir/bench")"
grep -q "^| 1 | none | - | - |" "$dir/bench" || fail "no baseline row: $(cat "$dir/bench")"
grep -q "^| 1 | replay | 2 | 1.00 | .* | 100% | [0-9.]* | same |$" "$dir/bench" ||
    fail "P=1 is not all accepted: $(cat "$dir/bench")"
grep -q "^| 1 | replay | 2 | 0.00 | .* | 0% | [0-9.]* | same |$" "$dir/bench" ||
    fail "P=0 accepted something: $(cat "$dir/bench")"
# drafting is exact on the CPU backend: every row's outputs equal the run without drafts
[ "$(grep -c '^| 1 | .* | same |$' "$dir/bench")" = 3 ] || fail "outputs differ: $(cat "$dir/bench")"
echo "ok"
