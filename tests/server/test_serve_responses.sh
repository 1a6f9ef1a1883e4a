#!/usr/bin/env bash
# test_serve_responses.sh - /v1/responses end to end (responses_client.mjs: the openai npm
# client and the Agents SDK), then the response store's byte budget: a small store evicts the
# oldest responses, which then answer 404, while the newest stay; and a background stream
# at shutdown.
. "$(dirname "$0")/serve_lib.sh"
make_tiny

"$bin" serve --responses-store-bytes -5 >"$work/out" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "responses-store-bytes" "$work/out" || fail "serve --responses-store-bytes -5 is not refused: $(cat "$work/out")"

start_server a --api-key "$key" || exit 1
a_pid=$pid a_url="http://127.0.0.1:$port"
timeout $((240 * slow)) node "$here/responses_client.mjs" "$a_url" "$key" tiny || fail "responses_client.mjs"

# the raw wire format: "event: <type>" before each data line, the type repeated inside
curl -sN -m 60 "$a_url/v1/responses" -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
  -d '{"model":"tiny","input":"hi","max_output_tokens":3,"stream":true}' >"$work/sse.txt"
head -1 "$work/sse.txt" | grep -qx 'event: response.created' || fail "SSE: first line $(head -1 "$work/sse.txt")"
paste -d'|' <(grep '^event: ' "$work/sse.txt" | cut -c8-) <(grep '^data: ' "$work/sse.txt" | sed 's/^data: {"type":"\([^"]*\)".*/\1/') |
  awk -F'|' '$1 != $2 { bad = 1 } END { exit bad }' || fail "SSE: event names differ from data types"
grep -q '^data: \[DONE\]' "$work/sse.txt" && fail "SSE: a Responses stream has no [DONE]"
stop_server "$a_pid" a

# a store of 8 KiB holds a few small responses: the first of many is evicted
start_server b --responses-store-bytes 8192 || exit 1
b_url="http://127.0.0.1:$port"
ids=()
for i in 1 2 3 4 5 6 7 8; do
  ids+=("$(curl -s -m 30 "$b_url/v1/responses" -H 'Content-Type: application/json' \
    -d "{\"model\":\"tiny\",\"input\":\"message $i\",\"max_output_tokens\":2}" | sed -n 's/^{"id":"\([^"]*\)".*/\1/p')")
done
code() { curl -s -m 10 -o "$work/get.json" -w '%{http_code}' "$b_url/v1/responses/$1"; }
[ "$(code "${ids[0]}")" = 404 ] && grep -q 'evicted' "$work/get.json" || fail "oldest response not evicted from an 8 KiB store: $(cat "$work/get.json")"
[ "$(code "${ids[7]}")" = 200 ] || fail "newest response missing from the store"
c=$(curl -s -m 30 -o "$work/chain.json" -w '%{http_code}' "$b_url/v1/responses" -H 'Content-Type: application/json' \
  -d "{\"model\":\"tiny\",\"input\":\"again\",\"previous_response_id\":\"${ids[0]}\"}")
[ "$c" = 404 ] && grep -q 'previous_response_not_found' "$work/chain.json" || fail "previous_response_id of an evicted response: $c"
stop_server "$pid" b

# a background stream at shutdown: the drain timeout cuts its job, which ends incomplete at
# once; the stream gets that last event and the server exits in time
start_server c --drain-timeout 1 || exit 1
c_pid=$pid c_url="http://127.0.0.1:$port"
curl -sN -m $((60 * slow)) "$c_url/v1/responses" -H 'Content-Type: application/json' \
  -d '{"model":"tiny","input":"hi","stream":true,"background":true,"ignore_eos":true}' >"$work/cut.txt" &
curl_pid=$!
grown() { [ "$(wc -c <"$work/cut.txt")" -gt 8000 ]; }
wait_until 30 "background stream: no events" grown
stop_server "$c_pid" c
wait "$curl_pid"
[ "$(grep '^event: ' "$work/cut.txt" | tail -1)" = "event: response.incomplete" ] ||
  fail "background stream cut at shutdown: last event $(grep '^event: ' "$work/cut.txt" | tail -1)"
grep -q "background resp_[0-9a-f]* incomplete" "$work/c.log" || fail "cut background job: no log line"

finish
