#!/usr/bin/env bash
# test_serve_api.sh - the OpenAI endpoints of one server (prefix cache on, API key, small body
# limit) through curl and the official `openai` npm client (server_client.mjs): the SSE wire
# format, /metrics, authentication, every kind of bad request; and one access-log line per
# request. Many concurrent streams and disconnects are test_serve_load.sh.
. "$(dirname "$0")/serve_lib.sh"
make_tiny

start_server a --api-key "$key" --max-body-bytes 262144 || exit 1
a_pid=$pid a_port=$port
a_url="http://127.0.0.1:$a_port"
grep -q "KV cache .* tokens" "$work/a.log" || fail "start-up does not print the KV capacity: $(cat "$work/a.log")"
grep -q "http://127.0.0.1:$a_port" "$work/a.log" || fail "start-up does not print the URL"

# curl: the raw wire format of a stream (SSE framing, [DONE] last)
curl -sN -m 60 "$a_url/v1/chat/completions" -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
  -d '{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}' >"$work/sse.txt"
[ "$(grep -c '^data: ' "$work/sse.txt")" -ge 3 ] || fail "SSE: fewer than 3 data lines: $(head -c 300 "$work/sse.txt")"
[ "$(grep '^data: ' "$work/sse.txt" | tail -1)" = "data: [DONE]" ] || fail "SSE: last event is not [DONE]"
grep -q '"finish_reason":"length"' "$work/sse.txt" || fail "SSE: no finish_reason length"
code=$(curl -s -m 10 -o "$work/m.txt" -w '%{http_code}' "$a_url/metrics")
[ "$code" = 200 ] && grep -q '^# TYPE gptoss_time_to_first_token_seconds histogram' "$work/m.txt" || fail "/metrics: $code"
code=$(curl -s -m 10 -o /dev/null -w '%{http_code}' "$a_url/v1/models")
[ "$code" = 401 ] || fail "/v1/models without key: $code, expected 401"

# access log: the stream above (3 generated tokens) and the refused /v1/models (a warning);
# a line is written when the server let go of the request, which may follow the last byte
stream_logged() { grep -q 'INFO  serve: POST /v1/chat/completions 200 model=tiny prompt_tokens=[1-9][0-9]* completion_tokens=3 ttft_ms=[0-9.]* duration_ms=[0-9.]* ' "$work/a.log"; }
wait_until 10 "no access-log line for the stream: $(grep serve: "$work/a.log" | tail -5)" stream_logged
refusal_logged() { grep -q 'WARN  serve: GET /v1/models 401 ' "$work/a.log"; }
wait_until 10 "no warning access-log line for the 401" refusal_logged

node_check api "$a_url" "$key" tiny
stop_server "$a_pid" a

finish
