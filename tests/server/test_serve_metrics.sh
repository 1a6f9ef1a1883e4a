#!/usr/bin/env bash
# test_serve_metrics.sh - GET /metrics passes promtool's checks and lint rules (metrics_lint.mjs,
# itself checked against a bad exposition first), before and after traffic and with a model
# name that needs escaping; the request histograms count what was served: three completions
# of 5 prompt and 4 generated tokens each; and with --draft ngram, the draft tokens verified.
. "$(dirname "$0")/serve_lib.sh"
make_tiny
lint() { node "$here/metrics_lint.mjs"; }

# the linter finds what promtool finds
printf '# HELP gptoss:ready r\n# TYPE gptoss:ready gauge\ngptoss:ready 1\n# HELP a_total t\n# TYPE a_total gauge\na_total 1\n# HELP c_count c\n# TYPE c_count counter\nc_count 1\n# HELP h h\n# TYPE h histogram\nh_bucket{le="1"} 2\nh_bucket{le="+Inf"} 1\nh_sum 1\nh_count 3\n' |
  lint >"$work/lint-bad.txt" && fail "the linter accepted a bad exposition"
for want in "should not contain ':'" 'non-counter metrics should not have "_total"' 'counter metrics should have "_total"' 'not cumulative' '!= _count'; do
  grep -qF "$want" "$work/lint-bad.txt" || fail "the linter missed: $want"
done

start_server m --served-model-name 'ti"ny\x' || exit 1
m_pid=$pid url="http://127.0.0.1:$port"
curl -s -m 10 "$url/metrics" >"$work/m0.txt"
lint <"$work/m0.txt" || fail "/metrics before traffic fails the lint (above)"
for i in 1 2 3; do
  code=$(curl -s -m $((60 * slow)) -o "$work/c$i.json" -w '%{http_code}' "$url/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"ti\"ny\\x","prompt":[11,12,13,14,15],"max_tokens":4,"ignore_eos":true}')
  [ "$code" = 200 ] || fail "completion $i: $code $(cat "$work/c$i.json")"
done
curl -s -m 10 "$url/metrics" >"$work/m1.txt"
lint <"$work/m1.txt" || fail "/metrics after traffic fails the lint (above)"
grep -q 'model_name="ti\\"ny\\\\x"' "$work/m1.txt" || fail "the model name is not escaped in labels"

val() { sed -n "s/^$1{[^}]*} \([0-9.eE+-]*\)$/\1/p" "$work/m1.txt" | head -1; }
bucket() { sed -n "s/^$1_bucket{[^}]*le=\"$2\"} \([0-9]*\)$/\1/p" "$work/m1.txt" | head -1; }
check_eq() { [ "$(val "$1")" = "$2" ] || fail "$1 = $(val "$1"), expected $2"; }
check_eq gptoss_request_prompt_tokens_count 3
check_eq gptoss_request_prompt_tokens_sum 15
check_eq gptoss_request_generation_tokens_count 3
check_eq gptoss_request_generation_tokens_sum 12
[ "$(bucket gptoss_request_prompt_tokens 5)" = 3 ] && [ "$(bucket gptoss_request_prompt_tokens 2)" = 0 ] ||
  fail "prompt-token buckets: le=2 $(bucket gptoss_request_prompt_tokens 2), le=5 $(bucket gptoss_request_prompt_tokens 5)"
for h in gptoss_e2e_request_latency_seconds gptoss_request_queue_time_seconds gptoss_time_per_output_token_seconds; do
  check_eq "${h}_count" 3
  awk -v s="$(val "${h}_sum")" 'BEGIN { exit !(s > 0 && s < 600) }' || fail "${h}_sum = $(val "${h}_sum")"
done
[ "$(val gptoss_time_to_first_token_seconds_count)" -ge 3 ] 2>/dev/null || fail "TTFT histogram count $(val gptoss_time_to_first_token_seconds_count)"
# the end-to-end latency of each request covers its time per output token three times over
awk -v e="$(val gptoss_e2e_request_latency_seconds_sum)" -v t="$(val gptoss_time_per_output_token_seconds_sum)" \
  'BEGIN { exit !(e >= 3 * t) }' || fail "e2e sum $(val gptoss_e2e_request_latency_seconds_sum) < 3 x tpot sum"
stop_server "$m_pid" m

# speculative decoding's counters, summed over the engines: greedy text from the tiny random
# model soon repeats its tokens, and an n-gram draft comes from any token seen before (the
# tiny model's continuations are fixed: these prompts give a few verified drafts)
start_server d --draft ngram || exit 1
d_pid=$pid url="http://127.0.0.1:$port"
for p in "[11,12,13,11,12,13]" "[5,6,7,8,9,10,11,12]" "[200,201,202]"; do
  code=$(curl -s -m $((60 * slow)) -o "$work/d.json" -w '%{http_code}' "$url/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"model\":\"tiny\",\"prompt\":$p,\"max_tokens\":64,\"ignore_eos\":true,\"temperature\":0}")
  [ "$code" = 200 ] || fail "completion with --draft ngram: $code $(cat "$work/d.json")"
done
curl -s -m 10 "$url/metrics" >"$work/m1.txt"
lint <"$work/m1.txt" || fail "/metrics with drafting fails the lint (above)"
drafted=$(val gptoss_spec_decode_num_draft_tokens_total)
accepted=$(val gptoss_spec_decode_num_accepted_tokens_total)
awk -v d="$drafted" -v a="$accepted" 'BEGIN { exit !(d > 0 && a >= 0 && a <= d) }' ||
  fail "draft tokens verified $drafted, accepted $accepted (expected some verified)"
stop_server "$d_pid" d

finish
