// json_schema_walks.mjs - the independent check of the JSON Schema matcher.
//
//   node json_schema_walks.mjs gen SCHEMAS_JSON [COUNT] [SEED]
//       writes COUNT seeded random schemas covering every supported keyword (nested a few
//       levels), plus json_object mode entries, for tests/structured/json_walk.c;
//   node json_schema_walks.mjs check SCHEMAS_JSON WALKS_JSONL
//       parses every walk the driver took and validates it with ajv (draft 2020-12,
//       ajv-formats): each must be valid UTF-8, parse as JSON, and match its schema; every
//       schema must compile and no walk may report a matcher invariant violation.
import fs from 'node:fs';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
const Ajv2020 = require('ajv/dist/2020').default;
const addFormats = require('ajv-formats').default;

// mulberry32: a small seeded generator, so that a failure is reproducible from its seed
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const PATTERNS = [
  '^[a-z]+$', '^\\d{3}-\\d{4}$', 'ab+c', '^(foo|bar)baz?$', '^[A-Z][a-z]{2,5}$', '\\w+@\\w+',
  '^[^\\s"]{1,8}$', '^x.y$', '^[0-9a-fA-F]{6}$', '^(?:[a-z]{2}-)?[A-Z]{2}$', '^\\S+$',
  '^[\\u00e0-\\u00ff]{1,4}$', '^(ab|cd)*$', '^-?\\d+(\\.\\d{1,2})?$', '^[^a-z]*$', 'é',
  '^a{2,}b{0,2}$', '^[\\w.-]+$', '^"\\\\q$',
];
const FORMATS = ['date', 'date-time', 'time', 'uuid', 'email', 'ipv4', 'hostname', 'uri', 'duration'];
// what zod 4's toJSONSchema writes beside its formats: a pattern and a format together
const ZOD_STRINGS = [
  { type: 'string', format: 'email', pattern: "^(?!\\.)(?!.*\\.\\.)([A-Za-z0-9_'+\\-\\.]*)[A-Za-z0-9_+-]@([A-Za-z0-9][A-Za-z0-9\\-]*\\.)+[A-Za-z]{2,}$".replace('(?!\\.)(?!.*\\.\\.)', '') },
  { type: 'string', format: 'uuid', pattern: '^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}|00000000-0000-0000-0000-000000000000|ffffffff-ffff-ffff-ffff-ffffffffffff)$' },
  { type: 'string', format: 'date', pattern: '^(?:(?:\\d\\d[2468][048]|\\d\\d[13579][26]|\\d\\d0[48]|[02468][048]00|[13579][26]00)-02-29|\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|(?:02)-(?:0[1-9]|1\\d|2[0-8])))$' },
  { type: 'string', format: 'date-time', pattern: '^(?:(?:\\d\\d[2468][048]|\\d\\d[13579][26]|\\d\\d0[48]|[02468][048]00|[13579][26]00)-02-29|\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|(?:02)-(?:0[1-9]|1\\d|2[0-8])))T(?:(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d+)?(?:Z))$' },
];
const WORDS = ['name', 'id', 'value', 'items', 'tags', 'count', 'city', 'zip', 'é', 'a b',
  'q"uote', 'back\\slash', 'x', 'nested', 'flag', 'when', 'n', 'naming', 'nam'];

function generator(seed) {
  const r = rng(seed);
  const int = (lo, hi) => lo + Math.floor(r() * (hi - lo + 1));
  const pick = (list) => list[Math.floor(r() * list.length)];
  const chance = (p) => r() < p;

  function stringSchema() {
    const s = { type: 'string' };
    const k = int(0, 4);
    if (k === 1) s.format = pick(FORMATS);
    if (k === 2) s.pattern = pick(PATTERNS);
    if (k === 3) {
      if (chance(0.7)) s.minLength = int(0, 4);
      if (chance(0.7)) s.maxLength = (s.minLength ?? 0) + int(0, 8);
    }
    if (k === 2 && chance(0.3)) { // loose enough for every pattern above
      if (chance(0.7)) s.minLength = int(0, 2);
      if (chance(0.7)) s.maxLength = (s.minLength ?? 0) + int(10, 16);
    }
    if (k === 4 && chance(0.5)) s.description = 'free text';
    if (k === 4 && chance(0.3)) return { ...pick(ZOD_STRINGS) };
    return s;
  }
  function numberSchema() {
    const s = { type: chance(0.5) ? 'integer' : 'number' };
    const k = int(0, 5);
    const lo = int(-1000, 1000);
    if (k === 1) s.minimum = lo;
    if (k === 2) { s.minimum = lo; s.maximum = lo + int(0, 2000); }
    if (k === 3) { s.exclusiveMinimum = lo; s.exclusiveMaximum = lo + int(2, 500); }
    if (k === 4) { s.minimum = lo + 0.5; s.maximum = lo + 0.5 + int(1, 50) + 0.25; }
    if (k === 5) { s.maximum = -int(0, 99999); }
    return s;
  }
  function enumSchema() {
    const pool = ['red', 'green', 'blue', 'é"\\', 1, 2.5, -3, true, null, { a: 1 }, [1, 'x']];
    const values = [...new Set(Array.from({ length: int(1, 5) }, () => pick(pool)))];
    if (chance(0.25)) return { const: values[0] };
    if (chance(0.3)) return { type: 'string', enum: ['a', 'b', 'c', 7].slice(0, int(1, 4)) };
    return { enum: values };
  }
  function objectSchema(depth, defs) {
    const n = int(0, 4);
    const props = {};
    const names = [...new Set(Array.from({ length: n }, () => pick(WORDS)))];
    for (const name of names) props[name] = schema(depth + 1, defs);
    const s = { type: 'object', properties: props };
    const required = names.filter(() => chance(0.6));
    if (required.length || chance(0.3)) s.required = required;
    const ap = int(0, 5);
    if (ap <= 2) s.additionalProperties = false;
    else if (ap === 3) s.additionalProperties = true;
    else if (ap === 4 && depth < 3) s.additionalProperties = scalar();
    if (ap === 4 && chance(0.5)) s.propertyNames = { type: 'string' }; // zod records
    if (chance(0.15) && ap >= 3) s.required = [...(s.required ?? []), 'extra_required'];
    return s;
  }
  function arraySchema(depth, defs) {
    const s = { type: 'array' };
    const k = int(0, 3);
    if (k === 0 || k === 1) s.items = schema(depth + 1, defs);
    if (k === 2) {
      s.prefixItems = Array.from({ length: int(1, 3) }, () => schema(depth + 1, defs));
      s.items = chance(0.5) ? false : scalar();
    }
    if (chance(0.5)) s.minItems = int(0, 2);
    if (chance(0.5)) s.maxItems = (s.minItems ?? 0) + int(0, 4);
    if (s.items === false && (s.minItems ?? 0) > s.prefixItems.length) s.minItems = s.prefixItems.length;
    return s;
  }
  function scalar() {
    const k = int(0, 4);
    if (k === 0) return stringSchema();
    if (k === 1) return numberSchema();
    if (k === 2) return { type: 'boolean' };
    if (k === 3) return { type: 'null' };
    return enumSchema();
  }
  // disjoint branches, so that oneOf (compiled as anyOf) stays exact
  function unionSchema(depth, defs) {
    const kinds = ['string', 'integer', 'boolean', 'null', 'object', 'array'];
    const chosen = kinds.filter(() => chance(0.5)).slice(0, 3);
    if (chosen.length < 2) chosen.splice(0, chosen.length, 'string', 'null');
    const branch = (kind) => {
      if (kind === 'string') return stringSchema();
      if (kind === 'integer') return { type: 'integer', minimum: int(-5, 5) };
      if (kind === 'object') return objectSchema(depth + 1, defs);
      if (kind === 'array') return { type: 'array', items: scalar(), maxItems: 3 };
      return { type: kind };
    };
    const k = int(0, 2);
    if (k === 0) return { anyOf: chosen.map(branch) };
    if (k === 1) return { oneOf: chosen.map(branch) };
    return { type: [...new Set(chosen.filter((t) => t !== 'object' && t !== 'array').concat(['null']))] };
  }
  function schema(depth, defs) {
    if (depth >= 3) return scalar();
    const k = int(0, 9);
    if (k <= 2) return scalar();
    if (k <= 4) return objectSchema(depth, defs);
    if (k === 5) return arraySchema(depth, defs);
    if (k === 6) return unionSchema(depth, defs);
    if (k === 7 && defs) {
      const name = `d${Object.keys(defs).length}`;
      defs[name] = schema(depth + 1, null);
      return { $ref: `#/$defs/${name}` };
    }
    if (k === 8 && chance(0.5)) {
      const a = objectSchema(depth + 1, null), b = objectSchema(depth + 1, null);
      for (const part of [a, b]) delete part.additionalProperties; // parts must not forbid each other's keys
      for (const name of Object.keys(b.properties)) if (name in a.properties) delete b.properties[name];
      b.required = (b.required ?? []).filter((n) => n in b.properties || !(n in a.properties));
      return { allOf: [a, b] };
    }
    if (k === 8) return { allOf: [scalar()] };
    return chance(0.5) ? {} : { description: 'anything' };
  }
  function top(i) {
    if (i % 40 === 0) return { json_object: true };
    if (i % 25 === 3) {
      // a recursive tree: bounded unrolling
      return {
        schema: {
          $defs: {
            node: {
              type: 'object',
              properties: {
                label: { type: 'string', maxLength: 6 },
                children: { type: 'array', items: { $ref: '#/$defs/node' }, maxItems: 2 },
              },
              required: ['label'],
              additionalProperties: false,
            },
          },
          $ref: '#/$defs/node',
        },
      };
    }
    const defs = {};
    const s = i % 3 === 0 ? objectSchema(0, defs) : schema(0, defs);
    if (Object.keys(defs).length) s.$defs = defs;
    if (i % 7 === 0) s.$schema = 'https://json-schema.org/draft/2020-12/schema';
    return { schema: s };
  }
  return top;
}

function gen(file, count, seed) {
  const top = generator(seed);
  const list = Array.from({ length: count }, (_, i) => top(i));
  fs.writeFileSync(file, JSON.stringify(list));
}

function check(schemasFile, walksFile) {
  const schemas = JSON.parse(fs.readFileSync(schemasFile, 'utf8'));
  const results = fs.readFileSync(walksFile, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
  const ajv = new Ajv2020({ strict: false, allErrors: false });
  addFormats(ajv);
  const decoder = new TextDecoder('utf-8', { fatal: true });
  let failures = 0, walks = 0;
  const fail = (i, what) => {
    failures++;
    if (failures <= 25) console.log(`FAIL schema ${i}: ${what}\n  schema: ${JSON.stringify(schemas[i]).slice(0, 400)}`);
  };
  if (results.length !== schemas.length) fail(-1, `${results.length} results for ${schemas.length} schemas`);
  for (const res of results) {
    const entry = schemas[res.i];
    if (!res.ok) { fail(res.i, `did not compile: ${res.error}`); continue; }
    for (const v of res.violations) fail(res.i, `matcher: ${v}`);
    const validate = ajv.compile(entry.json_object ? { type: 'object' } : entry.schema);
    for (const hex of res.walks) {
      walks++;
      let text, value;
      try { text = decoder.decode(Buffer.from(hex, 'hex')); } catch { fail(res.i, `invalid UTF-8: ${hex}`); continue; }
      try { value = JSON.parse(text); } catch (e) { fail(res.i, `not JSON (${e.message}): ${text}`); continue; }
      if (!validate(value)) fail(res.i, `invalid: ${text}\n  ajv: ${JSON.stringify(validate.errors)}`);
      if (/[\t\n\r]|  |[^:,] /.test(text.replace(/"(?:[^"\\]|\\.)*"/g, '""')))
        fail(res.i, `whitespace outside the rule: ${text}`);
    }
  }
  console.log(`${results.length} schemas, ${walks} walks validated with ajv: ${failures} failures`);
  process.exit(failures ? 1 : 0);
}

const [cmd, ...args] = process.argv.slice(2);
if (cmd === 'gen') gen(args[0], Number(args[1] ?? 320), Number(args[2] ?? 1));
else if (cmd === 'check') check(args[0], args[1]);
else { console.error('usage: json_schema_walks.mjs gen FILE [COUNT] [SEED] | check SCHEMAS WALKS'); process.exit(2); }
