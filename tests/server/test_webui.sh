#!/usr/bin/env bash
# test_webui.sh - the chat page at GET /: its headers over curl (type, caching, the CSP, served
# without the API key the API needs, 304 on a matching ETag), then the page itself driven in
# headless Chromium by webui_browser.mjs against the tiny model (streaming, reasoning, two
# turns, Stop, the key prompt, errors, HTML injection, markdown and code), and the server's
# side of Stop (the generation is cancelled); --no-webui turns GET / into a 404.
# Screenshots: $GPTOSS_BUILD_DIR/artifacts/webui/*.png. CHROMIUM=PATH picks another browser binary.
. "$(dirname "$0")/serve_lib.sh"
chromium=${CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$chromium" ]; then
  echo "FAIL: $chromium is missing: run scripts/setup (it installs the Debian package chromium)"
  exit 1
fi
artifacts="${GPTOSS_BUILD_DIR:?run through ctest}/artifacts/webui"
rm -rf "$artifacts" && mkdir -p "$artifacts"
make_tiny

start_server a --api-key "$key" || exit 1
a_pid=$pid a_url="http://127.0.0.1:$port"

# curl: the page needs no key (its API calls carry one), and has the headers a browser needs
code=$(curl -s -m 10 -D "$work/h.txt" -o "$work/page.html" -w '%{http_code}' "$a_url/")
[ "$code" = 200 ] || fail "GET / without a key: $code, expected 200"
grep -qi '^content-type: text/html; charset=utf-8' "$work/h.txt" || fail "GET / content-type: $(grep -i content-type "$work/h.txt")"
grep -qi '^cache-control: no-cache' "$work/h.txt" || fail "GET / has no Cache-Control: no-cache"
grep -qi "^content-security-policy: default-src 'none'; script-src 'sha256-" "$work/h.txt" || fail "GET / CSP: $(grep -i content-security "$work/h.txt")"
grep -q '<title>gptoss chat</title>' "$work/page.html" || fail "GET / is not the chat page"
grep -q 'license notices follow' "$work/page.html" || fail "the page lacks the libraries' license notices"
if grep -Eqi '(src|href)=["'\'']?(https?:)?//' "$work/page.html"; then fail "the page loads something from another host"; fi
etag=$(sed -n 's/^[Ee][Tt]ag: \(.*\)\r$/\1/p' "$work/h.txt")
code=$(curl -s -m 10 -o /dev/null -w '%{http_code}' -H "If-None-Match: $etag" "$a_url/")
[ -n "$etag" ] && [ "$code" = 304 ] || fail "GET / with If-None-Match $etag: $code, expected 304"
code=$(curl -s -m 10 -o /dev/null -w '%{http_code}' "$a_url/index.php")
[ "$code" = 404 ] || fail "GET /index.php: $code, expected 404 (only / is the page)"

# the browser: the release run only. What the page asks of the server is the chat API that the
# other server tests drive under the sanitizers too; here they would add minutes of a slowed
# tiny model generating for a browser that is not itself sanitized.
if [ "$slow" -gt 1 ]; then
  echo "sanitizer build: browser checks left to the release run"
  stop_server "$a_pid" a
else
echo "screenshots: $artifacts"
timeout $((90 * slow)) node "$here/webui_browser.mjs" "$a_url" "$key" "$artifacts" || fail "browser checks (webui_browser.mjs)"
ls "$artifacts"/*.png >/dev/null 2>&1 || fail "no screenshots in $artifacts"

# Stop in the page closed the stream of up to 6000 tokens: the server cancelled it early
cancelled() { grep -Eq 'POST /v1/chat/completions 200 .*completion_tokens=[0-9]+ .*: client closed the stream' "$work/a.log"; }
if wait_until 10 "no cancelled stream in the access log: $(grep serve: "$work/a.log" | tail -8)" cancelled; then
  n=$(sed -nE 's/.*POST \/v1\/chat\/completions 200 .*completion_tokens=([0-9]+) .*: client closed the stream.*/\1/p' "$work/a.log" | head -1)
  echo "stop: the server cancelled the generation after $n tokens"
  [ "$n" -lt 6000 ] || fail "the stopped generation ran to its end ($n tokens)"
fi
stop_server "$a_pid" a
fi

# --no-webui
start_server b --no-webui || exit 1
code=$(curl -s -m 10 -o "$work/b.txt" -w '%{http_code}' "http://127.0.0.1:$port/")
[ "$code" = 404 ] || fail "GET / with --no-webui: $code, expected 404"
grep -q -- '--no-webui' "$work/b.txt" || fail "the 404 does not say why: $(cat "$work/b.txt")"
code=$(curl -s -m 10 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v1/models")
[ "$code" = 200 ] || fail "/v1/models with --no-webui: $code"
stop_server "$pid" b

finish
