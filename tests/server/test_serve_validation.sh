#!/usr/bin/env bash
# test_serve_validation.sh - every request field is checked: a table of bad requests, each
# answered 400 in OpenAI's error shape naming the field (type and param); explicit nulls mean
# "not set"; a negative seed is an accepted seed; NUL characters (\u0000) pass in message
# content and prompts and are refused naming the field everywhere else.
. "$(dirname "$0")/serve_lib.sh"
make_tiny

start_server v || exit 1
v_pid=$pid url="http://127.0.0.1:$port"

# post PATH BODY : status in $code, body in $work/r.json
post() {
  code=$(curl -s -m $((60 * slow)) -o "$work/r.json" -w '%{http_code}' "$url$1" -H 'Content-Type: application/json' -d "$2")
}

# expect_param NAME PARAM : the last answer is a 400 invalid_request_error naming PARAM,
# whose message starts with the field's name.
expect_param() {
  local name=$1 param=$2
  [ "$code" = 400 ] || { fail "$name: status $code, expected 400: $(head -c 300 "$work/r.json")"; return; }
  jq -e --arg p "$param" '.error.type == "invalid_request_error" and .error.param == $p and
      (.error.message | type == "string" and startswith($p)) and (.error | has("code"))' \
    "$work/r.json" >/dev/null || fail "$name: expected param $param: $(head -c 300 "$work/r.json")"
}

msgs='"messages":[{"role":"user","content":"hi"}]'
chat="\"model\":\"tiny\",$msgs,\"max_tokens\":2"
# name | extra members of a chat request | the field named
while IFS='|' read -r name extra param; do
  [ -n "$name" ] || continue
  post /v1/chat/completions "{$chat,$extra}"
  expect_param "chat $name" "$param"
done <<'EOF'
logit_bias not an object|"logit_bias":[1,2]|logit_bias
logit_bias key not an id|"logit_bias":{"abc":1}|logit_bias
logit_bias value not a number|"logit_bias":{"5":"x"}|logit_bias
logit_bias value out of range|"logit_bias":{"5":101}|logit_bias
user not a string|"user":42|user
stop: 5 strings|"stop":["a","b","c","d","e"]|stop
stop: not strings|"stop":[1]|stop
stop: an object|"stop":{"a":1}|stop
seed not an integer|"seed":1.5|seed
n zero|"n":0|n
n not an integer|"n":"2"|n
stream_options without stream|"stream_options":{"include_usage":true}|stream_options
stream_options not an object|"stream":true,"stream_options":true|stream_options
stream_options unknown key|"stream":true,"stream_options":{"include_usages":true}|stream_options
stream_options.include_usage type|"stream":true,"stream_options":{"include_usage":"yes"}|stream_options
metadata not an object|"metadata":"x"|metadata
metadata value not a string|"metadata":{"k":1}|metadata
store true (not supported)|"store":true|store
service_tier flex (not supported)|"service_tier":"flex"|service_tier
parallel_tool_calls type|"parallel_tool_calls":"no"|parallel_tool_calls
modalities audio|"modalities":["text","audio"]|modalities
audio (not supported)|"audio":{"voice":"alloy","format":"wav"}|audio
prediction (not supported)|"prediction":{"type":"content","content":"x"}|prediction
web_search_options (not supported)|"web_search_options":{}|web_search_options
functions (deprecated)|"functions":[{"name":"f"}]|functions
function_call (deprecated)|"function_call":"auto"|function_call
prompt_cache_key type|"prompt_cache_key":7|prompt_cache_key
top_logprobs without logprobs|"top_logprobs":2|top_logprobs
NUL in model|"model":"tiny\u0000x"|model
NUL in stop|"stop":["a\u0000"]|stop[0]
NUL in a message name|"messages":[{"role":"user","content":"x","name":"a\u0000b"}]|messages[0].name
NUL in a role|"messages":[{"role":"us\u0000er","content":"x"}]|messages[0].role
NUL in a tool name|"tools":[{"type":"function","function":{"name":"f\u0000","parameters":{}}}]|tools[0].function.name
NUL in user|"user":"\u0000"|user
EOF

# completions: its own fields and the shared ones
while IFS='|' read -r name extra param; do
  [ -n "$name" ] || continue
  post /v1/completions "{\"model\":\"tiny\",\"prompt\":\"hi\",\"max_tokens\":2,$extra}"
  expect_param "completions $name" "$param"
done <<'EOF'
suffix (not supported)|"suffix":"x"|suffix
best_of 3 (not supported)|"best_of":3|best_of
echo (not supported)|"echo":true|echo
logprobs range|"logprobs":99|logprobs
stop: 5 strings|"stop":["a","b","c","d","e"]|stop
logit_bias id out of range|"logit_bias":{"999999999":1}|logit_bias
stream_options without stream|"stream_options":{"include_usage":false}|stream_options
EOF

# accepted: explicit nulls are "not set" (OpenAI's clients send them), four stop strings, the
# fields that need no work, a negative seed.
post /v1/chat/completions "{$chat,\"temperature\":null,\"top_p\":null,\"n\":null,\"stop\":null,\"seed\":null,\"logit_bias\":null,\"user\":null,\"stream\":null,\"stream_options\":null,\"logprobs\":null,\"top_logprobs\":null,\"max_completion_tokens\":null,\"metadata\":null,\"store\":null,\"frequency_penalty\":null,\"presence_penalty\":null}"
[ "$code" = 200 ] || fail "explicit nulls: $code $(head -c 300 "$work/r.json")"
post /v1/chat/completions "{$chat,\"stop\":[\"a\",\"b\",\"c\",\"d\"],\"user\":\"u-1\",\"metadata\":{\"k\":\"v\"},\"store\":false,\"service_tier\":\"auto\",\"parallel_tool_calls\":false,\"modalities\":[\"text\"],\"prompt_cache_key\":\"k\",\"safety_identifier\":\"s\",\"stream\":true,\"stream_options\":{\"include_usage\":true,\"include_obfuscation\":false}}"
[ "$code" = 200 ] || fail "accepted fields: $code $(head -c 300 "$work/r.json")"
for i in 1 2; do
  post /v1/completions '{"model":"tiny","prompt":"seed","max_tokens":6,"ignore_eos":true,"temperature":1,"seed":-7}'
  [ "$code" = 200 ] || fail "negative seed: $code $(head -c 300 "$work/r.json")"
  jq -r '.choices[0].text' "$work/r.json" >"$work/seed$i.txt"
done
cmp -s "$work/seed1.txt" "$work/seed2.txt" || fail "seed -7 did not repeat its text"
post /v1/completions '{"model":"tiny","prompt":"seed","max_tokens":6,"ignore_eos":true,"temperature":1,"seed":7}'
jq -r '.choices[0].text' "$work/r.json" >"$work/seed3.txt"
cmp -s "$work/seed1.txt" "$work/seed3.txt" && fail "seeds -7 and 7 gave the same text"

# NUL in content and prompts: accepted, and it reaches the prompt (one more token than without)
post /v1/chat/completions "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"a b\"}],\"max_tokens\":1}"
without=$(jq '.usage.prompt_tokens' "$work/r.json")
post /v1/chat/completions "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":\"a\u0000 b\"}],\"max_tokens\":1}"
[ "$code" = 200 ] || fail "NUL in content: $code $(head -c 300 "$work/r.json")"
with=$(jq '.usage.prompt_tokens' "$work/r.json")
[ "$with" -gt "$without" ] 2>/dev/null || fail "NUL in content did not reach the prompt ($with vs $without tokens)"
post /v1/chat/completions "{\"model\":\"tiny\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"x\u0000\"}]}],\"max_tokens\":1}"
[ "$code" = 200 ] || fail "NUL in a content part: $code $(head -c 300 "$work/r.json")"
post /v1/completions '{"model":"tiny","prompt":"a\u0000b","max_tokens":1}'
[ "$code" = 200 ] || fail "NUL in a prompt: $code $(head -c 300 "$work/r.json")"

stop_server "$v_pid" v
finish
