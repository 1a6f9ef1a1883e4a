#!/usr/bin/env bash
# test_serve_load.sh - one server under load (server_client.mjs load: a greedy answer alone ==
# among 30 others, 200 concurrent streams) and clients that hang up mid-stream (disconnect: the
# request is cancelled and its KV blocks freed, for chat and completions).
. "$(dirname "$0")/serve_lib.sh"
make_tiny

start_server a --api-key "$key" --max-body-bytes 262144 || exit 1
a_pid=$pid a_url="http://127.0.0.1:$port"
node_check load "$a_url" "$key" tiny
node_check disconnect "$a_url" "$key" tiny
stop_server "$a_pid" a

finish
