// test_serve_structured.mjs - structured output through `gptoss serve` with the random tiny
// model at temperature 1, judged by independent validators (ajv for JSON Schema, zod through
// the official clients). Driven by test_serve_structured.sh. Usage:
//   node test_serve_structured.mjs BASE_URL MODEL N_SCHEMAS [WALK_SCHEMAS_JSON]
// WALK_SCHEMAS_JSON: schemas written by tests/structured/json_schema_walks.mjs (every keyword
// the matcher supports), sent too and validated with ajv's draft 2020-12.
// Exits 1 (printing each failure) when a check fails.
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';
import fs from 'node:fs';
import Ajv from 'ajv';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { generateObject } from 'ai';
import { createOpenAI } from '@ai-sdk/openai';

const [base, model, nSchemasArg, walkSchemasFile] = process.argv.slice(2);
const nSchemas = Number(nSchemasArg || 54);
const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 300000 });
const failures = [];
const check = (cond, what) => { if (!cond) { failures.push(what); console.log(`FAIL: ${what}`); } };
const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);
const ajv2020 = new Ajv2020({ strict: false });
addFormats(ajv2020);
const user = (content) => [{ role: 'user', content }];
const efforts = ['low', 'medium', 'high'];
// Requests per kind: a sanitizer build runs the CPU backend several times slower, so it sends
// 2 of each (the kinds start at different efforts, so every effort is still covered), the
// release run 6.
const reps = process.env.GPTOSS_SANITIZE === '1' ? 2 : 6;
// The random model almost always picks "final" over "analysis" after <|channel|>; a bias
// against the token "final" (id 17196 in o200k_harmony) makes it reason first, so that the
// budget has to cut the reasoning short. The header is forced, so "final" still comes when due.
const reasonFirst = { 17196: -100 };

async function post(path, body) {
  const r = await fetch(`${base}${path}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' },
    body: typeof body === 'string' ? body : JSON.stringify(body), signal: AbortSignal.timeout(300000),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* checked by callers */ }
  return { status: r.status, json, text };
}

// Runs the thunks with at most `width` in flight.
async function pool(thunks, width) {
  const results = new Array(thunks.length);
  let next = 0;
  async function worker() {
    while (next < thunks.length) {
      const i = next++;
      try { results[i] = await thunks[i](); } catch (e) { results[i] = { error: e }; }
    }
  }
  await Promise.all(Array.from({ length: width }, worker));
  return results;
}

// ---- random schemas (seeded): the keywords strict clients send ----------------------------
let seed = 0x1234567;
const rand = (n) => { seed = (seed * 1103515245 + 12345) & 0x7fffffff; return seed % n; };
const pick = (a) => a[rand(a.length)];
const names = ['id', 'name', 'ok', 'kind', 'n', 'tags', 'x', 'y', 'note', 'level'];

function genLeaf() {
  switch (rand(9)) {
    case 0: return { type: 'string', maxLength: 1 + rand(8) };
    case 1: return { type: 'integer', minimum: -rand(50), maximum: rand(1000) };
    case 2: return { type: 'number' };
    case 3: return { type: 'boolean' };
    case 4: return { enum: pick([['red', 'green', 'blue'], ['a', 1, null], [true, 'no']]) };
    case 5: return { const: pick(['v1', 42, false]) };
    case 6: return { type: ['string', 'null'], maxLength: 4 };
    case 7: return { type: 'string', pattern: '^[a-z]{1,5}$' };
    default: return { type: 'string', format: pick(['date', 'email', 'uuid']) };
  }
}

function genNode(depth) {
  const r = rand(depth > 1 ? 1 : 6);
  if (r === 0 || depth > 1) return genLeaf();
  if (r === 1) return { type: 'array', items: genNode(depth + 1), minItems: rand(2), maxItems: 1 + rand(2) };
  if (r === 2) return { anyOf: [genLeaf(), genLeaf()] };
  if (r === 3) return genObject(depth + 1);
  return genLeaf();
}

function genObject(depth) {
  const n = 1 + rand(3);
  const properties = {};
  const used = new Set();
  for (let i = 0; i < n; i++) {
    let k = pick(names);
    while (used.has(k)) k = pick(names);
    used.add(k);
    properties[k] = genNode(depth);
  }
  const keys = Object.keys(properties);
  const strict = rand(3) !== 0;
  return {
    type: 'object', properties,
    required: strict ? keys : keys.filter(() => rand(2) === 0),
    additionalProperties: false,
  };
}

function genSchema(i) {
  const s = genObject(0);
  if (i % 7 === 3) { // a $ref into $defs, as clients that extract shared types send
    s.$defs = { item: genObject(1) };
    s.properties.ref = { $ref: '#/$defs/item' };
    s.required.push('ref');
  }
  return s;
}

// ---- response_format json_schema ----------------------------------------------------------
async function schemas() {
  const jobs = [];
  for (let i = 0; i < nSchemas; i++) {
    const schema = genSchema(i);
    const effort = efforts[i % 3];
    const body = {
      model, messages: user(`Fill in the form ${i}.`), temperature: 1, max_tokens: 100, seed: i,
      reasoning_effort: effort,
      response_format: { type: 'json_schema', json_schema: { name: `form_${i}`, strict: true, schema } },
    };
    if (i % 2 === 0) body.logit_bias = reasonFirst;
    jobs.push(async () => ({ i, schema, effort, r: await post('/v1/chat/completions', body) }));
  }
  // json_object: any object
  for (let i = 0; i < reps; i++) {
    jobs.push(async () => ({
      i: `json_object ${i}`, schema: { type: 'object' }, effort: efforts[i % 3],
      r: await post('/v1/chat/completions', {
        model, messages: user('JSON please'), temperature: 1, max_tokens: 64, seed: 100 + i,
        reasoning_effort: efforts[i % 3], logit_bias: i % 2 ? reasonFirst : undefined,
        response_format: { type: 'json_object' },
      }),
    }));
  }
  // the matcher's own test schemas: every supported keyword, nested
  const walkSchemas = walkSchemasFile ? JSON.parse(fs.readFileSync(walkSchemasFile, 'utf8')) : [];
  walkSchemas.forEach((entry, k) => {
    const schema = entry.json_object ? { type: 'object' } : entry.schema;
    const body = {
      model, messages: user(`Walk ${k}.`), temperature: 1, max_tokens: 160, seed: 300 + k,
      reasoning_effort: efforts[k % 3], logit_bias: k % 2 ? reasonFirst : undefined,
      response_format: entry.json_object ? { type: 'json_object' }
        : { type: 'json_schema', json_schema: { name: `walk_${k}`, strict: true, schema } },
    };
    jobs.push(async () => ({ i: `walk ${k}`, schema, walk: true, effort: efforts[k % 3], r: await post('/v1/chat/completions', body) }));
  });
  const results = await pool(jobs, 32);
  let reasoned = 0;
  for (const res of results) {
    if (res.error) { check(false, `schema request failed: ${res.error}`); continue; }
    const { i, schema, effort, r, walk } = res;
    if (walk && r.status === 400 && r.json?.error?.param === 'max_tokens') continue; /* a longer shortest value */
    if (r.status !== 200) { check(false, `schema ${i}: HTTP ${r.status} ${r.text.slice(0, 300)}`); continue; }
    const choice = r.json.choices[0];
    let value;
    try { value = JSON.parse(choice.message.content); } catch (e) {
      check(false, `schema ${i} (${effort}): content is not JSON: ${JSON.stringify(choice.message.content)}`);
      continue;
    }
    const validator = walk ? ajv2020 : ajv;
    const valid = validator.validate(schema, value);
    check(valid, `schema ${i} (${effort}): ${JSON.stringify(value)} does not validate: ${validator.errorsText()} schema ${JSON.stringify(schema)}`);
    check(choice.finish_reason === 'stop', `schema ${i}: finish_reason ${choice.finish_reason}`);
    check(!choice.message.tool_calls, `schema ${i}: tool calls`);
    check(r.json.usage.completion_tokens <= (walk ? 160 : 100), `schema ${i}: ${r.json.usage.completion_tokens} tokens`);
    if (choice.message.reasoning_content) reasoned++;
  }
  check(reasoned >= nSchemas / 4, `only ${reasoned} answers reasoned first`);
}

// ---- tool_choice ---------------------------------------------------------------------------
const weatherParams = {
  type: 'object',
  properties: { city: { type: 'string', maxLength: 10 }, unit: { enum: ['c', 'f'] }, days: { type: 'integer', minimum: 1, maximum: 7 } },
  required: ['city', 'unit', 'days'], additionalProperties: false,
};
const tools = [
  { type: 'function', function: { name: 'get_weather', strict: true, parameters: weatherParams } },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: { zone: { type: 'string' } } } } },
];

async function toolChoice() {
  const jobs = [];
  const kinds = [
    ['required', 'required'],
    ['named', { type: 'function', function: { name: 'get_weather' } }],
    ['named_loose', { type: 'function', function: { name: 'get_time' } }],
    ['none', 'none'],
  ];
  for (const [k, [kind, tool_choice]] of kinds.entries())
    for (let j = 0; j < reps; j++) {
      const i = j + k; /* the seed and effort rotate with the kind */
      jobs.push(async () => ({
        kind, i, r: await post('/v1/chat/completions', {
          model, messages: user('Weather in Paris?'), temperature: 1, max_tokens: 80, seed: 200 + i,
          reasoning_effort: efforts[i % 3], tools, tool_choice, parallel_tool_calls: i % 2 === 0,
          logit_bias: i % 2 ? { 35644: -100 } : reasonFirst, // "analysis" or "final" discouraged
        }),
      }));
    }
  const results = await pool(jobs, 24);
  for (const res of results) {
    if (res.error) { check(false, `tool request failed: ${res.error}`); continue; }
    const { kind, i, r } = res;
    if (r.status !== 200) { check(false, `${kind} ${i}: HTTP ${r.status} ${r.text.slice(0, 300)}`); continue; }
    const choice = r.json.choices[0];
    const calls = choice.message.tool_calls || [];
    if (kind === 'none') {
      check(calls.length === 0, `none ${i}: tool calls ${JSON.stringify(calls)}`);
      continue;
    }
    check(calls.length === 1, `${kind} ${i}: ${calls.length} tool calls (${JSON.stringify(choice.message).slice(0, 300)})`);
    check(choice.finish_reason === 'tool_calls', `${kind} ${i}: finish_reason ${choice.finish_reason}`);
    check(!choice.message.content, `${kind} ${i}: content ${JSON.stringify(choice.message.content)}`);
    for (const call of calls) {
      const name = call.function.name;
      if (kind === 'named') check(name === 'get_weather', `named ${i}: called ${name}`);
      if (kind === 'named_loose') check(name === 'get_time', `named_loose ${i}: called ${name}`);
      check(['get_weather', 'get_time'].includes(name), `${kind} ${i}: unknown tool ${name}`);
      let args;
      try { args = JSON.parse(call.function.arguments); } catch {
        check(false, `${kind} ${i}: arguments are not JSON: ${call.function.arguments}`);
        continue;
      }
      if (name === 'get_weather')
        check(ajv.validate(weatherParams, args), `${kind} ${i}: ${call.function.arguments} ${ajv.errorsText()}`);
      else
        check(typeof args === 'object' && args !== null && !Array.isArray(args), `${kind} ${i}: get_time arguments not an object`);
    }
  }
}

// ---- official clients ----------------------------------------------------------------------
const Person = z.object({ name: z.string().max(12), age: z.number().int().min(0).max(120), tags: z.array(z.enum(['a', 'b'])).max(2) });

async function openaiParse() {
  // openai 5.23.2's zodResponseFormat converts zod 3 schemas; zod 4 objects come out wrong, so
  // the schema is converted by zod 4 itself and `parse` still does the parsing.
  const viaHelper = zodResponseFormat(Person, 'person').json_schema.schema;
  if (viaHelper.type !== 'object')
    console.log(`note: zodResponseFormat (openai 5.23.2) with zod 4 gives ${JSON.stringify(viaHelper)}; using z.toJSONSchema`);
  const schema = z.toJSONSchema(Person, { target: 'draft-7' });
  for (const effort of efforts) {
    const completion = await client.chat.completions.parse({
      model, messages: user('Make up a person.'), temperature: 1, max_tokens: 96, reasoning_effort: effort,
      response_format: { type: 'json_schema', json_schema: { name: 'person', strict: true, schema } },
    });
    const msg = completion.choices[0].message;
    const parsed = Person.safeParse(msg.parsed);
    check(parsed.success, `openai parse (${effort}): ${JSON.stringify(msg.parsed)} ${parsed.error}`);
  }
}

async function aiSdk() {
  const provider = createOpenAI({ baseURL: `${base}/v1`, apiKey: 'none' });
  for (const effort of ['low', 'high']) {
    const { object } = await generateObject({
      model: provider.chat(model), schema: Person, temperature: 1, maxOutputTokens: 96, maxRetries: 0,
      providerOptions: { openai: { reasoningEffort: effort } },
      prompt: 'Make up a person.',
    });
    check(Person.safeParse(object).success, `AI SDK generateObject (${effort}): ${JSON.stringify(object)}`);
  }
}

// ---- bad requests --------------------------------------------------------------------------
async function bad() {
  const ask = (extra) => post('/v1/chat/completions', { model, messages: user('hi'), max_tokens: 8, ...extra });
  const rf = (schema) => ({ response_format: { type: 'json_schema', json_schema: { name: 's', schema } } });
  const expect400 = async (what, extra, param, words = []) => {
    const r = await ask(extra);
    check(r.status === 400, `${what}: HTTP ${r.status}, expected 400: ${r.text.slice(0, 200)}`);
    if (r.status !== 400) return;
    check(r.json?.error?.param === param, `${what}: param ${r.json?.error?.param}, expected ${param}`);
    for (const w of words) check(r.json.error.message.includes(w), `${what}: message "${r.json.error.message}" lacks "${w}"`);
  };
  await expect400('unsupported keyword', rf({ type: 'object', properties: { a: { not: { type: 'string' } } } }),
    'response_format.json_schema.schema', ['not', '/properties/a']);
  await expect400('$ref loop', rf({ $defs: { a: { $ref: '#/$defs/b' }, b: { $ref: '#/$defs/a' } }, $ref: '#/$defs/a' }),
    'response_format.json_schema.schema');
  await expect400('response_format a string', { response_format: 'json' }, 'response_format');
  await expect400('response_format.type a number', { response_format: { type: 5 } }, 'response_format.type');
  await expect400('response_format.type unknown', { response_format: { type: 'xml' } }, 'response_format.type', ['xml']);
  await expect400('json_schema missing', { response_format: { type: 'json_schema' } }, 'response_format.json_schema');
  await expect400('json_schema.name missing', { response_format: { type: 'json_schema', json_schema: { schema: {} } } }, 'response_format.json_schema.name');
  await expect400('json_schema.schema a string', rf('object'), 'response_format.json_schema.schema');
  await expect400('json_schema.strict a string', { response_format: { type: 'json_schema', json_schema: { name: 's', strict: 'yes', schema: {} } } }, 'response_format.json_schema.strict');
  await expect400('tool_choice a number', { tools, tool_choice: 5 }, 'tool_choice');
  await expect400('tool_choice misspelled', { tools, tool_choice: 'requried' }, 'tool_choice', ['requried']);
  await expect400('tool_choice without type', { tools, tool_choice: { function: { name: 'get_time' } } }, 'tool_choice.type');
  await expect400('tool_choice unknown tool', { tools, tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice.function.name', ['nope']);
  await expect400('tool_choice required without tools', { tool_choice: 'required' }, 'tool_choice');
  await expect400('parallel_tool_calls a string', { tools, parallel_tool_calls: 'yes' }, 'parallel_tool_calls');
  await expect400('strict a string', { tools: [{ type: 'function', function: { name: 'f', strict: 'yes', parameters: { type: 'object' } } }] }, 'tools[0].function.strict');
  await expect400('strict tool with a bad schema', { tools: [{ type: 'function', function: { name: 'f', strict: true, parameters: { type: 'object', properties: { a: { not: {} } } } } }], tool_choice: 'required' },
    'tools[0].function.parameters', ['not']);
  // A schema of about 1 MB: refused clearly or served; either way the server stays up.
  const properties = {};
  for (let i = 0; i < 12000; i++) properties[`property_number_${i}`] = { type: 'string', maxLength: 8, description: 'x'.repeat(40) };
  const big = await ask(rf({ type: 'object', properties, additionalProperties: false }));
  check(big.status === 200 || ((big.status === 400 || big.status === 413) && big.json?.error?.message),
    `1 MB schema: HTTP ${big.status} ${big.text.slice(0, 200)}`);
  const health = await fetch(`${base}/health`, { signal: AbortSignal.timeout(10000) });
  check(health.status === 200, `server not healthy after the 1 MB schema: ${health.status}`);
}

const t0 = Date.now();
const step = async (name, fn) => {
  const s = Date.now();
  try { await fn(); } catch (e) { check(false, `${name}: ${e.stack || e}`); }
  console.log(`${name}: ${((Date.now() - s) / 1000).toFixed(1)} s`);
};
await step('bad requests', bad);
await step('schemas', schemas);
await step('tool_choice', toolChoice);
await step('openai parse', openaiParse);
await step('AI SDK generateObject', aiSdk);
console.log(`total ${((Date.now() - t0) / 1000).toFixed(1)} s, ${failures.length} failure(s)`);
process.exit(failures.length ? 1 : 0);
