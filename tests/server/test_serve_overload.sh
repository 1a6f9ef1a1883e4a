#!/usr/bin/env bash
# test_serve_overload.sh - a tiny queue (one sequence, two waiting) overflows into 429 and
# recovers (server_client.mjs overload).
. "$(dirname "$0")/serve_lib.sh"
make_tiny

start_server c --api-key "$key" --max-num-seqs 1 --max-queue 2 || exit 1
c_pid=$pid
node_check overload "http://127.0.0.1:$port" "$key" tiny
stop_server "$c_pid" c

finish
