#!/usr/bin/env bash
# test_serve_structured.sh - structured output end to end: response_format (json_schema,
# json_object), tool_choice (required, named, none) with strict and loose tools, the official
# `openai` client's parse and the AI SDK's generateObject, and every kind of bad schema or
# field, against the random tiny model at temperature 1 (test_serve_structured.mjs). The
# matcher's own coverage of schemas is tests/structured; the harmony framing's is
# tests/structured/test_harmony_constraint.c.
. "$(dirname "$0")/serve_lib.sh"
make_tiny

start_server s || exit 1
s_pid=$pid
url="http://127.0.0.1:$port"
# 54 schemas of the client's own, and 18 of the matcher's test generator (every keyword); a
# sanitizer build (each new automaton state's mask walk over the vocabulary several times
# slower) sends 12 and 6, which still cover every effort, and leaves the rest to the release
# run
n_own=54 n_walk=18
[ "$slow" -gt 1 ] && n_own=12 n_walk=6
node "$src/tests/structured/json_schema_walks.mjs" gen "$work/walk_schemas.json" $n_walk 7 || fail "schema generator"
timeout $((300 * slow)) node "$here/test_serve_structured.mjs" "$url" tiny $n_own "$work/walk_schemas.json" ||
  fail "structured output client"

# A request that nothing constrains is untouched: no tools, no response_format.
code=$(curl -s -m 60 -o "$work/plain.json" -w '%{http_code}' "$url/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"temperature":1}')
[ "$code" = 200 ] && grep -q '"finish_reason":"length"' "$work/plain.json" || fail "plain request: $code $(head -c 300 "$work/plain.json")"
healthy || fail "server unhealthy at the end"
stop_server "$s_pid" s
finish
