#!/usr/bin/env bash
# test_make_model_force.sh - make-model writes into a new or empty folder, refuses one that
# holds anything (leaving its files as they were) unless --force, which writes the checkpoint
# over them.
. "$(dirname "$0")/cli_lib.sh"
"$bin" make-model --preset tiny -o "$work/new/tiny" --no-tokenizer >/dev/null 2>&1 ||
    fail "make-model into a new folder"
[ -f "$work/new/tiny/config.json" ] || fail "no config.json in the new folder"
mkdir -p "$work/empty"
"$bin" make-model --preset tiny -o "$work/empty" --no-tokenizer >/dev/null 2>&1 ||
    fail "make-model into an empty folder"

# A folder with someone's config.json: refused, the file unchanged.
mkdir -p "$work/mine"
printf '{"mine": true}\n' >"$work/mine/config.json"
"$bin" make-model --preset tiny -o "$work/mine" --no-tokenizer >"$work/out" 2>&1
rc=$?
[ $rc -eq 1 ] || fail "a non-empty folder: exit $rc, want 1"
grep -q "$work/mine is not empty (it holds config.json).*--force" "$work/out" || fail "message: $(cat "$work/out")"
[ "$(cat "$work/mine/config.json")" = '{"mine": true}' ] || fail "config.json was overwritten without --force"
[ "$(ls "$work/mine")" = config.json ] || fail "files were written without --force: $(ls "$work/mine")"
# The same over an earlier checkpoint.
"$bin" make-model --preset tiny -o "$work/new/tiny" --no-tokenizer >/dev/null 2>&1 &&
    fail "make-model over a checkpoint without --force succeeded"

# --force writes the checkpoint over the folder's files.
"$bin" make-model --preset tiny -o "$work/mine" --no-tokenizer --force >"$work/out" 2>&1 ||
    fail "--force: $(cat "$work/out")"
grep -q '"num_hidden_layers"' "$work/mine/config.json" || fail "--force did not write config.json"
"$bin" make-model --help | grep -q -- '--force' || fail "make-model --help does not document --force"
finish
