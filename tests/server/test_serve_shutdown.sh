#!/usr/bin/env bash
# test_serve_shutdown.sh - SIGTERM with requests that outlast --drain-timeout: the server exits
# within the timeout; every stream it cuts still ends with an OpenAI finish_reason ("length",
# never "abort") and `data: [DONE]` (ten shutdowns in a row, chat and completions streams);
# a second signal exits at once.
. "$(dirname "$0")/serve_lib.sh"
make_tiny

# stream NAME ENDPOINT : a generation far longer than any test waits, in the background
# ($work/NAME.sse); its curl's pid in $spid.
stream() {
  local body
  if [ "$2" = chat ]; then
    body='{"model":"tiny","messages":[{"role":"user","content":"go"}],"max_tokens":8000,"ignore_eos":true,"stream":true}'
    curl -sN -m $((60 * slow)) "$url/v1/chat/completions" -H 'Content-Type: application/json' -d "$body" >"$work/$1.sse" &
  else
    body='{"model":"tiny","prompt":"go","max_tokens":8000,"ignore_eos":true,"stream":true}'
    curl -sN -m $((60 * slow)) "$url/v1/completions" -H 'Content-Type: application/json' -d "$body" >"$work/$1.sse" &
  fi
  spid=$!
}
# tokens_flowing NAME : the stream sent its first chunk (the engine produced a token).
tokens_flowing() { grep -qs '^data: {' "$work/$1.sse"; }
# cut_ok NAME : ended by the cut: a "length" finish, no "abort", [DONE] as the last event.
cut_ok() {
  grep -q '"finish_reason":"length"' "$work/$1.sse" && ! grep -q abort "$work/$1.sse" &&
    [ "$(grep '^data: ' "$work/$1.sse" | tail -1)" = "data: [DONE]" ]
}
# exit_wait PID LIMIT : waits up to LIMIT seconds for PID to exit; its status in $rc.
exit_wait() {
  local deadline=$((SECONDS + $2))
  while kill -0 "$1" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.02; done
  if kill -0 "$1" 2>/dev/null; then kill -9 "$1"; fi
  wait "$1"; rc=$?
}
ms_since() { echo $(( (${EPOCHREALTIME/./} - $1) / 1000 )); }

# ---- --drain-timeout 2: exits within 2 s, having let the stream run until the cut ----------
start_server d --drain-timeout 2 || exit 1
d_pid=$pid url="http://127.0.0.1:$port"
stream d1 chat; c1=$spid
wait_until 30 "the stream never started: $(head -c 300 "$work/d1.sse")" tokens_flowing d1
t0=${EPOCHREALTIME/./}
kill -TERM "$d_pid"
exit_wait "$d_pid" $((10 * slow))
took=$(ms_since "$t0")
wait "$c1"
[ "$rc" = 0 ] || fail "exit status $rc after SIGTERM: $(tail -3 "$work/d.log")"
# 2 s, plus room for the engine step under way when the cut comes on a loaded machine
[ "$took" -le $((3000 * slow)) ] || fail "--drain-timeout 2 took $took ms to exit"
[ "$took" -ge 1000 ] || fail "--drain-timeout 2 exited after $took ms: requests were not given the time"
cut_ok d1 || fail "the cut stream did not end well: $(tail -c 400 "$work/d1.sse")"
grep -q 'cut by the drain timeout' "$work/d.log" || fail "the access log does not say the stream was cut"

# ---- a second signal exits at once ----------------------------------------------------------
start_server e --drain-timeout 60 || exit 1
e_pid=$pid url="http://127.0.0.1:$port"
stream e1 completions; c1=$spid
wait_until 30 "the stream never started" tokens_flowing e1
kill -TERM "$e_pid"
draining() { grep -q 'draining in-flight' "$work/e.log"; }
wait_until 10 "no drain message" draining
t0=${EPOCHREALTIME/./}
kill -INT "$e_pid"
exit_wait "$e_pid" $((10 * slow))
took=$(ms_since "$t0")
kill "$c1" 2>/dev/null; wait "$c1" 2>/dev/null
[ "$rc" = 130 ] || fail "second signal: exit status $rc, expected 130 (SIGINT)"
[ "$took" -le $((1000 * slow)) ] || fail "second signal: exit took $took ms"

# ---- ten shutdowns that cut a chat and a completions stream each ----------------------------
for i in $(seq 10); do
  start_server "r$i" --drain-timeout 0 || break
  r_pid=$pid url="http://127.0.0.1:$port"
  stream "r${i}c" chat; c1=$spid
  stream "r${i}p" completions; c2=$spid
  wait_until 30 "run $i: chat stream never started" tokens_flowing "r${i}c"
  wait_until 30 "run $i: completions stream never started" tokens_flowing "r${i}p"
  kill -TERM "$r_pid"
  exit_wait "$r_pid" $((10 * slow))
  wait "$c1" "$c2"
  [ "$rc" = 0 ] || fail "run $i: exit status $rc"
  cut_ok "r${i}c" || fail "run $i: chat stream: $(tail -c 300 "$work/r${i}c.sse")"
  cut_ok "r${i}p" || fail "run $i: completions stream: $(tail -c 300 "$work/r${i}p.sse")"
done

finish
