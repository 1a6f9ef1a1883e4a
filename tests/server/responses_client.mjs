// responses_client.mjs - end-to-end checks of /v1/responses through the official `openai` npm
// client (5.23.2: its typed stream helper accumulates every event and throws on a sequence it
// cannot follow) and the Agents SDK (@openai/agents), driven by test_serve_responses.sh.
//
// Token counts are checked against an independent path: the same conversation sent to
// /v1/chat/completions in its own shape must give the same prompt_tokens.
//   node responses_client.mjs BASE_URL API_KEY MODEL
import OpenAI from 'openai';
import { z } from 'zod';
import {
  Agent, run, tool, setTracingDisabled, OpenAIResponsesModel, OpenAIChatCompletionsModel,
  MaxTurnsExceededError, ModelBehaviorError,
} from '@openai/agents';

const [base, apiKey, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey, maxRetries: 0, timeout: 120000 });
const failures = [];
const check = (cond, what) => { if (!cond) { failures.push(what); console.log(`FAIL: ${what}`); } };
const auth = { Authorization: `Bearer ${apiKey}`, 'Content-Type': 'application/json' };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function post(path, body, method = 'POST') {
  const r = await fetch(`${base}${path}`, {
    method, headers: auth, body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(60000),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* checked by callers */ }
  return { status: r.status, json, text };
}

const isErrorShape = (j) => j && j.error && typeof j.error.message === 'string' &&
  j.error.message.length > 0 && typeof j.error.type === 'string' && 'param' in j.error && 'code' in j.error;

// The prompt tokens /v1/chat/completions counts for the same conversation (1 token generated).
async function chatPromptTokens(messages, extra = {}) {
  const c = await client.chat.completions.create({ model, messages, max_tokens: 1, temperature: 0, ...extra });
  return c.usage.prompt_tokens;
}

const outputText = (r) => r.output.filter((i) => i.type === 'message')
  .map((i) => i.content.map((c) => c.text).join('')).join('');

function checkResponseShape(r, what) {
  check(r.object === 'response' && /^resp_[0-9a-f]+$/.test(r.id), `${what}: object response, id resp_<hex> (${r.id})`);
  check(typeof r.created_at === 'number' && r.model === model, `${what}: created_at, model`);
  check(Array.isArray(r.output) && r.output.length >= 1, `${what}: output items`);
  for (const item of r.output) {
    if (item.type === 'message') {
      check(item.role === 'assistant' && item.id && Array.isArray(item.content) &&
        item.content.every((c) => c.type === 'output_text' && typeof c.text === 'string' && Array.isArray(c.annotations)),
      `${what}: message item shape`);
    } else if (item.type === 'reasoning') {
      check(Array.isArray(item.summary) && item.content.every((c) => c.type === 'reasoning_text'), `${what}: reasoning item shape`);
    } else if (item.type === 'function_call') {
      check(typeof item.call_id === 'string' && typeof item.name === 'string' && typeof item.arguments === 'string',
        `${what}: function_call item shape`);
    } else {
      check(false, `${what}: unexpected output item type ${item.type}`);
    }
  }
  const u = r.usage;
  check(u && u.total_tokens === u.input_tokens + u.output_tokens && u.input_tokens > 0 &&
    typeof u.input_tokens_details.cached_tokens === 'number' &&
    typeof u.output_tokens_details.reasoning_tokens === 'number', `${what}: usage shape ${JSON.stringify(u)}`);
}

// ---- create, retrieve, delete, max_output_tokens, echo fields --------------------------------
async function basics() {
  const r = await client.responses.create({
    model, input: 'Say hi', instructions: 'Be brief.', max_output_tokens: 5, temperature: 0,
    top_p: 0.7, metadata: { run: 'ci' },
  });
  checkResponseShape(r, 'create');
  check(r.status === 'incomplete' && r.incomplete_details?.reason === 'max_output_tokens' && r.usage.output_tokens === 5,
    `max_output_tokens 5: status ${r.status}, ${JSON.stringify(r.incomplete_details)}, ${r.usage.output_tokens} tokens`);
  check(r.instructions === 'Be brief.' && r.metadata.run === 'ci' && r.temperature === 0 && r.top_p === 0.7 && r.max_output_tokens === 5 &&
    r.store === true && r.background === false && r.previous_response_id === null && r.tool_choice === 'auto' &&
    Array.isArray(r.tools) && r.text?.format?.type === 'text' && r.parallel_tool_calls === true, 'create: echo fields');
  // the instructions are the developer message; the chat endpoint renders the same prompt
  const expected = await chatPromptTokens([{ role: 'developer', content: 'Be brief.' }, { role: 'user', content: 'Say hi' }]);
  check(r.usage.input_tokens === expected, `create: input_tokens ${r.usage.input_tokens}, chat counts ${expected}`);

  const got = await client.responses.retrieve(r.id);
  check(JSON.stringify(got) === JSON.stringify(r), 'retrieve gives the created response');
  await client.responses.delete(r.id);
  let status = 0;
  try { await client.responses.retrieve(r.id); } catch (e) { status = e.status; }
  check(status === 404, `retrieve after delete: ${status}, expected 404`);
  const again = await post(`/v1/responses/${r.id}`, undefined, 'DELETE');
  check(again.status === 404 && isErrorShape(again.json), `delete twice: ${again.status}`);

  // store: false is not kept, and cannot be continued
  const unstored = await client.responses.create({ model, input: 'x', max_output_tokens: 2, store: false });
  check(unstored.store === false, 'store false echoed');
  const g = await post(`/v1/responses/${unstored.id}`, undefined, 'GET');
  check(g.status === 404 && isErrorShape(g.json), `GET of a store:false response: ${g.status}`);
  const c = await post('/v1/responses', { model, input: 'y', previous_response_id: unstored.id });
  check(c.status === 404 && c.json?.error?.param === 'previous_response_id' &&
    c.json?.error?.code === 'previous_response_not_found', `previous_response_id of store:false: ${c.status} ${c.text}`);
}

// ---- streaming: the typed helper, the raw iterator, the event order ------------------------
function checkEventOrder(events, what) {
  const seq = events.map((e) => e.sequence_number);
  check(seq.every((s, i) => s === i), `${what}: sequence_numbers 0,1,2,... (${seq.slice(0, 12).join(',')})`);
  const types = events.map((e) => e.type);
  check(types[0] === 'response.created' && types[1] === 'response.in_progress', `${what}: starts created, in_progress`);
  check(['response.completed', 'response.incomplete'].includes(types.at(-1)), `${what}: ends ${types.at(-1)}`);
  // every item: added, (part added, deltas, done, part done | argument deltas, done), item done
  const open = new Map();
  for (const e of events.slice(2, -1)) {
    if (e.type === 'response.output_item.added') {
      check(!open.has(e.output_index), `${what}: item ${e.output_index} added twice`);
      open.set(e.output_index, { item: e.item, text: '', partOpen: false, textDone: false });
      continue;
    }
    const s = open.get(e.output_index);
    if (!s) { check(false, `${what}: ${e.type} for item ${e.output_index} never added`); continue; }
    switch (e.type) {
      case 'response.content_part.added': s.partOpen = true; break;
      case 'response.output_text.delta': case 'response.reasoning_text.delta':
        check(s.partOpen && !s.textDone, `${what}: delta outside a part`); s.text += e.delta; break;
      case 'response.output_text.done': case 'response.reasoning_text.done':
        check(e.text === s.text, `${what}: ${e.type} text is the deltas joined`); s.textDone = true; break;
      case 'response.content_part.done':
        check(s.textDone && e.part.text === s.text, `${what}: content_part.done after the text`); s.partOpen = false; break;
      case 'response.function_call_arguments.delta': s.text += e.delta; break;
      case 'response.function_call_arguments.done': check(e.arguments === s.text, `${what}: arguments joined`); s.textDone = true; break;
      case 'response.output_item.done':
        check(!s.partOpen && (s.item.type === 'function_call' || s.textDone), `${what}: item done before its text finished`);
        s.done = true; break;
      default: check(false, `${what}: unexpected event ${e.type}`);
    }
  }
  check([...open.values()].every((s) => s.done), `${what}: every added item is done`);
  return types;
}

async function streaming() {
  const stream = client.responses.stream({ model, input: 'Count to three', max_output_tokens: 12, temperature: 0 });
  const events = [];
  let deltas = '';
  stream.on('response.output_text.delta', (e) => { deltas += e.delta; });
  for await (const e of stream) events.push(e);
  const final = await stream.finalResponse();
  checkEventOrder(events, 'stream helper');
  // the helper keeps the last event's response only for response.completed: take it here
  const last = events.at(-1).response;
  checkResponseShape(last, 'stream last event');
  check(last.status === 'incomplete' && last.usage.output_tokens === 12, `stream: incomplete after 12 tokens (${last.status}, ${last.usage.output_tokens})`);
  check(final.id === last.id && deltas === outputText(final) && outputText(last) === deltas,
    'stream: text deltas = final output text');
  const stored = await client.responses.retrieve(final.id);
  check(JSON.stringify(stored.output) === JSON.stringify(events.at(-1).response.output), 'stream: stored response = the last event');
  // the same request without streaming gives the same output (temperature 0)
  const plain = await client.responses.create({ model, input: 'Count to three', max_output_tokens: 12, temperature: 0 });
  check(outputText(plain) === deltas, 'stream and non-stream give the same text at temperature 0');

  const raw = await client.responses.create({ model, input: 'hi', max_output_tokens: 3, stream: true });
  const rawEvents = [];
  for await (const e of raw) rawEvents.push(e);
  checkEventOrder(rawEvents, 'raw stream');
}

// ---- conversations: previous_response_id, function calls, reasoning handed back ------------
async function conversations() {
  const first = await client.responses.create({ model, input: 'Tell me about the sea in a few words', max_output_tokens: 6, temperature: 0 });
  const second = await client.responses.create({ model, input: 'And the sky?', previous_response_id: first.id, max_output_tokens: 6, temperature: 0 });
  check(second.previous_response_id === first.id, 'previous_response_id echoed');
  check(second.usage.input_tokens_details.cached_tokens > 0, `second turn hits the prefix cache: cached_tokens ${second.usage.input_tokens_details.cached_tokens}`);
  const expected = await chatPromptTokens([
    { role: 'user', content: 'Tell me about the sea in a few words' },
    { role: 'assistant', content: outputText(first) },
    { role: 'user', content: 'And the sky?' }]);
  check(second.usage.input_tokens === expected, `chained prompt: ${second.usage.input_tokens} tokens, chat counts ${expected}`);
  // input_items: the conversation the second turn answered, the first turn's output included,
  // paged one item at a time in both orders
  const asc = [];
  for await (const item of client.responses.inputItems.list(second.id, { order: 'asc', limit: 1 })) asc.push(item);
  const want = [['message', 'user', 'Tell me about the sea in a few words'],
    ...first.output.map((o) => [o.type, o.role, o.type === 'message' ? outputText({ output: [o] }) : undefined]),
    ['message', 'user', 'And the sky?']];
  const got = asc.map((i) => [i.type, i.role, i.type === 'message' ? i.content.map((c) => c.text).join('') : undefined]);
  check(JSON.stringify(got) === JSON.stringify(want), `input_items asc: ${JSON.stringify(got)}`);
  check(new Set(asc.map((i) => i.id)).size === asc.length && asc.every((i) => typeof i.id === 'string'), 'input_items: distinct ids');
  const page = await client.responses.inputItems.list(second.id);
  check(JSON.stringify(page.data.map((i) => i.id)) === JSON.stringify(asc.map((i) => i.id).reverse()) && page.has_more === false,
    'input_items: desc by default, one page');
  const third = await client.responses.create({ model, input: 'And the land?', previous_response_id: second.id, max_output_tokens: 2 });
  check(third.usage.input_tokens > second.usage.input_tokens, 'a third turn grows the prompt');

  // a function call and its output handed back, with the reasoning that led to it
  const tools = [{ type: 'function', name: 'get_weather', description: 'Weather of a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] }, strict: false }];
  const chatTools = [{ type: 'function', function: { name: 'get_weather', description: 'Weather of a city', parameters: tools[0].parameters } }];
  const call = { type: 'function_call', call_id: 'call_w1', name: 'get_weather', arguments: '{"city":"Paris"}' };
  const out = { type: 'function_call_output', call_id: 'call_w1', output: '{"temp_c":21}' };
  const thought = { type: 'reasoning', id: 'rs_1', summary: [], content: [{ type: 'reasoning_text', text: 'The user wants the weather; call get_weather for Paris.' }] };
  const user = { role: 'user', content: [{ type: 'input_text', text: 'Weather in Paris?' }] };
  const withTool = await client.responses.create({ model, tools, input: [user, call, out], max_output_tokens: 2 });
  const withThought = await client.responses.create({ model, tools, input: [user, thought, call, out], max_output_tokens: 2 });
  check(withTool.tools.length === 1 && withTool.tools[0].name === 'get_weather', 'tools echoed flat');
  const chatTool = await chatPromptTokens([{ role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', tool_calls: [{ id: 'call_w1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_w1', content: '{"temp_c":21}' }], { tools: chatTools });
  const chatThought = await chatPromptTokens([{ role: 'user', content: 'Weather in Paris?' },
    { role: 'assistant', reasoning_content: thought.content[0].text, tool_calls: [{ id: 'call_w1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_w1', content: '{"temp_c":21}' }], { tools: chatTools });
  check(withTool.usage.input_tokens === chatTool, `function_call_output continuation: ${withTool.usage.input_tokens} tokens, chat counts ${chatTool}`);
  check(withThought.usage.input_tokens === chatThought && chatThought > chatTool + 5,
    `reasoning before a tool call is kept: ${withThought.usage.input_tokens} tokens, chat ${chatThought}, without ${chatTool}`);
  // once the turn ended in a final answer, the reasoning is dropped (harmony)
  const answered = [user, thought, { role: 'assistant', content: [{ type: 'output_text', text: 'Sunny.' }] }, { role: 'user', content: 'Thanks' }];
  const noThought = [user, { role: 'assistant', content: 'Sunny.' }, { role: 'user', content: 'Thanks' }];
  const a = await client.responses.create({ model, input: answered, max_output_tokens: 1 });
  const b = await client.responses.create({ model, input: noThought, max_output_tokens: 1 });
  check(a.usage.input_tokens === b.usage.input_tokens, `reasoning before a final answer is dropped: ${a.usage.input_tokens} vs ${b.usage.input_tokens}`);

  // a call id issued in an earlier response of the chain answers a later output
  const issued = await client.responses.create({ model, tools, input: [user, call], max_output_tokens: 2 });
  const answer = await client.responses.create({ model, tools, previous_response_id: issued.id, input: [out], max_output_tokens: 2 });
  check(answer.status !== 'failed' && answer.usage.input_tokens > issued.usage.input_tokens, 'function_call_output for a call of the previous response');
}

// ---- background: poll, cancel ---------------------------------------------------------------
async function background() {
  const short = await client.responses.create({ model, input: 'hi', background: true, max_output_tokens: 4 });
  check(short.background === true && ['queued', 'in_progress'].includes(short.status), `background create: ${short.status}`);
  let polled = short;
  const deadline = Date.now() + 120000; // a sanitizer build on a busy machine is slow
  while (Date.now() < deadline && ['queued', 'in_progress'].includes(polled.status)) {
    await sleep(50);
    polled = await client.responses.retrieve(short.id);
  }
  check(polled.status === 'incomplete' && polled.usage.output_tokens === 4 && polled.output.length >= 1,
    `background poll ends incomplete with 4 tokens: ${polled.status}`);

  const long = await client.responses.create({ model, input: 'Write a long story', background: true, max_output_tokens: 4000 });
  const cancelled = await client.responses.cancel(long.id);
  check(cancelled.status === 'cancelled', `cancel: status ${cancelled.status}`);
  const after = await client.responses.retrieve(long.id);
  check(after.status === 'cancelled' && after.usage.output_tokens < 4000, `retrieve after cancel: ${after.status}`);
  const fg = await client.responses.create({ model, input: 'hi', max_output_tokens: 1 });
  const r = await post(`/v1/responses/${fg.id}/cancel`, {});
  check(r.status === 400 && isErrorShape(r.json), `cancel of a foreground response: ${r.status}`);
  const s = await post(`/v1/responses/${fg.id}?stream=true`, undefined, 'GET');
  check(s.status === 400 && s.json?.error?.param === 'stream', `stream again a foreground response: ${s.status}`);
}

// ---- background + stream: the client leaves after the first event, the response goes on; a
// reconnect replays from a sequence number (raw iterator) or from the start (typed helper) ---
async function backgroundStream() {
  const n = 24;
  const first = client.responses.stream({ model, input: 'Write a poem', background: true, max_output_tokens: n, temperature: 0 });
  let id = null;
  const head = [];
  for await (const e of first) { head.push(e); id = e.response?.id; break; } // aborts the connection
  check(head[0]?.type === 'response.created' && head[0].response.background === true && id, `background stream starts created: ${head[0]?.type}`);
  // the disconnect did not cancel it: the raw iterator resumes after event 0 and follows it to the end
  const rest = [];
  const resumed = await client.responses.retrieve(id, { stream: true, starting_after: 0 });
  for await (const e of resumed) rest.push(e);
  const all = [head[0], ...rest];
  checkEventOrder(all, 'resumed background stream');
  const last = all.at(-1).response;
  check(last?.status === 'incomplete' && last.usage.output_tokens === n, `resumed stream ends incomplete after ${n} tokens: ${last?.status} ${last?.usage?.output_tokens}`);
  const stored = await client.responses.retrieve(id);
  check(JSON.stringify(stored.output) === JSON.stringify(last.output) && stored.status === last.status, 'background stream: stored = the last event');
  // the typed helper replays from the start and hands on only the events after starting_after
  const replay = client.responses.stream({ response_id: id, starting_after: 2 });
  const seen = [];
  replay.on('event', (e) => seen.push(e.sequence_number));
  for await (const e of replay) { /* accumulated by the helper */ void e; }
  check(seen.length === all.length - 3 && seen[0] === 3 && seen.at(-1) === all.length - 1, `helper replay after 2: ${seen.slice(0, 3)}..${seen.at(-1)}`);
  // same stream again, same bytes (temperature 0 and a replay, not a new generation)
  const again = [];
  for await (const e of await client.responses.retrieve(id, { stream: true })) again.push(e);
  check(JSON.stringify(again) === JSON.stringify(all), 'a second replay gives the same events');
  const past = await post(`/v1/responses/${id}?stream=true&starting_after=${all.length - 1 + 5}`, undefined, 'GET');
  check(past.status === 400 && past.json?.error?.param === 'starting_after', `starting_after past the end: ${past.status}`);
  const bad = await post(`/v1/responses/${id}?stream=true&starting_after=x`, undefined, 'GET');
  check(bad.status === 400 && bad.json?.error?.param === 'starting_after', `starting_after not a number: ${bad.status}`);
}

// ---- include: logprobs of the answer's tokens, reasoning handed out and back ---------------
async function include() {
  const body = { model, input: 'Name a color', max_output_tokens: 6, temperature: 0,
    include: ['message.output_text.logprobs', 'reasoning.encrypted_content'], top_logprobs: 2 };
  const r = await client.responses.create(body);
  checkResponseShape(r, 'include logprobs');
  check(r.usage.output_tokens === 6 && r.top_logprobs === 2, `include logprobs: ${r.usage.output_tokens} tokens, top_logprobs ${r.top_logprobs}`);
  const parts = r.output.filter((i) => i.type === 'message').flatMap((i) => i.content);
  const lps = parts.flatMap((p) => p.logprobs);
  check(lps.length > 0 && lps.length <= 6, `include logprobs: ${lps.length} entries for 6 tokens`);
  // the tokens' bytes are the text's; at temperature 0 each drawn token is its own best alternative
  // (the harmony parser drops the whitespace a message starts with)
  const spelled = Buffer.from(lps.flatMap((l) => l.bytes)).toString('utf8');
  check(spelled.trimStart() === parts.map((p) => p.text).join('').trimStart(), `logprob tokens spell the output text: ${JSON.stringify(spelled)}`);
  check(lps.every((l) => l.top_logprobs.length === 2 && l.top_logprobs[0].token === l.token &&
    l.top_logprobs[0].logprob === l.logprob && l.top_logprobs[1].logprob <= l.logprob && l.logprob <= 0),
  `top_logprobs: 2 each, the greedy token first (${JSON.stringify(lps[0]).slice(0, 160)})`);
  // the same prompt through Chat Completions, whose logprobs path this reuses, draws the same tokens
  const chat = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Name a color' }],
    max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 2 });
  const chatLps = chat.choices[0].logprobs.content;
  if (chat.choices[0].message.content === outputText(r)) {
    check(JSON.stringify(chatLps) === JSON.stringify(lps), 'responses logprobs = chat completions logprobs');
  }
  // streamed: the deltas carry the same entries as the final part
  const stream = client.responses.stream(body);
  const deltaLps = [];
  let doneLps = null;
  for await (const e of stream) {
    if (e.type === 'response.output_text.delta') deltaLps.push(...e.logprobs);
    if (e.type === 'response.output_text.done') doneLps = e.logprobs;
  }
  check(JSON.stringify(deltaLps) === JSON.stringify(lps) && JSON.stringify(doneLps) === JSON.stringify(lps),
    `streamed logprobs: ${deltaLps.length} in deltas, ${doneLps?.length} at done, ${lps.length} expected`);
  // reasoning handed back as encrypted_content (this server's mark) is the same prompt as its text
  const user = { role: 'user', content: 'Weather in Paris?' };
  const text = 'The user wants the weather; call get_weather for Paris.';
  const call = { type: 'function_call', call_id: 'call_e1', name: 'get_weather', arguments: '{"city":"Paris"}' };
  const tools = [{ type: 'function', name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } }, strict: false }];
  const plain = await client.responses.create({ model, tools, max_output_tokens: 1,
    input: [user, { type: 'reasoning', summary: [], content: [{ type: 'reasoning_text', text }] }, call] });
  const sealed = await client.responses.create({ model, tools, max_output_tokens: 1, store: false,
    include: ['reasoning.encrypted_content'],
    input: [user, { type: 'reasoning', id: 'rs_e1', summary: [], encrypted_content: `gptoss-reasoning-v1:${text}` }, call] });
  check(sealed.usage.input_tokens === plain.usage.input_tokens, `encrypted_content read back: ${sealed.usage.input_tokens} vs ${plain.usage.input_tokens} tokens`);
}

// ---- bad requests: OpenAI's error shape naming the field; the server stays up ---------------
async function badRequests() {
  const cases = [
    [{ input: [{ role: 'user', content: 'a' }, { type: 'image_generation_call', id: 'x' }] }, 400, 'input[1].type'],
    [{ input: [{ type: 'function_call_output', call_id: 'nope', output: 'x' }] }, 400, 'input[0].call_id'],
    [{ input: 5 }, 400, 'input'],
    [{}, 400, 'input'],
    [{ input: [{ role: 'robot', content: 'a' }] }, 400, 'input[0].role'],
    [{ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'x' }] }] }, 400, 'input[0].content[0].type'],
    [{ input: [{ type: 'function_call', call_id: 'c', name: 'bad name', arguments: '{}' }] }, 400, 'input[0].name'],
    [{ input: 'x', temperature: 'hot' }, 400, 'temperature'],
    [{ input: 'x', max_output_tokens: 0 }, 400, 'max_output_tokens'],
    [{ input: 'x', max_output_tokens: 1000000 }, 400, 'max_output_tokens'],
    [{ input: 'x', tools: [{ type: 'web_search' }] }, 400, 'tools[0].type'],
    [{ input: 'x', tools: [{ type: 'function', name: 'f' }], tool_choice: { type: 'function', name: 'g' } }, 400, 'tool_choice.name'],
    [{ input: 'x', text: { format: { type: 'xml' } } }, 400, 'text.format.type'],
    [{ input: 'x', reasoning: { effort: 'max' } }, 400, 'reasoning.effort'],
    [{ input: 'x', metadata: { k: 5 } }, 400, 'metadata'],
    [{ input: 'x', top_k: 'many' }, 400, 'top_k'],
    [{ input: 'x', logit_bias: { 99999999: 1 } }, 400, 'logit_bias'],
    [{ input: 'x', previous_response_id: 'resp_doesnotexist' }, 404, 'previous_response_id'],
    [{ input: 'x', include: ['message.output_text.logprobs'], top_logprobs: 21 }, 400, 'top_logprobs'],
    [{ input: 'x', include: ['nope.nothing'] }, 400, 'include'],
    [{ input: 'x', include: ['file_search_call.results'] }, 400, 'include'],
    [{ input: 'x', include: 'reasoning.encrypted_content' }, 400, 'include'],
    [{ input: 'x', stop: ['}'], text: { format: { type: 'json_schema', name: 'o', schema: { type: 'object' } } } }, 400, 'stop'],
  ];
  for (const [body, status, param] of cases) {
    const r = await post('/v1/responses', { model, ...body });
    check(r.status === status && isErrorShape(r.json) && r.json.error.param === param,
      `${JSON.stringify(body).slice(0, 90)}: ${r.status} param ${r.json?.error?.param}, expected ${status} ${param}`);
  }
  // the same refusal on Chat Completions (the shared request fields), for both JSON formats
  for (const format of [{ type: 'json_object' }, { type: 'json_schema', json_schema: { name: 'o', schema: { type: 'object' } } }]) {
    const r = await post('/v1/chat/completions', { model, messages: [{ role: 'user', content: 'x' }], stop: '"', response_format: format });
    check(r.status === 400 && isErrorShape(r.json) && r.json.error.param === 'stop' && r.json.error.message.includes(format.type),
      `chat: stop + ${format.type}: ${r.status} ${r.json?.error?.param}`);
  }
  const raw = await fetch(`${base}/v1/responses`, { method: 'POST', headers: auth, body: '{"model":', signal: AbortSignal.timeout(10000) });
  check(raw.status === 400 && isErrorShape(await raw.json()), 'bad JSON: 400');
  const unknown = await post('/v1/responses/resp_nothing', undefined, 'GET');
  check(unknown.status === 404 && isErrorShape(unknown.json) && /evicted/.test(unknown.json.error.message), `GET unknown id: ${unknown.status}`);
  const stored = await client.responses.create({ model, input: 'x', max_output_tokens: 1 });
  for (const [query, param] of [['limit=0', 'limit'], ['order=up', 'order'], ['after=nope', 'after']]) {
    const r = await post(`/v1/responses/${stored.id}/input_items?${query}`, undefined, 'GET');
    check(r.status === 400 && r.json?.error?.param === param, `input_items?${query}: ${r.status} ${r.json?.error?.param}`);
  }
  const put = await post('/v1/responses/resp_nothing', {}, 'PUT');
  check(put.status === 405 && isErrorShape(put.json), `PUT: ${put.status}`);
  const h = await fetch(`${base}/health`, { signal: AbortSignal.timeout(10000) });
  check(h.status === 200, 'the server is up after the bad requests');
}

// ---- the Agents SDK: one function tool, both model classes, a clean end --------------------
// Random weights rarely end a turn within a few tokens. Cut at maxTokens, the Chat Completions
// model gives the truncated text as the final output; the Responses model refuses a
// response.incomplete with a ModelBehaviorError naming that status (the SDK judging a
// well-formed response, not failing to read it). So that both runs also reach a final output,
// a second pass biases the turn to end (<|return|> after 3 tokens) through the sampling
// extensions the server takes on both endpoints. A parse or protocol error always fails.
async function agents() {
  setTracingDisabled(true);
  const weather = tool({
    name: 'get_weather', description: 'Weather of a city',
    parameters: z.object({ city: z.string() }),
    execute: async ({ city }) => `Sunny in ${city}`,
  });
  // The ending pass biases the turn to end with min_tokens, which the server refuses beside a
  // constrained output: a strict tool (the SDK's default) constrains its arguments, so that
  // pass declares the same tool non-strict (a plain JSON Schema).
  const weatherLoose = tool({
    name: 'get_weather', description: 'Weather of a city', strict: false,
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'],
      additionalProperties: true },
    execute: async (args) => `Sunny in ${typeof args === 'string' ? args : args?.city}`,
  });
  // a history with a finished tool call: the SDK sends it back as function_call and
  // function_call_output items (Responses) or tool_calls and a tool message (chat)
  const history = [
    { type: 'message', role: 'user', content: 'Weather in Paris?' },
    { type: 'function_call', callId: 'call_a1', name: 'get_weather', arguments: '{"city":"Paris"}', status: 'completed' },
    { type: 'function_call_result', callId: 'call_a1', name: 'get_weather', status: 'completed', output: 'Sunny in Paris' },
    { type: 'message', role: 'user', content: 'And in Rome?' },
  ];
  const ending = { providerData: { logit_bias: { 200002: 100 }, min_tokens: 3 } };
  for (const [name, m] of [['responses', new OpenAIResponsesModel(client, model)],
    ['chat completions', new OpenAIChatCompletionsModel(client, model)]]) {
    for (const [how, settings] of [['cut', {}], ['ended', ending]]) {
      const agent = new Agent({ name: 'weather', instructions: 'Answer with the tool.',
        tools: [how === 'ended' ? weatherLoose : weather], model: m,
        modelSettings: { maxTokens: 16, temperature: 0, ...settings } });
      for (const input of ['Weather in Paris?', history]) {
        const what = `agents (${name}, ${how}, ${typeof input === 'string' ? 'one message' : 'tool history'})`;
        try {
          const result = await run(agent, input, { maxTurns: 3 });
          check(typeof result.finalOutput === 'string' && result.finalOutput.length > 0, `${what}: a final output`);
        } catch (e) {
          const clean = how === 'cut' && (e instanceof MaxTurnsExceededError || (name === 'responses' &&
            e instanceof ModelBehaviorError && /"response\.incomplete"/.test(e.message)));
          check(clean, `${what}: ended with ${e?.constructor?.name}: ${e?.message}`);
        }
      }
    }
  }
}

for (const [name, fn] of [['basics', basics], ['streaming', streaming], ['conversations', conversations],
  ['background', background], ['background stream', backgroundStream], ['include', include], ['bad requests', badRequests], ['agents', agents]]) {
  try { await fn(); } catch (e) { check(false, `${name}: threw ${e?.stack || e}`); }
}
if (failures.length) { console.log(`${failures.length} failure(s)`); process.exit(1); }
console.log('responses client: all checks passed');
