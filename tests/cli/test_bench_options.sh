#!/usr/bin/env bash
# test_bench_options.sh - `gptoss bench` option checking: bad lists for -p, -n, -d and -b are
# usage errors (exit 2) that name the option, and --help documents the decode batch option.
# Whether a measurement is right needs a GPU (scripts/gpu-check); nothing here gets that far.
set -u
bin="${GPTOSS_BIN:?}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# expect_usage OPTION ARGS...: exit status 2 and a message naming OPTION
expect_usage() {
    local opt="$1"
    shift
    "$bin" bench --random-weights tiny "$@" >"$dir/out" 2>"$dir/err"
    local rc=$?
    [ $rc -eq 2 ] || fail "bench $*: exit $rc, want 2 ($(cat "$dir/err"))"
    grep -q -- "$opt" "$dir/err" || fail "bench $*: the error does not name $opt: $(cat "$dir/err")"
}

for bad in 0 -1 1025 x "" "1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17"; do
    expect_usage -b -b "$bad"
    expect_usage -b --batch "$bad"
done
expect_usage -p -p 0
expect_usage -n -n 65537
expect_usage -d -d -5
"$bin" bench --random-weights tiny -b >"$dir/out" 2>"$dir/err"
[ $? -eq 2 ] || fail "bench -b without a value: want exit 2"

"$bin" bench --help >"$dir/help" 2>&1 || fail "bench --help failed"
grep -q -- "-b, --batch LIST" "$dir/help" || fail "bench --help does not list -b, --batch"
echo "ok: bench option lists checked (-p, -n, -d, -b)"
