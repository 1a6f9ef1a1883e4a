#!/usr/bin/env bash
# test_serve_drain.sh - SIGTERM drains: a stream in flight when the signal comes completes
# (finish_reason length, [DONE] last), the server reports the drain and exits with status 0.
. "$(dirname "$0")/serve_lib.sh"
make_tiny

start_server a --api-key "$key" || exit 1
a_pid=$pid a_url="http://127.0.0.1:$port"
curl -sN -m $((60 * slow)) "$a_url/v1/completions" -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
  -d '{"model":"tiny","prompt":"drain me","max_tokens":12,"ignore_eos":true,"stream":true}' >"$work/drain.txt" &
curl_pid=$!
# In flight: its first token arrived (11 more to go when the signal comes, unless the machine
# is fast enough to finish first, which the assertions below accept as well).
first_token() { grep -q '^data: {' "$work/drain.txt"; }
wait_until 60 "the stream to drain never started: $(cat "$work/drain.txt")" first_token
stop_server "$a_pid" a
wait "$curl_pid"
grep -q '"finish_reason":"length"' "$work/drain.txt" && [ "$(tail -2 "$work/drain.txt" | head -1)" = "data: [DONE]" ] ||
  fail "SIGTERM did not let the in-flight stream finish: $(tail -c 300 "$work/drain.txt")"
grep -q "drained" "$work/a.log" || fail "server A did not report a drain: $(tail -3 "$work/a.log")"

finish
