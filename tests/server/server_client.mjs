// server_client.mjs - end-to-end client checks of `gptoss serve`, driven by the test_serve_*.sh tests.
//
// Uses the official `openai` npm client (5.23.2) and node's own fetch/net, never our code,
// so the server is judged by what real clients see. Usage:
//   node server_client.mjs MODE BASE_URL API_KEY MODEL [OUTFILE]
// MODE: api | collect | load | disconnect | overload. Exits 1 (printing each failure) when a
// check fails. Every wait is bounded by a timeout.
import OpenAI from 'openai';
import net from 'node:net';
import fs from 'node:fs';

const [mode, base, apiKey, model, outFile] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0, timeout: 300000 });
const failures = [];
const check = (cond, what) => { if (!cond) { failures.push(what); console.log(`FAIL: ${what}`); } };
const auth = { Authorization: `Bearer ${apiKey}`, 'Content-Type': 'application/json' };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function post(path, body, headers = auth) {
  const r = await fetch(`${base}${path}`, { method: 'POST', headers, body: typeof body === 'string' ? body : JSON.stringify(body), signal: AbortSignal.timeout(60000) });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* checked by callers */ }
  return { status: r.status, json, text };
}

function isErrorShape(j) {
  return j && j.error && typeof j.error.message === 'string' && j.error.message.length > 0 &&
    typeof j.error.type === 'string' && 'param' in j.error && 'code' in j.error;
}

async function metrics() {
  const r = await fetch(`${base}/metrics`, { signal: AbortSignal.timeout(10000) });
  const text = await r.text();
  const get = (name) => {
    const m = text.match(new RegExp(`^${name}\\{[^}]*\\} ([0-9.eE+-]+)$`, 'm'));
    return m ? Number(m[1]) : NaN;
  };
  return { text, get };
}

const user = (content) => [{ role: 'user', content }];

// ---- api: the endpoints through the openai client, and every kind of bad request ---------
async function api() {
  // models
  const models = await client.models.list();
  check(models.data.length === 1 && models.data[0].id === model, `models.list gives [${model}]`);

  // chat, not streaming
  const chat = await client.chat.completions.create({ model, messages: user('Say hi'), max_tokens: 6, temperature: 0 });
  check(chat.object === 'chat.completion' && typeof chat.id === 'string', 'chat object and id');
  const msg = chat.choices[0].message;
  check(msg.role === 'assistant', 'chat message role assistant');
  check(msg.content === null || typeof msg.content === 'string', 'chat content is a string or null');
  check(msg.reasoning_content === null || typeof msg.reasoning_content === 'string', 'reasoning_content string or null');
  check(['length', 'stop', 'tool_calls'].includes(chat.choices[0].finish_reason), `chat finish_reason ${chat.choices[0].finish_reason}`);
  const u = chat.usage;
  check(u.completion_tokens >= 1 && u.completion_tokens <= 6, `chat usage.completion_tokens ${u.completion_tokens} in [1,6]`);
  check(u.total_tokens === u.prompt_tokens + u.completion_tokens, 'usage total = prompt + completion');
  check(Number.isInteger(u.completion_tokens_details.reasoning_tokens) && u.completion_tokens_details.reasoning_tokens <= u.completion_tokens,
    'usage.completion_tokens_details.reasoning_tokens is an integer <= completion_tokens');

  // chat, streaming: chunk structure, deltas typed by channel, usage at the end
  const stream = await client.chat.completions.create({ model, messages: user('Count to three'), max_tokens: 8, temperature: 0, stream: true, stream_options: { include_usage: true }, reasoning_effort: 'low' });
  let chunks = 0, roleSeen = false, finish = null, usage = null, content = '', reasoning = '';
  for await (const ch of stream) {
    chunks++;
    check(ch.object === 'chat.completion.chunk', 'chunk object');
    if (ch.usage) usage = ch.usage;
    for (const c of ch.choices) {
      const d = c.delta;
      if (d.role) roleSeen = d.role === 'assistant';
      if (d.content != null) { check(typeof d.content === 'string', 'delta.content string'); content += d.content; }
      if (d.reasoning_content != null) { check(typeof d.reasoning_content === 'string', 'delta.reasoning_content string'); reasoning += d.reasoning_content; }
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  check(chunks >= 3 && roleSeen, 'stream: role chunk then deltas');
  check(finish === 'length' || finish === 'stop', `stream finish_reason ${finish}`);
  check(usage && usage.completion_tokens >= 1 && usage.completion_tokens <= 8, 'stream usage chunk (include_usage)');
  check(usage && usage.completion_tokens_details.reasoning_tokens <= usage.completion_tokens, 'stream reasoning_tokens bounded');
  check(usage && (usage.completion_tokens_details.reasoning_tokens > 0) === (reasoning.length > 0) || reasoning.length === 0,
    'reasoning tokens counted when reasoning text streamed');
  // The same request without streaming gives the same text (greedy), split the same way.
  const same = await client.chat.completions.create({ model, messages: user('Count to three'), max_tokens: 8, temperature: 0, reasoning_effort: 'low' });
  check((same.choices[0].message.content ?? '') === content, `stream content == non-stream content (${JSON.stringify(content)} vs ${JSON.stringify(same.choices[0].message.content)})`);
  check((same.choices[0].message.reasoning_content ?? '') === reasoning, 'stream reasoning == non-stream reasoning');

  // completions: string prompt, token-id prompt, logprobs, streaming
  const comp = await client.completions.create({ model, prompt: 'The capital of France is', max_tokens: 5, temperature: 0, ignore_eos: true, logprobs: 2 });
  check(comp.object === 'text_completion' && typeof comp.choices[0].text === 'string', 'completions object and text');
  check(comp.usage.completion_tokens === 5, `completions ignore_eos gives exactly 5 tokens (${comp.usage.completion_tokens})`);
  const lp = comp.choices[0].logprobs;
  check(lp && lp.tokens.length === 5 && lp.token_logprobs.every((x) => x <= 0) && lp.top_logprobs.every((t) => Object.keys(t).length <= 2),
    'completions logprobs: 5 tokens, logprobs <= 0, <= 2 alternatives');
  check(lp && lp.tokens.join('') === comp.choices[0].text, 'completions: text is the concatenation of the tokens');
  // the same prompt as token ids (from gpt-tokenizer, an independent encoder) gives the same text
  const { encode } = await import('gpt-tokenizer/encoding/o200k_harmony');
  const ids = encode('The capital of France is');
  const comp2 = await client.completions.create({ model, prompt: ids, max_tokens: 5, temperature: 0, ignore_eos: true });
  check(comp2.choices[0].text === comp.choices[0].text, 'completions: token-id prompt == string prompt');
  check(comp2.usage.prompt_tokens === ids.length, `completions prompt_tokens ${comp2.usage.prompt_tokens} == gpt-tokenizer count ${ids.length}`);
  let streamed = '';
  for await (const ch of await client.completions.create({ model, prompt: ids, max_tokens: 5, temperature: 0, ignore_eos: true, stream: true }))
    streamed += ch.choices[0]?.text ?? '';
  check(streamed === comp.choices[0].text, 'completions stream == non-stream');
  // stop string: the text is cut right before the stop string
  const full = comp.choices[0].text;
  if (full.length >= 3) {
    const stop = full.slice(1, 3);
    const cut = await client.completions.create({ model, prompt: ids, max_tokens: 5, temperature: 0, ignore_eos: true, stop: [stop] });
    check(cut.choices[0].text === full.slice(0, full.indexOf(stop)) && cut.choices[0].finish_reason === 'stop',
      `stop string '${stop}' cuts the text (${JSON.stringify(cut.choices[0].text)})`);
  }
  // n choices and seeded sampling
  const nres = await client.completions.create({ model, prompt: ids, max_tokens: 3, temperature: 1, seed: 7, n: 2, ignore_eos: true });
  check(nres.choices.length === 2 && nres.choices.map((c) => c.index).sort().join() === '0,1', 'n=2 gives choices 0 and 1');
  const nres2 = await client.completions.create({ model, prompt: ids, max_tokens: 3, temperature: 1, seed: 7, n: 2, ignore_eos: true });
  check(JSON.stringify(nres.choices.map((c) => c.text)) === JSON.stringify(nres2.choices.map((c) => c.text)), 'same seed, same samples');

  // tools: request side (tools + a tool result in the history), response shape
  const tools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather for a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } } }];
  const history = [
    { role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c":21}' },
  ];
  const plain = await client.chat.completions.create({ model, messages: history.slice(0, 1), max_tokens: 1, temperature: 0 });
  const withTools = await client.chat.completions.create({ model, messages: history, tools, tool_choice: 'auto', max_tokens: 6, temperature: 0 });
  check(withTools.usage.prompt_tokens > plain.usage.prompt_tokens + 20, 'tools and tool results reach the prompt');
  const tmsg = withTools.choices[0].message;
  check(tmsg.role === 'assistant' && (tmsg.tool_calls === undefined || Array.isArray(tmsg.tool_calls)), 'tool round trip response shape');
  for (const tc of tmsg.tool_calls ?? [])
    check(tc.type === 'function' && typeof tc.id === 'string' && typeof tc.function.name === 'string' && typeof tc.function.arguments === 'string', 'tool_call shape');
  const none = await client.chat.completions.create({ model, messages: history, tools, tool_choice: 'none', max_tokens: 1, temperature: 0 });
  check(none.usage.prompt_tokens < withTools.usage.prompt_tokens, 'tool_choice none leaves the tool definitions out');

  // bad requests: status, OpenAI error shape, the field named
  const good = { model, messages: user('hi'), max_tokens: 2 };
  const bad = [
    ['invalid JSON', '{"model":', 400, null],
    ['not an object', '[1,2]', 400, null],
    ['no messages', { model }, 400, 'messages'],
    ['bad role', { ...good, messages: [{ role: 'wizard', content: 'x' }] }, 400, 'messages[0].role'],
    ['temperature type', { ...good, temperature: 'hot' }, 400, 'temperature'],
    ['temperature range', { ...good, temperature: 5 }, 400, 'temperature'],
    ['top_p range', { ...good, top_p: 0 }, 400, 'top_p'],
    ['max_tokens zero', { ...good, max_tokens: 0 }, 400, 'max_tokens'],
    ['max_tokens huge', { ...good, max_tokens: 100000000 }, 400, 'max_tokens'],
    ['n huge', { ...good, n: 100000 }, 400, 'n'],
    ['top_logprobs range', { ...good, logprobs: true, top_logprobs: 99 }, 400, 'top_logprobs'],
    ['stop type', { ...good, stop: 5 }, 400, 'stop'],
    ['stop_token_ids range', { ...good, stop_token_ids: [-1] }, 400, 'stop_token_ids'],
    ['stream type', { ...good, stream: 'yes' }, 400, 'stream'],
    ['unknown tool_call_id', { ...good, messages: [{ role: 'tool', tool_call_id: 'nope', content: 'x' }] }, 400, null],
    ['reasoning_effort', { ...good, reasoning_effort: 'extreme' }, 400, null],
    ['unknown model', { ...good, model: 'no-such-model' }, 404, 'model'],
  ];
  for (const [name, body, status, param] of bad) {
    const r = await post('/v1/chat/completions', body);
    check(r.status === status, `${name}: status ${r.status}, expected ${status} (${r.text.slice(0, 200)})`);
    check(isErrorShape(r.json), `${name}: OpenAI error JSON (${r.text.slice(0, 200)})`);
    if (param) check(r.json?.error?.param === param, `${name}: param ${r.json?.error?.param}, expected ${param}`);
  }
  const cbad = [
    ['prompt missing', { model }, 400, 'prompt'],
    ['prompt id range', { model, prompt: [1, 999999999] }, 400, 'prompt'],
    ['prompt batch', { model, prompt: ['a', 'b'] }, 400, 'prompt'],
    ['echo', { model, prompt: 'a', echo: true }, 400, 'echo'],
  ];
  for (const [name, body, status, param] of cbad) {
    const r = await post('/v1/completions', body);
    check(r.status === status && isErrorShape(r.json) && r.json.error.param === param, `completions ${name}: ${r.status} ${r.text.slice(0, 200)}`);
  }
  // auth
  for (const headers of [{ 'Content-Type': 'application/json' }, { Authorization: 'Bearer wrong', 'Content-Type': 'application/json' }, { Authorization: `Bearer ${apiKey}x` }]) {
    const r = await post('/v1/chat/completions', good, headers);
    check(r.status === 401 && isErrorShape(r.json), `bad key: status ${r.status}`);
  }
  try { await new OpenAI({ baseURL: `${base}/v1`, apiKey: 'wrong', maxRetries: 0 }).models.list(); check(false, 'openai client with a wrong key must fail'); }
  catch (e) { check(e.status === 401, `openai client sees 401 (${e.status})`); }
  // paths and methods
  let r = await fetch(`${base}/v1/nothing`, { headers: auth });
  check(r.status === 404 && isErrorShape(await r.json()), 'unknown path 404');
  r = await fetch(`${base}/v1/chat/completions`, { headers: auth });
  check(r.status === 405 && (r.headers.get('allow') ?? '').includes('POST') && isErrorShape(await r.json()), 'GET on a POST route: 405 with Allow');
  r = await fetch(`${base}/health`, { method: 'POST' });
  check(r.status === 405, 'POST /health: 405');
  // 413: declared length over the limit, and a chunked body growing past it
  const big = 'x'.repeat(300 * 1024);
  let p413 = await post('/v1/chat/completions', JSON.stringify({ ...good, messages: user(big) }));
  check(p413.status === 413 && isErrorShape(p413.json), `oversized body 413 (${p413.status})`);
  const chunked = new ReadableStream({ start(c) { for (let i = 0; i < 40; i++) c.enqueue(new TextEncoder().encode(big.slice(0, 16384))); c.close(); } });
  const p413c = await fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: auth, body: chunked, duplex: 'half' });
  check(p413c.status === 413 && isErrorShape(await p413c.json()), `oversized chunked body 413 (${p413c.status})`);
  // a client that sends its body slowly while others are served
  // (GET /v1/models needs no model work, so its time says only whether the server is free.)
  let slowDone = false;
  const slow = slowClient(JSON.stringify({ model, prompt: 'slow', max_tokens: 2 }), 6, 300).then((x) => { slowDone = true; return x; });
  await sleep(200);
  const t0 = Date.now();
  const quick = await fetch(`${base}/v1/models`, { headers: auth, signal: AbortSignal.timeout(10000) });
  check(quick.status === 200 && !slowDone && Date.now() - t0 < 1000, `a slow uploader does not hold others up (${Date.now() - t0} ms)`);
  const quickGen = await post('/v1/completions', { model, prompt: 'quick', max_tokens: 2 });
  check(quickGen.status === 200, 'a completion during a slow upload succeeds');
  const slowRes = await slow;
  check(slowRes.startsWith('HTTP/1.1 200'), `slow client eventually answered 200 (${slowRes.slice(0, 60)})`);
  // the server still works after all that
  const after = await client.chat.completions.create({ model, messages: user('still there?'), max_tokens: 2 });
  check(after.choices.length === 1, 'server carries on after bad requests');
}

// Sends a request over a raw socket, its body in `parts` pieces `gapMs` apart.
function slowClient(body, parts, gapMs) {
  return new Promise((resolve) => {
    const url = new URL(base);
    const sock = net.connect(Number(url.port), url.hostname);
    let reply = '';
    const timer = setTimeout(() => { sock.destroy(); resolve('TIMEOUT'); }, 30000);
    sock.on('data', (d) => { reply += d; });
    sock.on('close', () => { clearTimeout(timer); resolve(reply); });
    sock.on('error', () => {});
    sock.on('connect', async () => {
      sock.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${apiKey}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n`);
      const step = Math.ceil(body.length / parts);
      for (let i = 0; i < body.length; i += step) { await sleep(gapMs); sock.write(body.slice(i, i + step)); }
    });
  });
}

// ---- collect: fixed greedy requests (shared and unshared prefixes), outputs to a file -----
async function collect() {
  const shared = 'You are reviewing a long design document about caching. '.repeat(6);
  const reqs = [
    user(shared + 'Question one?'), user(shared + 'Question two?'), user(shared + 'Question one?'),
    user('Unrelated short prompt.'), user('Another unrelated prompt with different words.'), user(shared + 'Question three?'),
  ];
  const out = [];
  for (const messages of reqs) {
    const r = await client.chat.completions.create({ model, messages, max_tokens: 6, temperature: 0, ignore_eos: true });
    out.push({ content: r.choices[0].message.content, reasoning: r.choices[0].message.reasoning_content, cached: r.usage.prompt_tokens_details?.cached_tokens ?? 0 });
  }
  const comp = await client.completions.create({ model, prompt: shared + 'Completion', max_tokens: 6, temperature: 0, ignore_eos: true });
  out.push({ content: comp.choices[0].text, cached: comp.usage.prompt_tokens_details?.cached_tokens ?? 0 });
  fs.writeFileSync(outFile, JSON.stringify(out));
}

// ---- load: one greedy request alone and among 30 others; 200 concurrent streams ----------
async function load() {
  const probe = { model, prompt: 'Greedy decoding should not depend on the batch', max_tokens: 8, temperature: 0, ignore_eos: true };
  const alone = (await client.completions.create(probe)).choices[0].text;
  const others = Array.from({ length: 30 }, (_, i) => client.completions.create({ model, prompt: `Other request number ${i} ${'word '.repeat(i)}`, max_tokens: 4 + (i % 5), temperature: 0.8, seed: i, ignore_eos: true }));
  await sleep(100);
  const mixed = client.completions.create(probe);
  const results = await Promise.allSettled([...others, mixed]);
  check(results.every((r) => r.status === 'fulfilled'), `31 concurrent requests all succeed (${results.filter((r) => r.status !== 'fulfilled').map((r) => r.reason?.message).slice(0, 2)})`);
  const got = results[30].status === 'fulfilled' ? results[30].value.choices[0].text : null;
  check(got === alone, `greedy output alone == among 30 others (${JSON.stringify(alone)} vs ${JSON.stringify(got)})`);

  const t0 = Date.now();
  const streams = Array.from({ length: 200 }, async (_, i) => {
    const s = await client.completions.create({ model, prompt: `stream ${i}`, max_tokens: 3, ignore_eos: true, stream: true, stream_options: { include_usage: true } });
    let usage = null, finish = null;
    for await (const ch of s) { if (ch.usage) usage = ch.usage; if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason; }
    return usage?.completion_tokens === 3 && finish === 'length';
  });
  const done = await Promise.allSettled(streams);
  const ok = done.filter((r) => r.status === 'fulfilled' && r.value).length;
  check(ok === 200, `200 concurrent streams complete with 3 tokens each (${ok} ok; ${done.find((r) => r.status === 'rejected')?.reason?.message ?? ''})`);
  console.log(`200 streams in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
}

// ---- disconnect: a client that leaves mid-stream frees its KV blocks ---------------------
async function disconnect() {
  // Completions stream a chunk per token; chat with a random model may hold text in a harmony
  // header, so its client leaves after the role chunk while tokens flow without output.
  const cases = [
    ['completions', (signal) => client.completions.create({ model, prompt: 'Write a long story', max_tokens: 400, ignore_eos: true, stream: true }, { signal }), 4],
    ['chat', (signal) => client.chat.completions.create({ model, messages: user('Write a long story'), max_tokens: 400, ignore_eos: true, stream: true }, { signal }), 1],
  ];
  for (const [name, start, leaveAfter] of cases) {
    const before = (await metrics()).get('gptoss_generation_tokens_total');
    const controller = new AbortController();
    const s = await start(controller.signal);
    let n = 0;
    try { for await (const ch of s) { if (++n >= leaveAfter) controller.abort(); } } catch { /* aborted */ }
    // Done means nothing running and nothing waiting: a request preempted for KV space sits
    // in the waiting queue with no blocks for a moment, then resumes until the server sees
    // the disconnect (a chat stream that has sent nothing yet finds out at its next write).
    let used = NaN, running = NaN, waiting = NaN, m = null;
    for (let i = 0; i < 100; i++) {
      m = await metrics();
      used = m.get('gptoss_kv_cache_blocks_used'); running = m.get('gptoss_num_requests_running');
      waiting = m.get('gptoss_num_requests_waiting');
      if (used === 0 && running === 0 && waiting === 0) break;
      await sleep(100);
    }
    check(used === 0 && running === 0 && waiting === 0, `${name}: after a mid-stream disconnect KV blocks in use return to 0 (used ${used}, running ${running}, waiting ${waiting})`);
    check(m.get('gptoss_kv_cache_usage_perc') === 0, `${name}: kv_cache_usage_perc back to 0`);
    const generated = m.get('gptoss_generation_tokens_total') - before;
    check(generated < 200, `${name}: the abandoned generation was cancelled early (${generated} tokens of 400)`);
  }
  const m = await metrics();
  check(/finished_reason="cancelled"\} [1-9]/.test(m.text), 'cancelled finishes are counted');
  for (const name of ['gptoss_num_requests_waiting', 'gptoss_prefix_cache_hit_rate', 'gptoss_prompt_tokens_total', 'gptoss_time_to_first_token_seconds_count', 'gptoss_inter_token_latency_seconds_count'])
    check(Number.isFinite(m.get(name)), `metric ${name} present`);
  check(/gptoss_time_to_first_token_seconds_bucket\{[^}]*le="\+Inf"\}/.test(m.text), 'TTFT histogram has a +Inf bucket');
}

// ---- overload: a small queue answers 429, then recovers ----------------------------------
async function overload() {
  const reqs = Array.from({ length: 12 }, (_, i) => post('/v1/completions', { model, prompt: `overload ${i}`, max_tokens: 6, ignore_eos: true }));
  const res = await Promise.all(reqs);
  const n429 = res.filter((r) => r.status === 429).length, n200 = res.filter((r) => r.status === 200).length;
  check(n429 > 0 && n200 > 0 && n429 + n200 === 12, `overload: ${n200} x 200 and ${n429} x 429`);
  check(res.filter((r) => r.status === 429).every((r) => isErrorShape(r.json) && r.json.error.type === 'rate_limit_error'), '429 bodies are OpenAI errors');
  const again = await post('/v1/completions', { model, prompt: 'after the storm', max_tokens: 2 });
  check(again.status === 200, `recovers after overload (${again.status})`);
}

const modes = { api, collect, load, disconnect, overload };
try {
  await modes[mode]();
} catch (e) {
  failures.push(`${mode}: ${e.stack ?? e}`);
  console.log(`FAIL: ${mode} threw ${e.stack ?? e}`);
}
if (failures.length) { console.log(`${failures.length} failure(s) in ${mode}`); process.exit(1); }
console.log(`${mode}: ok`);
