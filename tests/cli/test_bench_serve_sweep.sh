#!/usr/bin/env bash
# test_bench_serve_sweep.sh - `gptoss bench-serve` as a concurrency sweep: against `gptoss
# serve` on a tiny random model, --concurrency 1,2 prints one table row per point and writes
# the same rows as CSV (the columns, per GPU = total / --gpus, tok/s per user = 1000 / median
# TPOT) and JSON; --plot draws a PNG with gnuplot, or says gnuplot is missing and still writes
# the CSV. Against a node server that records request bodies: temperature and top_p are sent
# only when asked for, --temperature 0 sends a greedy 0. Bad option values are usage errors.
# Every wait is bounded.
set -u
bin="${GPTOSS_BIN:?run through ctest}"
src="${GPTOSS_SOURCE_DIR:?run through ctest}"
work="$(mktemp -d)"
pids=()
cleanup() {
    exec 2>/dev/null # no job-status noise for the servers killed below
    # each pid is a `timeout` around a server: its child first (kill -9 of timeout alone would
    # leave the server running with no time limit), then timeout itself
    for p in "${pids[@]}"; do pkill -9 -P "$p"; kill -9 "$p"; done
    wait
    rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

# ---- usage errors (exit 2, the message names the option) --------------------------------
expect_usage() {
    local opt="$1"
    shift
    "$bin" bench-serve --url http://127.0.0.1:9 --concurrency 1 --num-requests 1 --input-len 4 --output-len 2 \
        "$@" >"$work/out" 2>"$work/err"
    local rc=$?
    [ $rc -eq 2 ] || fail "bench-serve $*: exit $rc, want 2 ($(cat "$work/err"))"
    grep -q -- "$opt" "$work/err" || fail "bench-serve $*: the error does not name $opt: $(cat "$work/err")"
}
for bad in -0.1 2.5 x "" nan; do expect_usage --temperature --temperature "$bad"; done
for bad in 0 1.5 -1 x; do expect_usage --top-p --top-p "$bad"; done
for bad in 0 -2 x; do expect_usage --gpus --gpus "$bad"; done
expect_usage --plot-metric --plot-metric input
"$bin" bench-serve --help | grep -q -- '--temperature T' || fail "--help does not document --temperature"
"$bin" bench-serve --help | grep -q -- '--plot FILE.png' || fail "--help does not document --plot"

# ---- the sweep against gptoss serve ----------------------------------------------------
"$bin" make-model --preset tiny -o "$work/tiny" >/dev/null 2>&1 || fail "make-model --preset tiny"
timeout 120 "$bin" serve -m "$work/tiny" --served-model-name tiny --port 0 -t 2 >"$work/serve.log" 2>&1 &
pids+=($!)
port=""
for _ in $(seq 1 300); do
    port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$work/serve.log" | head -1)
    [ -n "$port" ] && break
    sleep 0.1
done
[ -n "$port" ] || fail "serve printed no port: $(cat "$work/serve.log")"
for _ in $(seq 1 300); do
    [ "$(curl -s -m 2 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")" = 200 ] && break
    sleep 0.1
done

# A PATH without gnuplot first: the run still succeeds, writes CSV and JSON, and says why
# there is no plot.
nognuplot="$work/bin"
mkdir -p "$nognuplot"
for tool in curl node; do ln -s "$(command -v "$tool")" "$nognuplot/$tool"; done
PATH="$nognuplot" "$(command -v timeout)" 60 "$bin" bench-serve --url "http://127.0.0.1:$port" --concurrency 1,2 --num-requests 4 \
    --input-len 8 --output-len 6 --gpus 2 --temperature 0 --csv "$work/sweep.csv" --json "$work/sweep.json" \
    --plot "$work/sweep.png" >"$work/bench.txt" 2>"$work/bench.err" ||
    fail "bench-serve exited $? ($(cat "$work/bench.txt" "$work/bench.err"))"
grep -q 'gnuplot is not installed' "$work/bench.err" || fail "no word about the missing gnuplot: $(cat "$work/bench.err")"
[ ! -e "$work/sweep.png" ] || fail "a plot appeared without gnuplot"
grep -q '==== sweep (2 GPUs' "$work/bench.txt" || fail "no sweep table: $(cat "$work/bench.txt")"
[ "$(grep -cE '^ +[12] +4 ' "$work/bench.txt")" -eq 2 ] || fail "want table rows for concurrency 1 and 2: $(cat "$work/bench.txt")"

header='concurrency,requests,output_tok_s,total_tok_s,output_tok_s_per_gpu,total_tok_s_per_gpu,median_tpot_ms,tok_s_per_user,median_ttft_ms,p99_tpot_ms'
[ "$(head -1 "$work/sweep.csv")" = "$header" ] || fail "CSV header: $(head -1 "$work/sweep.csv")"
[ "$(wc -l <"$work/sweep.csv")" -eq 3 ] || fail "want 2 CSV rows: $(cat "$work/sweep.csv")"
awk -F, 'NR > 1 {
    bad = ""
    if ($1 != NR - 1) bad = bad " concurrency"
    if ($2 != 4) bad = bad " requests"
    if (!($3 > 0) || !($4 > $3)) bad = bad " throughput"        # input tokens count in total
    if ((($3 / 2) - $5) ^ 2 > 1e-4 || (($4 / 2) - $6) ^ 2 > 1e-4) bad = bad " per-GPU"
    if (!($7 > 0) || !($10 >= $7) || !($9 > 0)) bad = bad " latencies"
    d = $8 - 1000 / $7; if (d < 0) d = -d
    if (d > 0.01 * $8 / 100 + 0.001) bad = bad " per-user"      # 1000 / median TPOT
    if (bad != "") { print "row " NR - 1 ":" bad ": " $0; status = 1 }
} END { exit status }' "$work/sweep.csv" || fail "CSV rows implausible: $(cat "$work/sweep.csv")"
node -e '
const j = JSON.parse(require("fs").readFileSync(process.argv[1]));
const ok = j.gpus === 2 && j.temperature === 0 && j.runs.length === 2 && j.runs.every((r, i) =>
  r.concurrency === i + 1 && r.completed === 4 && r.total_output_tokens === 24 &&
  Math.abs(r.tok_s_per_user - 1000 / r.median_tpot_ms) < 1e-6 &&
  Math.abs(r.total_token_throughput_per_gpu - r.total_token_throughput / 2) < 1e-6);
if (!ok) { console.log(JSON.stringify(j)); process.exit(1); }' "$work/sweep.json" || fail "JSON wrong"

# With gnuplot (when installed): a PNG.
if command -v gnuplot >/dev/null 2>&1; then
    timeout 60 "$bin" bench-serve --url "http://127.0.0.1:$port" --concurrency 1,2 --num-requests 2 --input-len 8 \
        --output-len 4 --plot "$work/sweep.png" --plot-metric output >"$work/bench.txt" 2>&1 ||
        fail "bench-serve --plot exited $? ($(cat "$work/bench.txt"))"
    [ "$(head -c 4 "$work/sweep.png" | od -An -c | tr -d ' ')" = '211PNG' ] || fail "--plot wrote no PNG"
else
    echo "note: gnuplot not installed; the PNG path is not exercised"
fi

# ---- request bodies, seen by an independent server ---------------------------------------
export NODE_PATH="$src/node_modules"
timeout 60 node "$src/tests/cli/record_server.mjs" "$work/bodies.jsonl" >"$work/rec.log" 2>&1 &
pids+=($!)
rport=""
for _ in $(seq 1 100); do
    rport=$(sed -n 's/^port \([0-9]*\)$/\1/p' "$work/rec.log")
    [ -n "$rport" ] && break
    sleep 0.1
done
[ -n "$rport" ] || fail "record server did not start: $(cat "$work/rec.log")"

# bodies ARGS... : runs 2 requests with ARGS and leaves their bodies in $work/last.jsonl.
bodies() {
    : >"$work/bodies.jsonl"
    timeout 30 "$bin" bench-serve --url "http://127.0.0.1:$rport" --concurrency 2 --num-requests 2 --input-len 4 \
        --output-len 3 "$@" >"$work/rec.txt" 2>&1 || fail "bench-serve $* against the recorder: $(cat "$work/rec.txt")"
    cp "$work/bodies.jsonl" "$work/last.jsonl"
    [ "$(wc -l <"$work/last.jsonl")" -eq 2 ] || fail "bench-serve $*: want 2 recorded bodies: $(cat "$work/last.jsonl")"
}
check_bodies() { # JS expression over b (one body)
    node -e '
const lines = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map(JSON.parse);
const check = new Function("b", "return " + process.argv[2]);
const bad = lines.filter(b => !check(b));
if (bad.length) { console.log(JSON.stringify(bad)); process.exit(1); }' "$work/last.jsonl" "$1"
}
bodies
check_bodies '!("temperature" in b) && !("top_p" in b) && b.stream === true && b.max_tokens === 3 && b.model === "recorded"' ||
    fail "by default the body must carry neither temperature nor top_p"
bodies --temperature 0
check_bodies 'b.temperature === 0 && !("top_p" in b)' || fail "--temperature 0 must send temperature 0"
bodies --temperature 0.7 --top-p 0.9 --endpoint chat
check_bodies 'b.temperature === 0.7 && b.top_p === 0.9 && Array.isArray(b.messages)' ||
    fail "--temperature 0.7 --top-p 0.9 must send both"
grep -q 'tok/s' "$work/rec.txt" || fail "no table against the recorder: $(cat "$work/rec.txt")"
echo PASS
