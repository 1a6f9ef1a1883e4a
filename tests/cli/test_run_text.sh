#!/usr/bin/env bash
# test_run_text.sh - `gptoss run -p TEXT` on a tiny random model: the chat prompt is rendered
# and generated from, output streams as decoded text with the non-TTY prefixes, the --raw and
# --tokens paths still work, and a model whose vocabulary is too small for text is refused
# with an actionable message. A random model writes gibberish: we check mechanics, not words.
set -u
bin="${GPTOSS_BIN:?}"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$bin" make-model --preset tiny -o "$dir/tiny" >/dev/null 2>&1 || fail "make-model --preset tiny"

# A chat prompt: the reply is printed with the [answer]/[reasoning] prefixes (stdout is not a
# TTY here) and the summary on stderr names the finish reason.
"$bin" run -m "$dir/tiny" -p "Hello there" -n 8 --date 2025-06-28 -t 2 >"$dir/out" 2>"$dir/err" ||
    fail "run -p exited $? ($(cat "$dir/err"))"
grep -qE '^\[(answer|reasoning)\] ' "$dir/out" || grep -q '^\[tool call' "$dir/out" ||
    fail "no [answer]/[reasoning] prefix in: $(cat "$dir/out")"
grep -qE '^finish: (length|stop|tool_calls); [0-9]+ tokens' "$dir/err" || fail "no finish line: $(cat "$dir/err")"
iconv -f UTF-8 -t UTF-8 "$dir/out" >/dev/null || fail "output is not valid UTF-8"

# Greedy decoding is deterministic: the same prompt gives the same text twice.
"$bin" run -m "$dir/tiny" -p "Hello there" -n 8 --date 2025-06-28 -t 2 >"$dir/out2" 2>/dev/null || fail "second run"
cmp -s "$dir/out" "$dir/out2" || fail "greedy output differs between two runs"

# The prompt reaches the model: the greedy continuation of a different prompt (effort high)
# is rendered from different ids; compare the prompt ids through --raw --special instead of
# relying on the gibberish differing: --raw with the rendered text must equal the chat path.
sys=$'<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2025-06-28\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>'
raw_prompt="${sys}<|start|>user<|message|>Hello there<|end|><|start|>assistant"
"$bin" run -m "$dir/tiny" --raw --special -p "$raw_prompt" -n 8 -t 2 >"$dir/raw" 2>/dev/null || fail "run --raw --special"
# The chat path prints parsed text; the raw path prints every token verbatim. The first
# answer/reasoning text of the chat run must appear inside the raw continuation.
first=$(head -1 "$dir/out" | sed -E 's/^\[(answer|reasoning)\] //' | cut -c1-12)
[ -n "$first" ] && grep -qF -- "$first" "$dir/raw" || fail "chat and raw renderings disagree: chat '$first', raw '$(cat "$dir/raw")'"

# --special without --raw is a usage error; bad --effort and --date are refused.
"$bin" run -m "$dir/tiny" -p hi --special >/dev/null 2>&1; [ $? -eq 2 ] || fail "--special without --raw accepted"
"$bin" run -m "$dir/tiny" -p hi --effort extreme >/dev/null 2>&1; [ $? -eq 2 ] || fail "--effort extreme accepted"
"$bin" run -m "$dir/tiny" -p hi --date 2025-13-01 >/dev/null 2>&1; [ $? -eq 2 ] || fail "--date 2025-13-01 accepted"

# The ids path still works.
"$bin" run -m "$dir/tiny" --tokens "200006 1428 200008" -n 3 -t 2 >"$dir/ids" 2>/dev/null || fail "run --tokens"
grep -qE '^[0-9]+( [0-9]+)*$' "$dir/ids" || fail "run --tokens printed: $(cat "$dir/ids")"

# A golden-sized model (vocab 512) cannot take text: a clear error, not a crash.
"$bin" make-model --config "$GPTOSS_SOURCE_DIR/tests/golden/configs/swa.json" -o "$dir/small" >/dev/null 2>&1 ||
    fail "make-model --config swa.json"
"$bin" run -m "$dir/small" -p "hi" -n 2 >/dev/null 2>"$dir/err"
rc=$?
[ $rc -eq 1 ] || fail "small-vocab model: exit $rc, want 1"
grep -q "vocab_size is 512" "$dir/err" || fail "small-vocab error does not explain: $(cat "$dir/err")"
echo "ok: run -p, --raw --special, --tokens, argument checks, small-vocab refusal"
