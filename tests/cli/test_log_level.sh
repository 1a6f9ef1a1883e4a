#!/usr/bin/env bash
# test_log_level.sh - the global --log-level option: it comes before the command, sets how
# much of the log reaches stderr (progress lines are INFO), overrides GPTOSS_LOG_LEVEL, and a
# missing or unknown level is a usage error (exit 2). `gptoss --help` documents it.
set -u
bin="${GPTOSS_BIN:?}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$bin" --help | grep -q -- '--log-level' || fail "gptoss --help does not mention --log-level"
"$bin" make-model --preset tiny -o "$dir/tiny" >/dev/null 2>&1 || fail "make-model --preset tiny"
# A checkpoint just over make-model's 256 MiB progress threshold (about 4 s to write): its
# "writing ... GB" line and the progress lines are INFO log lines (stderr is not a TTY here).
sed 's/"hidden_size": 128/"hidden_size": 352/' "$dir/tiny/config.json" >"$dir/big.json"
rm -rf "$dir/tiny"
make_big() {
    rm -rf "$dir/big"
    "$@" make-model --config "$dir/big.json" --no-tokenizer -o "$dir/big" >"$dir/out" 2>"$dir/err" ||
        fail "$* make-model exited $? ($(cat "$dir/err"))"
    grep -q '^wrote ' "$dir/out" || fail "make-model's own output is missing: $(cat "$dir/out")"
}
line='^[0-9-]+T[0-9:.]+Z INFO  '
make_big "$bin"
grep -qE "${line}make-model: writing 0\.[0-9]+ GB of weights" "$dir/err" || fail "no INFO 'writing' line: $(cat "$dir/err")"
grep -qE "${line}progress: .*: [0-9]+%" "$dir/err" || fail "no INFO progress line: $(cat "$dir/err")"
# The option wins over the environment; at warn nothing of the above is printed.
GPTOSS_LOG_LEVEL=info make_big "$bin" --log-level=warn
[ ! -s "$dir/err" ] || fail "--log-level=warn still printed: $(cat "$dir/err")"
rm -rf "$dir/big"

for bad in loud "" INFO2; do
    "$bin" --log-level "$bad" info >/dev/null 2>"$dir/err"
    [ $? -eq 2 ] || fail "--log-level '$bad': want exit 2"
    grep -q -- '--log-level' "$dir/err" || fail "--log-level '$bad': the error does not name the option"
done
"$bin" --log-level >/dev/null 2>&1
[ $? -eq 2 ] || fail "--log-level without a value: want exit 2"
echo PASS
