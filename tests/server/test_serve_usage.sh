#!/usr/bin/env bash
# test_serve_usage.sh - `gptoss serve` refuses bad command lines with exit status 2 (1 for a
# missing model folder) and a message that says what to do.
. "$(dirname "$0")/serve_lib.sh"

"$bin" serve >"$work/out" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "make-model" "$work/out" || fail "serve without -m: exit $rc, must point at make-model: $(cat "$work/out")"

"$bin" serve -m "$work/missing" --port 0 >"$work/out" 2>&1; rc=$?
[ $rc -eq 1 ] && grep -q "missing" "$work/out" || fail "serve with a missing model folder: exit $rc: $(cat "$work/out")"

"$bin" serve --idle-timeout 0 >"$work/out" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "idle-timeout" "$work/out" || fail "serve --idle-timeout 0 is not refused: $(cat "$work/out")"

finish
