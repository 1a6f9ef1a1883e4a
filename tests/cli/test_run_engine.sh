#!/usr/bin/env bash
# test_run_engine.sh - `gptoss run` generates through the engine. At temperature 0 (the
# default) its ids are, step by step, the argmax of the CPU backend's logits, computed here
# from `run -n 0 --logits` dumps of the growing prompt (no engine, no sampler): for the ids
# path over the whole vocabulary, and for the text path (--raw) over the ids the tokenizer
# can decode, stopping after a harmony stop id, its text compared with `gptoss detokenize`.
# --seed makes sampled output repeat, in both paths; another seed changes it.
set -u
bin="${GPTOSS_BIN:?}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$bin" make-model --preset tiny -o "$dir/tiny" >/dev/null 2>&1 || fail "make-model --preset tiny"
m="$dir/tiny"
run() { "$bin" run -m "$m" --backend cpu -t 2 "$@"; }

# argmax FILE LIMIT: the id of the largest logit of the dump's last row among ids < LIMIT
# (the lowest id on ties).
argmax() {
    node -e '
const fs = require("fs");
const buf = fs.readFileSync(process.argv[1]);
const nl = buf.indexOf(10);
const [rows, vocab] = JSON.parse(buf.subarray(0, nl).toString()).shape;
const data = buf.subarray(nl + 1);
const f = new Float32Array(data.buffer.slice(data.byteOffset, data.byteOffset + data.length));
const limit = Math.min(vocab, Number(process.argv[2]));
const row = f.subarray((rows - 1) * vocab, rows * vocab);
let best = 0;
for (let v = 1; v < limit; v++) if (row[v] > row[best]) best = v;
console.log(best);' "$1" "$2"
}

# greedy_reference LIMIT STEPS STOP IDS...: the argmax continuation of IDS.
greedy_reference() {
    local limit=$1 steps=$2 stop=$3
    shift 3
    local ids="$*" out="" tok
    for _ in $(seq 1 "$steps"); do
        run --tokens "$ids" -n 0 --logits "$dir/logits" >/dev/null 2>"$dir/err" || fail "run --logits: $(cat "$dir/err")"
        tok=$(argmax "$dir/logits" "$limit") || fail "argmax"
        ids="$ids $tok"
        out="${out:+$out }$tok"
        [ "$stop" = 1 ] && case " 199999 200002 200012 " in *" $tok "*) break ;; esac
    done
    echo "$out"
}

# 1. The ids path at temperature 0 (default and explicit) is the step-by-step argmax.
prompt="200006 1428 200008 12194 1023"
want=$(greedy_reference 1000000 5 0 $prompt)
got=$(run --tokens "$prompt" -n 5 --ignore-eos 2>"$dir/err") || fail "run --tokens: $(cat "$dir/err")"
[ "$got" = "$want" ] || fail "run --tokens greedy: '$got', the logits' argmax: '$want'"
got=$(run --tokens "$prompt" -n 5 --ignore-eos --temperature 0 2>/dev/null)
[ "$got" = "$want" ] || fail "run --tokens --temperature 0: '$got', want '$want'"

# 2. The text path: the same rule over the tokenizer's ids, ending after a stop id.
n_ids=$(node -e '
const t = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
let n = 0;
for (const id of Object.values(t.model.vocab)) n = Math.max(n, id + 1);
for (const a of t.added_tokens) n = Math.max(n, a.id + 1);
console.log(n);' "$m/tokenizer.json")
text_ids=$(printf 'Hello there' | "$bin" tokenize -m "$m") || fail "tokenize"
want_ids=$(greedy_reference "$n_ids" 5 1 $text_ids)
echo "$want_ids" | "$bin" detokenize -m "$m" >"$dir/want.txt" || fail "detokenize $want_ids"
echo >>"$dir/want.txt"
tr '\000-\010\013-\037\177' '?' <"$dir/want.txt" >"$dir/want"
run --raw -p "Hello there" -n 5 >"$dir/got" 2>"$dir/err" || fail "run --raw: $(cat "$dir/err")"
cmp -s "$dir/got" "$dir/want" || fail "run --raw greedy: '$(cat "$dir/got")', the logits' argmax ($want_ids): '$(cat "$dir/want")'"

# 3. A seed repeats a sampled run; another seed gives another one.
a=$(run --tokens "$prompt" -n 12 --ignore-eos --temperature 1 --seed 42 2>/dev/null) || fail "run --seed 42"
b=$(run --tokens "$prompt" -n 12 --ignore-eos --temperature 1 --seed 42 2>/dev/null)
c=$(run --tokens "$prompt" -n 12 --ignore-eos --temperature 1 --seed 43 2>/dev/null)
[ "$a" = "$b" ] || fail "--seed 42 twice: '$a' and '$b'"
[ "$a" != "$c" ] || fail "--seed 42 and 43 sampled the same 12 tokens: '$a'"
[ "$a" != "$want" ] || fail "temperature 1 gave the greedy tokens"
run -p "Hello there" -n 12 --temperature 1 --top-p 0.9 --seed 5 --date 2025-06-28 >"$dir/s1" 2>/dev/null || fail "run -p --seed"
run -p "Hello there" -n 12 --temperature 1 --top-p 0.9 --seed 5 --date 2025-06-28 >"$dir/s2" 2>/dev/null
cmp -s "$dir/s1" "$dir/s2" || fail "run -p --seed 5 twice differs"

# 4. The new options are checked like the others.
run --tokens "1 2" --temperature -1 >/dev/null 2>&1; [ $? -eq 2 ] || fail "--temperature -1 accepted"
run --tokens "1 2" --top-p 0 >/dev/null 2>&1; [ $? -eq 2 ] || fail "--top-p 0 accepted"
run --tokens "1 2" --seed x >/dev/null 2>&1; [ $? -eq 2 ] || fail "--seed x accepted"
"$bin" run --tokens x --help | grep -q -- "--seed S" || fail "run --tokens --help does not document --seed"
echo "ok: run at temperature 0 is the logits' argmax (ids and text paths); --seed repeats"
