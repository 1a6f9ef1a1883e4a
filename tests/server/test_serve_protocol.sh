#!/usr/bin/env bash
# test_serve_protocol.sh - HTTP around the API: the access log (one line per request with
# method, path, status, model, tokens, TTFT, duration, client and request id; as text and as
# JSON with --log-format json, where every log line is a JSON object), x-request-id (a valid
# one kept, a bad one replaced, echoed on successes, errors and streams), HEAD on GET routes,
# CORS (--allowed-origins: preflight, headers on answers, refused origins) and
# WWW-Authenticate on 401.
. "$(dirname "$0")/serve_lib.sh"
make_tiny

# ---- text log, CORS, HEAD, 401 ------------------------------------------------------------
start_server t --api-key "$key" --allowed-origins 'https://a.example, https://b.example' || exit 1
t_pid=$pid url="http://127.0.0.1:$port"
auth=(-H "Authorization: Bearer $key" -H 'Content-Type: application/json')

# x-request-id: kept when valid, on a success, an error and a stream
hdr() { tr -d '\r' <"$1" | sed -n "s/^$2: //Ip" | head -1; }
curl -s -m 30 -D "$work/h1" -o /dev/null -H 'x-request-id: my-id.42' "${auth[@]}" "$url/v1/completions" \
  -d '{"model":"tiny","prompt":"hi","max_tokens":2}'
[ "$(hdr "$work/h1" x-request-id)" = my-id.42 ] || fail "x-request-id not echoed: $(cat "$work/h1")"
curl -s -m 30 -D "$work/h2" -o /dev/null -H 'x-request-id: err-id' "${auth[@]}" "$url/v1/completions" -d '{"model":"nope"}'
grep -q '^HTTP/1.1 404' "$work/h2" && [ "$(hdr "$work/h2" x-request-id)" = err-id ] || fail "x-request-id on an error: $(cat "$work/h2")"
curl -sN -m 30 -D "$work/h3" -o "$work/s3" -H 'x-request-id: stream-id' "${auth[@]}" "$url/v1/chat/completions" \
  -d '{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true}'
[ "$(hdr "$work/h3" x-request-id)" = stream-id ] && [ "$(tail -2 "$work/s3" | head -1)" = "data: [DONE]" ] ||
  fail "x-request-id on a stream: $(cat "$work/h3")"
# too long, a space, a control byte: replaced by a generated id (32 hex digits)
long=$(printf 'x%.0s' $(seq 129))
for bad in "$long" 'a b' $'a\x01b'; do
  curl -s -m 10 -D "$work/h4" -o /dev/null -H "x-request-id: $bad" "$url/health"
  hdr "$work/h4" x-request-id | grep -qx '[0-9a-f]\{32\}' || fail "bad x-request-id '$bad' not replaced: $(hdr "$work/h4" x-request-id)"
done
id1=$(curl -s -m 10 -D - -o /dev/null "$url/health" | tr -d '\r' | sed -n 's/^x-request-id: //Ip')
id2=$(curl -s -m 10 -D - -o /dev/null "$url/health" | tr -d '\r' | sed -n 's/^x-request-id: //Ip')
[ -n "$id1" ] && [ "$id1" != "$id2" ] || fail "generated request ids are not unique: '$id1' '$id2'"

# access log, text: the completion above, with every field
line_ok() { grep -q "INFO  serve: POST /v1/completions 200 model=tiny prompt_tokens=[1-9][0-9]* completion_tokens=2 ttft_ms=[0-9.]* duration_ms=[0-9.]* client=127.0.0.1 request_id=my-id.42$" "$work/t.log"; }
wait_until 10 "no text access-log line: $(grep serve: "$work/t.log" | tail -3)" line_ok
stream_ok() { grep -q "INFO  serve: POST /v1/chat/completions 200 model=tiny prompt_tokens=[1-9][0-9]* completion_tokens=3 ttft_ms=[0-9.]* duration_ms=[0-9.]* client=127.0.0.1 request_id=stream-id$" "$work/t.log"; }
wait_until 10 "no text access-log line for the stream" stream_ok
grep -q "WARN  serve: POST /v1/completions 404 model=- .* request_id=err-id$" "$work/t.log" || fail "no access-log line for the 404"

# HEAD on GET routes: headers of the GET, no body
for p in /health /metrics /v1/models; do
  code=$(curl -s -m 10 -I -o "$work/head" -w '%{http_code}' "${auth[@]}" "$url$p")
  size=$(curl -s -m 10 -I "${auth[@]}" "$url$p" -w '%{size_download}' -o /dev/null)
  [ "$code" = 200 ] && [ "$size" = 0 ] || fail "HEAD $p: $code, body $size bytes"
done
code=$(curl -s -m 10 -o /dev/null -w '%{http_code}' -X DELETE "$url/health")
allow=$(curl -s -m 10 -D - -o /dev/null -X DELETE "$url/health" | tr -d '\r' | sed -n 's/^Allow: //Ip')
[ "$code" = 405 ] && [ "$allow" = "GET, HEAD" ] || fail "DELETE /health: $code, Allow '$allow'"

# 401 names the scheme
curl -s -m 10 -D "$work/h5" -o /dev/null "$url/v1/models"
grep -q '^HTTP/1.1 401' "$work/h5" && [ "$(hdr "$work/h5" WWW-Authenticate)" = Bearer ] || fail "401 without WWW-Authenticate: Bearer: $(cat "$work/h5")"

# CORS: preflight of an allowed origin (no API key), the answer's headers, a refused origin
curl -s -m 10 -D "$work/h6" -o /dev/null -X OPTIONS "$url/v1/chat/completions" -H 'Origin: https://b.example' \
  -H 'Access-Control-Request-Method: POST' -H 'Access-Control-Request-Headers: authorization, content-type, x-stainless-os'
grep -q '^HTTP/1.1 204' "$work/h6" && [ "$(hdr "$work/h6" Access-Control-Allow-Origin)" = https://b.example ] &&
  hdr "$work/h6" Access-Control-Allow-Methods | grep -q POST &&
  hdr "$work/h6" Access-Control-Allow-Headers | grep -q 'authorization, content-type, x-stainless-os' || fail "preflight: $(cat "$work/h6")"
curl -s -m 30 -D "$work/h7" -o /dev/null -H 'Origin: https://a.example' "${auth[@]}" "$url/v1/models"
grep -q '^HTTP/1.1 200' "$work/h7" && [ "$(hdr "$work/h7" Access-Control-Allow-Origin)" = https://a.example ] &&
  hdr "$work/h7" Access-Control-Expose-Headers | grep -qi x-request-id || fail "CORS headers on an answer: $(cat "$work/h7")"
curl -s -m 30 -D "$work/h8" -o /dev/null -H 'Origin: https://evil.example' "${auth[@]}" "$url/v1/models"
grep -qi '^Access-Control-Allow-Origin' "$work/h8" && fail "a refused origin got Access-Control-Allow-Origin"
code=$(curl -s -m 10 -o /dev/null -w '%{http_code}' -X OPTIONS "$url/v1/chat/completions" -H 'Origin: https://evil.example' -H 'Access-Control-Request-Method: POST')
[ "$code" = 403 ] || fail "preflight of a refused origin: $code"
stop_server "$t_pid" t

# ---- no --allowed-origins: no CORS headers at all; JSON log lines --------------------------
start_server j --log-format json || exit 1
j_pid=$pid url="http://127.0.0.1:$port"
curl -s -m 10 -D "$work/h9" -o /dev/null -H 'Origin: https://a.example' "$url/v1/models"
grep -qi '^Access-Control' "$work/h9" && fail "CORS headers without --allowed-origins: $(cat "$work/h9")"
curl -s -m 30 -o /dev/null -H 'x-request-id: json-1' "$url/v1/chat/completions" \
  -d '{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true}'
json_logged() { grep -q '"request_id":"json-1"' "$work/j.log"; }
wait_until 10 "no JSON access-log line: $(tail -3 "$work/j.log")" json_logged
stop_server "$j_pid" j
# every line of the log is a JSON object with time, level, what and msg
jq -e -s 'length > 3 and all(.[]; (.time | test("^20[0-9-]+T[0-9:.]+Z$")) and (.level | IN("error","warn","info","debug")) and (.what | type == "string") and (.msg | type == "string"))' \
  "$work/j.log" >/dev/null || fail "a log line is not a JSON object of the expected shape: $(head -c 600 "$work/j.log")"
jq -e -s 'map(select(.request_id == "json-1"))[0] | .method == "POST" and .path == "/v1/chat/completions" and .status == 200
  and .model == "tiny" and .prompt_tokens > 0 and .completion_tokens == 2 and (.ttft_ms | type == "number")
  and .duration_ms >= .ttft_ms and .client == "127.0.0.1"' "$work/j.log" >/dev/null ||
  fail "JSON access-log line: $(grep json-1 "$work/j.log")"

# an origin that browsers never send (a path) is refused at start-up
timeout $((30 * slow)) "$bin" serve -m "$work/tiny" --port 0 --allowed-origins 'https://a.example/' >"$work/o.log" 2>&1 &&
  fail "--allowed-origins with a path was accepted"
grep -q "allowed-origins: 'https://a.example/' is not an origin" "$work/o.log" || fail "bad origin message: $(cat "$work/o.log")"

finish
