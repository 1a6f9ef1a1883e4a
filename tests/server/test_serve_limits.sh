#!/usr/bin/env bash
# test_serve_limits.sh - overload and connection limits: a full queue answers 429 with
# Retry-After and a message that says it once; --max-connections bounds the connections (a
# thread each) however many a client opens, --max-connections-per-ip bounds one address, and
# connections that send nothing are closed after --idle-timeout, after which the server
# answers again.
. "$(dirname "$0")/serve_lib.sh"
make_tiny

# ---- 429: one sequence, one waiting, eight clients ------------------------------------------
start_server q --max-num-seqs 1 --max-queue 1 || exit 1
q_pid=$pid url="http://127.0.0.1:$port"
cpids=()
for i in $(seq 8); do
  curl -s -m $((120 * slow)) -D "$work/q$i.h" -o "$work/q$i.json" "$url/v1/completions" -H 'Content-Type: application/json' \
    -d '{"model":"tiny","prompt":"busy","max_tokens":40,"ignore_eos":true}' &
  cpids+=($!)
done
wait "${cpids[@]}"
n429=0 n200=0
for i in $(seq 8); do
  if grep -q '^HTTP/1.1 429' "$work/q$i.h"; then
    n429=$((n429 + 1))
    tr -d '\r' <"$work/q$i.h" | grep -qx 'Retry-After: [1-9][0-9]*' || fail "429 without Retry-After: $(cat "$work/q$i.h")"
    jq -e '.error.type == "rate_limit_error" and .error.code == "queue_full" and
        (.error.message | test("capacity") and ([match("retry later"; "g")] | length) == 1 and ([match("capacity"; "g")] | length) == 1)' \
      "$work/q$i.json" >/dev/null || fail "429 body: $(cat "$work/q$i.json")"
  elif grep -q '^HTTP/1.1 200' "$work/q$i.h"; then
    n200=$((n200 + 1))
  fi
done
[ $n429 -ge 1 ] && [ $n200 -ge 1 ] && [ $((n429 + n200)) = 8 ] || fail "overload: $n200 x 200 and $n429 x 429 of 8"
stop_server "$q_pid" q

# flood MAX : opens MAX idle connections at once and holds them; prints, as JSON, how many
# the server closed within a second (refused), how many it closed later (idle timeout) and
# how many were still open after $2 seconds.
flood() {
  timeout $((60 * slow)) node -e '
    const net = require("node:net");
    const [port, n, holdS] = process.argv.slice(1).map(Number);
    const t0 = Date.now(); let early = 0, late = 0, open = 0;
    for (let i = 0; i < n; i++) {
      const s = net.connect(port, "127.0.0.1"); open++;
      s.on("error", () => {});
      s.on("close", () => { open--; (Date.now() - t0 < 1000 ? early++ : late++); });
    }
    setTimeout(() => { console.log(JSON.stringify({ early, late, open })); process.exit(0); }, holdS * 1000);
  ' "$port" "$1" "$2"
}
threads() { sed -n 's/^Threads:[[:space:]]*//p' "/proc/$1/status"; }

# ---- 300 idle connections against --max-connections 64 ---------------------------------------
start_server m --max-connections 64 --idle-timeout 2 || exit 1
m_pid=$pid url="http://127.0.0.1:$port"
base=$(threads "$m_pid")
flood 300 $((5 * slow)) >"$work/flood.json" &
fpid=$!
peak=0
for _ in $(seq 30); do
  t=$(threads "$m_pid"); [ "${t:-0}" -gt $peak ] && peak=$t
  sleep 0.05
done
wait $fpid
[ $peak -le $((base + 64 + 2)) ] || fail "--max-connections 64: $peak threads (from $base)"
[ $peak -ge $((base + 32)) ] || fail "the flood made only $((peak - base)) connection threads: did it connect?"
jq -e '.early >= 150 and .late >= 32 and .open == 0' "$work/flood.json" >/dev/null ||
  fail "300 connections, limit 64, idle timeout 2 s: $(cat "$work/flood.json") (want most refused at once, the rest closed when idle)"
grep -q 'connection limit' "$work/m.log" || fail "refused connections are not logged: $(tail -3 "$work/m.log")"
healthy || fail "/health after the flood: $(health_code)"
stop_server "$m_pid" m

# ---- --max-connections-per-ip 8 ---------------------------------------------------------------
start_server p --max-connections-per-ip 8 --idle-timeout 60 || exit 1
p_pid=$pid
flood 40 2 >"$work/flood2.json"
jq -e '.early + .late == 32 and .open == 8' "$work/flood2.json" >/dev/null || fail "--max-connections-per-ip 8, 40 connections: $(cat "$work/flood2.json")"
stop_server "$p_pid" p

finish
