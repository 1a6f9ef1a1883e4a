#!/usr/bin/env bash
# test_chat_tmux.sh - `gptoss chat` driven for real in a terminal (a detached tmux session on
# a private tmux server): a question gets a streamed answer region, /effort and /reset are
# acknowledged, Ctrl-C stops a long answer quickly and returns to the prompt, Ctrl-C at the
# prompt explains and a second one exits, /quit exits. A random tiny model writes gibberish:
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
# wait_for PATTERN SECONDS: polls the screen until grep -E matches.
# Sanitizer builds run several times slower: every wait stretches by the same factor.
slow=1
[ "${GPTOSS_SANITIZE:-0}" = 1 ] && slow=6
wait_for() {
    local deadline=$((SECONDS + $2 * slow))
    while [ $SECONDS -lt $deadline ]; do
        screen | grep -qE -- "$1" && return 0
        sleep 0.2
    done
    return 1
}
prompts() { screen | grep -cE '^> ?'; }

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
wait_for '^> ' 30 || fail "no prompt within 30 s"
tm send-keys -t chat "Hello, who are you?" Enter
wait_for '^> Hello, who are you\?' 5 || fail "the question was not echoed"
# Something must stream after the question (reasoning, answer or a tool call line).
answer_appeared() { screen | sed -n '/^> Hello, who are you?/,$p' | sed 1d | grep -qE '[^[:space:]]'; }
# 60 s: under a parallel ctest on a 2-core machine the reply's first text once took over 20 s
# (alone it takes well under 1 s); waiting longer costs nothing when it comes.
deadline=$((SECONDS + 60 * slow))
until answer_appeared; do
    [ $SECONDS -lt $deadline ] || fail "no answer text within 60 s"
    sleep 0.2
done
# 2. Ctrl-C stops the long answer: an [interrupted ...] note and a new prompt, quickly.
sleep 1
screen | grep -qE '^\[(stop|length|tool_calls)' && fail "the answer ended by itself; cannot test Ctrl-C"
t0=$SECONDS
tm send-keys -t chat C-c
wait_for '^\[interrupted after [0-9]+ tokens\]' 5 || fail "Ctrl-C did not interrupt the answer within 5 s"
wait_for '^\[interrupted after [0-9]+ tokens\]$' 1 && true
n_before=$(prompts)
[ "$n_before" -ge 2 ] || wait_for '^> $' 3 || fail "no prompt after the interruption"
echo "interrupted and back at the prompt in $((SECONDS - t0)) s"

# 3. /effort and /reset are acknowledged.
tm send-keys -t chat "/effort high" Enter
wait_for '^\[effort: high\]' 5 || fail "/effort high not acknowledged"
tm send-keys -t chat "/effort extreme" Enter
wait_for '^\[usage: /effort low\|medium\|high\]' 5 || fail "/effort extreme not refused"
tm send-keys -t chat "/reset" Enter
wait_for '^\[conversation reset\]' 5 || fail "/reset not acknowledged"

# 4. Ctrl-C at the prompt explains how to leave; /quit then exits the program.
tm send-keys -t chat C-c
wait_for 'Ctrl-C again or /quit to leave' 5 || fail "Ctrl-C at the prompt gave no hint"
tm send-keys -t chat "/quit" Enter
wait_for '^\[chat exited\] 0' 10 || fail "/quit did not exit with status 0"
tm kill-session -t chat

# 5. Two Ctrl-C in a row at the prompt exit; so does end of input (Ctrl-D).
start_chat -n 4
wait_for '^> ' 30 || fail "no prompt within 30 s (second session)"
tm send-keys -t chat C-c
wait_for 'Ctrl-C again' 5 || fail "no hint after the first Ctrl-C"
tm send-keys -t chat C-c
wait_for '^\[chat exited\] 0' 10 || fail "a second Ctrl-C did not exit"
tm kill-session -t chat
start_chat -n 4
wait_for '^> ' 30 || fail "no prompt within 30 s (third session)"
tm send-keys -t chat C-d
wait_for '^\[chat exited\] 0' 10 || fail "end of input (Ctrl-D) did not exit"
echo "ok: answer streamed, Ctrl-C interrupts, /effort, /reset, /quit, Ctrl-C twice, Ctrl-D"
