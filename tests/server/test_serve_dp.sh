#!/usr/bin/env bash
# test_serve_dp.sh - `gptoss serve --data-parallel-size 2` on the CPU: concurrent requests are
# spread over both engines, every greedy and seeded output equals a one-engine server's, the
# next turn of a conversation lands on the engine that holds the previous one (its prompt is
# served from the prefix cache), /health and /metrics cover both engines, and multi-process
# launches are refused with a message that says why.
. "$(dirname "$0")/serve_lib.sh"
make_tiny

# Bad command lines first (no model is loaded for them).
"$bin" serve -m "$work/tiny" --data-parallel-size 0 >"$work/out" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "data-parallel-size" "$work/out" || fail "--data-parallel-size 0: exit $rc: $(cat "$work/out")"
"$bin" serve -m "$work/tiny" --port 0 --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 >"$work/out" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "tensor-parallel-size" "$work/out" || fail "--nnodes 2: exit $rc, must name tensor parallelism: $(cat "$work/out")"
"$bin" serve -m "$work/tiny" --port 0 --node-rank 1 >"$work/out" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "need --nnodes" "$work/out" || fail "--node-rank without --nnodes: exit $rc: $(cat "$work/out")"
SLURM_PROCID=1 SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=2 SLURM_STEP_NUM_NODES=2 SLURM_NODEID=1 SLURM_LOCALID=0 \
  SLURM_STEP_NODELIST='n[1-2]' "$bin" serve -m "$work/tiny" --port 0 >"$work/out" 2>&1; rc=$?
[ $rc -eq 2 ] && grep -q "process 1 of 2 (Slurm)" "$work/out" || fail "a 2-task srun step: exit $rc: $(cat "$work/out")"

# -t 2 is the total: one thread per engine here. The single engine below runs two threads:
# the CPU backend's reductions run in a fixed order per token whatever the thread count.
GPTOSS_LOG_LEVEL=debug start_server dp -t 2 --data-parallel-size 2 --api-key "$key" || exit 1
dp_pid=$pid dp_url="http://127.0.0.1:$port"
grep -q "engine 0 (1 thread)" "$work/dp.log" && grep -q "engine 1 (1 thread)" "$work/dp.log" ||
  fail "no start-up line per engine: $(head -20 "$work/dp.log")"
start_server one -t 2 --api-key "$key" || exit 1
one_pid=$pid one_url="http://127.0.0.1:$port"

node -e '
const OpenAI = require("openai").default;
const fs = require("fs");
const [dpUrl, oneUrl, key, outFile] = process.argv.slice(1);
const dp = new OpenAI({ baseURL: dpUrl + "/v1", apiKey: key, maxRetries: 0, timeout: 120000 });
const one = new OpenAI({ baseURL: oneUrl + "/v1", apiKey: key, maxRetries: 0, timeout: 120000 });
let bad = 0;
const check = (c, what) => { if (!c) { console.log("FAIL: " + what); bad++; } };
// greedy and seeded sampling, concurrently: each output must not depend on the engine
const reqs = Array.from({ length: 8 }, (_, i) => ({ model: "tiny", prompt: `Request ${i}: ` + "tell me about it ".repeat(i + 1),
  max_tokens: 6, ignore_eos: true, ...(i % 2 ? { temperature: 0.9, seed: 1000 + i } : { temperature: 0 }) }));
(async () => {
  const a = await Promise.all(reqs.map((r) => dp.completions.create(r)));
  const b = await Promise.all(reqs.map((r) => one.completions.create(r)));
  a.forEach((x, i) => check(x.choices[0].text === b[i].choices[0].text,
    `request ${i} (${i % 2 ? "seeded" : "greedy"}): ${JSON.stringify(x.choices[0].text)} on 2 engines vs ${JSON.stringify(b[i].choices[0].text)} on 1`));
  // a conversation: turn 2 repeats turn 1 and adds to it
  const first = [{ role: "user", content: "Here is a long question about data parallel serving. ".repeat(12) }];
  const t1 = await dp.chat.completions.create({ model: "tiny", messages: first, max_tokens: 4, temperature: 0, ignore_eos: true });
  // Nothing runs now and engines take turns on ties, so without its prefix turn 2 would go
  // to the other engine.
  const second = [...first, { role: "assistant", content: t1.choices[0].message.content ?? "" }, { role: "user", content: "And a follow-up." }];
  const t2 = await dp.chat.completions.create({ model: "tiny", messages: second, max_tokens: 4, temperature: 0, ignore_eos: true });
  const cached = t2.usage.prompt_tokens_details?.cached_tokens ?? 0;
  // every full block of turn 1 but the last (which may hold the tokens where the turns part)
  const want = Math.floor(t1.usage.prompt_tokens / 16) * 16 - 16;
  check(cached >= want, `turn 2 found ${cached} cached prompt tokens, want >= ${want} of turn 1 (${t1.usage.prompt_tokens})`);
  fs.writeFileSync(outFile, JSON.stringify({ t1: t1.id, t2: t2.id, cached }));
  process.exit(bad ? 1 : 0);
})().catch((e) => { console.log("FAIL: " + e.message); process.exit(1); });
' "$dp_url" "$one_url" "$key" "$work/conv.json" || fail "two engines vs one"

# The router's decisions (debug log): both engines served, and turn 2 went by prefix to the
# engine of turn 1.
routes=$(grep -c "router: request .* -> engine" "$work/dp.log")
e0=$(grep -c "router: request .* -> engine 0" "$work/dp.log")
e1=$(grep -c "router: request .* -> engine 1" "$work/dp.log")
[ "$routes" -ge 10 ] && [ "$e0" -ge 3 ] && [ "$e1" -ge 3 ] || fail "requests not spread: $e0 on engine 0, $e1 on engine 1 of $routes"
last=$(grep "router: request .* -> engine" "$work/dp.log" | tail -1)
case "$last" in *"(prefix, prefix "*) ;; *) fail "turn 2 was not routed by its prefix: $last" ;; esac

[ "$(curl -s -m 2 -o /dev/null -w '%{http_code}' "$dp_url/health")" = 200 ] || fail "/health of the two-engine server"
total=$(metric "$dp_url" "gptoss_kv_cache_blocks_capacity")
single=$(metric "$one_url" "gptoss_kv_cache_blocks_capacity")
[ -n "$total" ] && [ -n "$single" ] && [ $((total)) -eq $((2 * (single / 2))) ] ||
  fail "/metrics KV blocks: $total on two engines, $single on one (the CPU budget is split)"
gen=$(metric "$dp_url" "gptoss_generation_tokens_total")
[ "${gen%.*}" -ge 56 ] 2>/dev/null || fail "/metrics generation tokens summed over engines: $gen, want >= 56"

stop_server "$one_pid" one
stop_server "$dp_pid" dp
finish
