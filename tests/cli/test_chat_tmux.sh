#!/usr/bin/env bash
# test_chat_tmux.sh - `gptoss chat` driven for real in a terminal (a detached tmux session on
# a private tmux server): a question gets a streamed answer region, /effort and /reset are
# acknowledged, the up and down arrows recall earlier lines (libedit), Ctrl-C stops a long
# answer quickly and returns to the prompt, Ctrl-C at the prompt explains and a second one
# exits, /quit exits. A random tiny model writes gibberish:
# this tests the mechanics, not the content. Skips (exit 0) only when tmux is absent.
set -u
if ! command -v tmux >/dev/null 2>&1; then
    echo "SKIP: tmux is not installed"
    exit 0
fi
bin="${GPTOSS_BIN:?}"
dir="$(mktemp -d)"
sock="gptoss-chat-test-$$"
tm() { tmux -L "$sock" "$@"; }
cleanup() { tm kill-server >/dev/null 2>&1; rm -rf "$dir"; }
trap cleanup EXIT
fail() {
    echo "FAIL: $*"
    echo "---- screen ----"
    tm capture-pane -p -t chat 2>/dev/null | sed -e '/^$/d'
    exit 1
}
screen() { tm capture-pane -p -J -S - -t chat; }
# Every wait is for an event on the screen, with a deadline far beyond the time the event
# takes (well under a second alone, a few seconds on a loaded 2-core machine): a deadline is
# reached only when the event never comes, so a slow machine makes the test slower, not red.
# Sanitizer builds run several times slower: every deadline stretches by the same factor.
slow=1
[ "${GPTOSS_SANITIZE:-0}" = 1 ] && slow=6
# wait_until SECONDS COMMAND...: polls until COMMAND succeeds; 1 when the deadline passes.
wait_until() {
    local deadline=$((SECONDS + $1 * slow))
    shift
    until "$@"; do
        [ $SECONDS -lt $deadline ] || return 1
        sleep 0.2
    done
}
on_screen() { screen | grep -qE -- "$1"; }
# wait_for PATTERN SECONDS: waits until a screen line matches grep -E PATTERN.
wait_for() { wait_until "$2" on_screen "$1"; }
# at_prompt: the last line written is an empty prompt.
at_prompt() { screen | sed -e '/^$/d' | tail -1 | grep -qE '^> ?$'; }

"$bin" make-model --preset tiny -o "$dir/tiny" >/dev/null 2>&1 || fail "make-model --preset tiny"
# A session that lives for the whole test keeps the private tmux server up. Without it,
# killing the chat session stops the server, and a new-session sent at that moment can reach
# the exiting server and fail with "server exited unexpectedly".
tm new-session -d -s keep "sleep 100000" || fail "tmux could not start a session"
# start_chat ARGS...: `gptoss chat` on the tiny model in the session "chat"; the pane stays
# after it exits, showing its status.
start_chat() {
    tm new-session -d -s chat -x 160 -y 50 \
        "'$bin' chat -m '$dir/tiny' $* -t 2; echo '[chat exited]' \$?; sleep 30" ||
        fail "tmux could not start the chat session"
}

# 1. A question: an answer region streams between the question and the next prompt. A large
#    --max-tokens makes the answer long enough to interrupt.
start_chat --max-tokens 100000 --date 2025-06-28
wait_for '^> ' 120 || fail "no prompt within 120 s"
tm send-keys -t chat "Hello, who are you?" Enter
wait_for '^> Hello, who are you\?' 60 || fail "the question was not echoed"
# Something must stream after the question (reasoning, answer or a tool call line).
answer_appeared() { screen | sed -n '/^> Hello, who are you?/,$p' | sed 1d | grep -qE '[^[:space:]]'; }
wait_until 120 answer_appeared || fail "no answer text within 120 s"
# 2. Ctrl-C stops the long answer: an [interrupted ...] note and a new prompt. It is sent as
#    soon as the answer shows, a few tokens in. Greedy decoding makes the answer the same on
#    every run, and it runs on for hundreds of tokens: had it ended by itself, Ctrl-C would
#    reach the prompt and print the hint of step 4 instead, which is reported as such. 60 s
#    separates an interrupted answer (under a second) from one that runs on to 100000 tokens.
t0=$SECONDS
tm send-keys -t chat C-c
interrupt_seen() { on_screen '^\[interrupted after [0-9]+ tokens\]|Ctrl-C again or /quit to leave|^\[(length|tool_calls|context full)'; }
wait_until 60 interrupt_seen || fail "Ctrl-C did not interrupt the answer within 60 s"
on_screen '^\[interrupted after [0-9]+ tokens\]' ||
    fail "the answer ended by itself before Ctrl-C came (a changed model or sampler?); cannot test Ctrl-C"
wait_until 30 at_prompt || fail "no prompt after the interruption"
echo "interrupted and back at the prompt in $((SECONDS - t0)) s"

# 3. /effort and /reset are acknowledged.
tm send-keys -t chat "/effort high" Enter
wait_for '^\[effort: high\]' 30 || fail "/effort high not acknowledged"
tm send-keys -t chat "/effort extreme" Enter
wait_for '^\[usage: /effort low\|medium\|high\]' 30 || fail "/effort extreme not refused"
tm send-keys -t chat "/reset" Enter
wait_for '^\[conversation reset\]' 30 || fail "/reset not acknowledged"
wait_until 30 at_prompt || fail "no prompt after /reset"

# 3b. Line editing (libedit): Up recalls the previous line into the prompt, a second Up the one
#     before, Down goes back; Enter sends the recalled line. A build without libedit says so in
#     `chat --help`, and only then is this skipped.
if "$bin" chat --help | grep -q '^line editing (libedit'; then
    usage_lines() { screen | grep -cE '^\[usage: /effort low\|medium\|high\]'; }
    # the prompt line now (the last line written), not the lines typed before
    prompt_shows() { screen | sed -e '/^$/d' | tail -1 | grep -qE -- "^> $1 *\$"; }
    tm send-keys -t chat Up
    wait_until 30 prompt_shows /reset || fail "Up did not recall the previous line (/reset)"
    tm send-keys -t chat Up
    wait_until 30 prompt_shows '/effort extreme' || fail "a second Up did not recall /effort extreme"
    tm send-keys -t chat Down
    wait_until 30 prompt_shows /reset || fail "Down did not go back to /reset"
    tm send-keys -t chat Up Enter
    two_usages() { [ "$(usage_lines)" -ge 2 ]; }
    wait_until 30 two_usages || fail "the recalled /effort extreme was not sent"
    wait_until 30 at_prompt || fail "no prompt after the recalled line"
    echo "history: Up and Down recall earlier lines"
else
    "$bin" chat --help | grep -q '^line editing: not in this build' ||
        fail "chat --help says nothing about line editing"
    echo "line editing not in this build (chat --help says so): history not tested"
fi

# 4. Ctrl-C at the prompt explains how to leave; /quit then exits the program.
tm send-keys -t chat C-c
wait_for 'Ctrl-C again or /quit to leave' 30 || fail "Ctrl-C at the prompt gave no hint"
tm send-keys -t chat "/quit" Enter
wait_for '^\[chat exited\] 0' 60 || fail "/quit did not exit with status 0"
tm kill-session -t chat

# 5. Two Ctrl-C in a row at the prompt exit; so does end of input (Ctrl-D).
start_chat -n 4
wait_for '^> ' 120 || fail "no prompt within 120 s (second session)"
tm send-keys -t chat C-c
wait_for 'Ctrl-C again' 30 || fail "no hint after the first Ctrl-C"
tm send-keys -t chat C-c
wait_for '^\[chat exited\] 0' 60 || fail "a second Ctrl-C did not exit"
tm kill-session -t chat
start_chat -n 4
wait_for '^> ' 120 || fail "no prompt within 120 s (third session)"
tm send-keys -t chat C-d
wait_for '^\[chat exited\] 0' 60 || fail "end of input (Ctrl-D) did not exit"
echo "ok: answer streamed, Ctrl-C interrupts, /effort, /reset, history, /quit, Ctrl-C twice, Ctrl-D"
