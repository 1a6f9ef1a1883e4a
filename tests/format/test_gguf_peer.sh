#!/usr/bin/env bash
# test_gguf_peer.sh - files written by `gptoss convert --to gguf` read by @huggingface/gguf, an
# independent parser (gguf_peer.mjs checks metadata, tokenizer, tensor infos and bytes against
# the source folder); and the CLI around GGUF files: info, run, tokenize and the errors of
# convert.
set -u
bin=${GPTOSS_BIN:?run through ctest}
src=${GPTOSS_SOURCE_DIR:?run through ctest}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

for cfg in tests/golden/configs/moe.json; do
  name=$(basename "$cfg" .json)
  "$bin" make-model --config "$src/$cfg" -o "$work/$name" --seed 3 >/dev/null 2>"$work/err" ||
    { fail "make-model $name: $(cat "$work/err")"; continue; }
  "$bin" convert --to gguf -m "$work/$name" -o "$work/$name.gguf" 2>"$work/err" ||
    { fail "convert $name: $(cat "$work/err")"; continue; }
  (cd "$src" && node tests/format/gguf_peer.mjs "$work/$name" "$work/$name.gguf") ||
    fail "gguf_peer.mjs on $name"
done

# info reads both forms and reports the same tensors.
"$bin" info -m "$work/moe" --tensors >"$work/info_dir" 2>/dev/null || fail "info on the folder"
"$bin" info -m "$work/moe.gguf" --tensors >"$work/info_gguf" 2>/dev/null || fail "info on the GGUF"
diff <(tail -n +2 "$work/info_dir") <(tail -n +2 "$work/info_gguf") >/dev/null ||
  fail "info differs between the folder and the GGUF: $(diff "$work/info_dir" "$work/info_gguf" | head -5)"
grep -q "(GGUF file)" "$work/info_gguf" || fail "info does not say the file is GGUF"

# run: the same generated ids from both.
a=$("$bin" run -m "$work/moe" --tokens "1 2 3 4" -n 8 --backend cpu 2>/dev/null)
b=$("$bin" run -m "$work/moe.gguf" --tokens "1 2 3 4" -n 8 --backend cpu 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] || fail "run: '$a' from the folder, '$b' from the GGUF"

# tokenize with the GGUF alone (no tokenizer.json beside it).
mkdir "$work/alone" && cp "$work/moe.gguf" "$work/alone/m.gguf"
a=$(printf 'Hello <|start|>world' | "$bin" tokenize -m "$work/moe" --special 2>&1)
b=$(printf 'Hello <|start|>world' | "$bin" tokenize -m "$work/alone/m.gguf" --special 2>&1)
[ "$a" = "$b" ] || fail "tokenize: '$a' vs '$b'"

# Errors.
"$bin" convert --to gguf -m "$work/nope" -o "$work/x.gguf" >/dev/null 2>"$work/err" &&
  fail "convert of a missing folder succeeded"
"$bin" convert -m "$work/moe" -o "$work/x.gguf" >/dev/null 2>"$work/err"
[ $? -eq 2 ] || fail "convert without --to: expected a usage error"
printf 'not gguf at all' >"$work/bad.gguf"
"$bin" info -m "$work/bad.gguf" >/dev/null 2>"$work/err" && fail "info accepted a non-GGUF file"
grep -q "neither a model folder" "$work/err" || fail "info on a non-GGUF file: $(cat "$work/err")"
head -c 100000 "$work/moe.gguf" >"$work/cut.gguf"
"$bin" info -m "$work/cut.gguf" >/dev/null 2>"$work/err" && fail "info accepted a truncated file"
grep -q "truncated" "$work/err" || fail "truncated file: $(cat "$work/err")"

[ $failures -eq 0 ] && echo "test_gguf_peer: ok"
exit $((failures > 0))
