#!/usr/bin/env bash
# test_serve_idle.sh - the idle timeout (--idle-timeout 1) is for clients stalling while they
# send a request; it must not cut off a request that waits or generates longer than that.
# One sequence per step: a long answer, then a stream and a plain request queued behind it
# with nothing to send for as long as it runs.
#
# The long answer must outlast the timeout on any machine, so its length is not a constant:
# a first request measures this server's decode rate, and the long one asks for about 6 s of
# tokens (at least 64). The test then checks it really took more than twice the timeout.
. "$(dirname "$0")/serve_lib.sh"
make_tiny

start_server d --max-num-seqs 1 --idle-timeout 1 || exit 1
d_pid=$pid d_url="http://127.0.0.1:$port"
post() { # post OUTFILE BODY : prints "HTTP_CODE SECONDS"
  curl -s -m $((400 * slow)) -o "$1" -w '%{http_code} %{time_total}' "$d_url/v1/completions" \
    -H 'Content-Type: application/json' -d "$2"
}
read -r code secs < <(post "$work/probe.json" '{"model":"tiny","prompt":"a probe","max_tokens":64,"ignore_eos":true}')
[ "$code" = 200 ] || { fail "probe request: $code $(head -c 300 "$work/probe.json")"; finish; }
max_len=$(curl -s -m 10 "$d_url/v1/models" | node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>console.log(JSON.parse(s).data[0].max_model_len))')
long_tokens=$(node -e '
const [secs, maxLen] = [Number(process.argv[1]), Number(process.argv[2])];
const want = Math.ceil(64 / Math.max(secs, 1e-3) * 6);
console.log(Math.min(Math.max(want, 64), maxLen - 16));' "$secs" "$max_len")

post "$work/long.json" "{\"model\":\"tiny\",\"prompt\":\"a long answer\",\"max_tokens\":$long_tokens,\"ignore_eos\":true}" >"$work/long.out" &
long_pid=$!
# The long request holds the only sequence before the others are sent.
running() { [ "$(metric "$d_url" 'gptoss_num_requests_running')" = 1 ]; }
wait_until 60 "the long request never started" running
curl -sN -m $((400 * slow)) "$d_url/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model":"tiny","prompt":"queued stream","max_tokens":4,"ignore_eos":true,"stream":true}' >"$work/queued.txt" &
queued_pid=$!
read -r code _ < <(post "$work/queued.json" '{"model":"tiny","prompt":"queued plain","max_tokens":4,"ignore_eos":true}')
wait "$long_pid" "$queued_pid"
read -r long_code long_secs <"$work/long.out"
[ "$long_code" = 200 ] && [ "$(node -e 'const j=JSON.parse(require("fs").readFileSync(process.argv[1]));
  console.log(j.usage.completion_tokens)' "$work/long.json")" = "$long_tokens" ] ||
  fail "a request generating past the idle timeout: $long_code $(head -c 300 "$work/long.json")"
node -e 'process.exit(Number(process.argv[1]) > 2 ? 0 : 1)' "$long_secs" ||
  fail "the long request ($long_tokens tokens) took only $long_secs s: it did not outlast the 1 s idle timeout"
[ "$code" = 200 ] && grep -q '"finish_reason":"length"' "$work/queued.json" ||
  fail "a request queued past the idle timeout: $code $(head -c 300 "$work/queued.json")"
grep -q '"finish_reason":"length"' "$work/queued.txt" && [ "$(tail -2 "$work/queued.txt" | head -1)" = "data: [DONE]" ] ||
  fail "a stream queued past the idle timeout: $(tail -c 300 "$work/queued.txt")"
stop_server "$d_pid" d

finish
