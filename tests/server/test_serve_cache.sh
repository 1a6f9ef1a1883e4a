#!/usr/bin/env bash
# test_serve_cache.sh - the same greedy requests give the same outputs with the prefix cache
# on and off (and alone vs. batched, inside server_client.mjs collect); cached tokens are
# reported only with the cache on.
. "$(dirname "$0")/serve_lib.sh"
make_tiny

start_server a --api-key "$key" || exit 1
a_pid=$pid a_url="http://127.0.0.1:$port"
start_server b --api-key "$key" --no-prefix-cache || exit 1
b_pid=$pid b_url="http://127.0.0.1:$port"
node_check collect "$a_url" "$key" tiny "$work/with_cache.json"
node_check collect "$b_url" "$key" tiny "$work/without_cache.json"
node -e '
const fs = require("fs");
const a = JSON.parse(fs.readFileSync(process.argv[1])), b = JSON.parse(fs.readFileSync(process.argv[2]));
let bad = 0;
a.forEach((x, i) => { if (x.content !== b[i].content || x.reasoning !== b[i].reasoning) { console.log(`request ${i}: ${JSON.stringify(x)} vs ${JSON.stringify(b[i])}`); bad++; } });
if (!a.some(x => x.cached > 0)) { console.log("prefix cache never hit with the cache on"); bad++; }
if (b.some(x => x.cached > 0)) { console.log("cached tokens reported with the cache off"); bad++; }
process.exit(bad ? 1 : 0);' "$work/with_cache.json" "$work/without_cache.json" || fail "outputs differ with the prefix cache on vs off"
stop_server "$b_pid" b
stop_server "$a_pid" a

finish
