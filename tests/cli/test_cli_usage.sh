#!/usr/bin/env bash
# test_cli_usage.sh - the first things a new user types: `gptoss help CMD` is `CMD --help`,
# -V/--version, a model folder given without -m is pointed at -m, serve's "not both" only when
# both -m and --random-weights are given, `run --help` documents both of its modes, a folder in
# OpenAI's original/ layout is named as such, a CUDA backend that cannot run says so before
# the model is loaded and tells how to run on the CPU, and scripts/start on a taken port says
# PORT=.
. "$(dirname "$0")/cli_lib.sh"
src="${GPTOSS_SOURCE_DIR:?run through ctest}"
version=$(sed -n 's/^project(gptoss VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")

# expect STATUS PATTERN CMD...: CMD exits STATUS and its output matches grep -E PATTERN.
expect() {
    local want=$1 pattern=$2
    shift 2
    "$@" >"$work/out" 2>&1
    local rc=$?
    [ $rc -eq "$want" ] || { fail "$*: exit $rc, want $want: $(head -c 600 "$work/out")"; return; }
    # a line, or the whole output as one line (messages that span lines)
    grep -qE -- "$pattern" "$work/out" || tr '\n' ' ' <"$work/out" | grep -qE -- "$pattern" || fail "$*: output lacks /$pattern/: $(head -c 600 "$work/out")"
}

# help CMD = CMD --help, for every command; help alone and an unknown command.
for cmd in run info make-model tokenize detokenize chat bench serve bench-serve; do
    "$bin" help "$cmd" >"$work/a" 2>&1
    a=$?
    "$bin" "$cmd" --help >"$work/b" 2>&1
    [ $a -eq 0 ] && cmp -s "$work/a" "$work/b" || fail "gptoss help $cmd differs from $cmd --help"
done
expect 0 '^commands:' "$bin" help
expect 2 "unknown command 'frobnicate'" "$bin" help frobnicate
for v in -V --version version; do
    expect 0 "^gptoss $version\$" "$bin" $v
done

# A model folder without -m.
"$bin" make-model --preset tiny -o "$work/tiny" >/dev/null 2>&1 || { fail "make-model"; finish; }
for cmd in serve chat run info; do
    expect 2 "unexpected argument '$work/tiny' \\(to use it as the model: -m $work/tiny\\)" "$bin" $cmd "$work/tiny"
done
expect 2 "unknown option '--frob'" "$bin" serve --frob

# serve: neither -m nor --random-weights, and both.
expect 2 'missing -m DIR .*make-model --preset tiny' "$bin" serve
grep -q 'not both' "$work/out" && fail "serve without -m speaks of 'not both': $(cat "$work/out")"
expect 2 'give -m DIR or --random-weights SHAPE, not both' "$bin" serve -m "$work/tiny" --random-weights tiny
expect 2 'missing -m DIR or --random-weights SHAPE' "$bin" bench
expect 2 'give -m DIR or --random-weights SHAPE, not both' "$bin" bench -m "$work/tiny" --random-weights tiny

# run --help: both modes and their options; run -p x --help prints the same.
"$bin" run --help >"$work/run_help" 2>&1 || fail "run --help failed"
for want in '-p TEXT' '--tokens "ID ID ...' 'text prompt \(-p TEXT\)' 'token ids \(--tokens IDS\)' \
    '--effort LEVEL' '--raw' '--logits FILE' '--ignore-eos' '-m, --model DIR'; do
    grep -qE -- "$want" "$work/run_help" || fail "run --help lacks /$want/"
done
"$bin" run -p x --help >"$work/b" 2>&1
cmp -s "$work/run_help" "$work/b" || fail "run -p x --help differs from run --help"
expect 2 'missing --tokens \(or -p TEXT\)' "$bin" run -m "$work/tiny"

# OpenAI's original/ layout: a folder holding only original/, and original/ itself.
mkdir -p "$work/orig/original"
printf '{"num_hidden_layers": 24, "num_experts": 32}' >"$work/orig/original/config.json"
printf '{}' >"$work/orig/original/dtypes.json"
: >"$work/orig/original/model.safetensors"
expect 1 "holds only original/ .*config.json, tokenizer.json and model-\\*.safetensors.*hf download openai/gpt-oss-20b" \
    "$bin" info -m "$work/orig"
expect 1 "is OpenAI's original checkpoint layout.*the one above original/" "$bin" info -m "$work/orig/original"
expect 1 "holds only original/" "$bin" serve -m "$work/orig" --backend cpu --port 0

# The CUDA backend that cannot run: said before the model is loaded (the model folder does not
# exist), with the way to the CPU.
if "$bin" --help | grep -q '^backends: cpu, cuda'; then
    if ! { command -v nvidia-smi >/dev/null && nvidia-smi >/dev/null 2>&1; }; then
        expect 1 'no usable GPU.*runs on the GPU .*unless told otherwise.*add --backend cpu' \
            "$bin" run -m "$work/missing" --tokens 1
        grep -q missing "$work/out" && fail "the model was looked at before the GPU: $(cat "$work/out")"
    fi
else
    for cmd in "run -m $work/missing --tokens 1" "serve -m $work/missing" "chat -m $work/missing"; do
        # shellcheck disable=SC2086
        expect 1 'built without CUDA.*--backend cuda needs a CUDA build.*add --backend cpu' "$bin" $cmd --backend cuda
        grep -q missing "$work/out" && fail "$cmd: the model was looked at before the backend: $(cat "$work/out")"
    done
fi

# scripts/start on a port that is taken names PORT=.
if start_serve "$work/occupant.log" "$bin" -m "$work/tiny" --backend cpu; then
    GPTOSS_BIN="$bin" MODEL="$work/tiny" PORT=$port BACKEND=cpu "$src/scripts/start" >"$work/out" 2>&1
    rc=$?
    [ $rc -ne 0 ] || fail "scripts/start on a taken port exited 0"
    grep -qE "port $port is in use.*PORT=" "$work/out" && grep -q "PORT=$((port + 1)) scripts/start" "$work/out" ||
        fail "scripts/start on a taken port: $(cat "$work/out")"
    stop_serve
else
    fail "the occupant server did not start"
fi
finish
