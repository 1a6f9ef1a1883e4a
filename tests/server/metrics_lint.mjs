// metrics_lint.mjs - checks a Prometheus text exposition (stdin) the way `promtool check
// metrics` does: the format (HELP and TYPE once per family, before its samples; samples of a
// family together; names, labels, escapes and values well formed; no duplicate series;
// histogram buckets cumulative and ending in +Inf equal to _count), then promlint's rules:
// help text present, no ':' in names, counters end in _total and nothing else does, _bucket/
// _count/_sum and the le/quantile labels only where they belong, no type names, camelCase,
// abbreviated or non-base units in names. Prints each problem; exits 1 when there is one.
// Usage: node metrics_lint.mjs < metrics.txt
import fs from 'node:fs';

const text = fs.readFileSync(0, 'utf8');
const problems = [];
const bad = (line, what) => problems.push(`line ${line}: ${what}`);
const nameRe = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/;
const labelRe = /^[a-zA-Z_][a-zA-Z0-9_]*$/;
const families = new Map(); // name -> {type, help, line, samples: [{name, labels, value}]}
const seenSeries = new Set();
const closed = new Set(); // families whose samples ended (another family's came after)
let current = null;

function familyOf(sample) {
  for (const suffix of ['_bucket', '_count', '_sum']) {
    if (sample.endsWith(suffix)) {
      const base = sample.slice(0, -suffix.length);
      const f = families.get(base);
      if (f && (f.type === 'histogram' || (f.type === 'summary' && suffix !== '_bucket'))) return base;
    }
  }
  return sample;
}

function parseLabels(s, line) {
  // s: the text between { and }; returns [[name, value], ...] or null
  const out = [];
  let i = 0;
  while (i < s.length) {
    const m = /^([a-zA-Z_][a-zA-Z0-9_]*)="/.exec(s.slice(i));
    if (!m) { bad(line, `malformed label set {${s}}`); return null; }
    i += m[0].length;
    let v = '';
    for (;;) {
      if (i >= s.length) { bad(line, 'unterminated label value'); return null; }
      const c = s[i++];
      if (c === '"') break;
      if (c === '\\') {
        const e = s[i++];
        if (e === 'n') v += '\n'; else if (e === '\\' || e === '"') v += e;
        else { bad(line, `bad escape \\${e} in a label value`); return null; }
      } else v += c;
    }
    out.push([m[1], v]);
    if (i < s.length) {
      if (s[i] !== ',') { bad(line, `expected ',' in {${s}}`); return null; }
      i++;
    }
  }
  return out;
}

const lines = text.split('\n');
if (lines[lines.length - 1] !== '') bad(lines.length, 'the exposition does not end with a newline');
lines.forEach((raw, idx) => {
  const line = idx + 1;
  if (raw === '') return;
  if (raw.startsWith('#')) {
    const m = /^# (HELP|TYPE) (\S+) ?(.*)$/.exec(raw);
    if (!m) return; // a comment
    const [, kind, name, rest] = m;
    if (!nameRe.test(name)) bad(line, `bad metric name ${name}`);
    let f = families.get(name);
    if (f && f.samples.length) bad(line, `${kind} for ${name} after its samples`);
    if (!f) { f = { type: null, help: null, line, samples: [] }; families.set(name, f); }
    if (kind === 'HELP') {
      if (f.help !== null) bad(line, `second HELP for ${name}`);
      f.help = rest;
    } else {
      if (f.type !== null) bad(line, `second TYPE for ${name}`);
      if (!['counter', 'gauge', 'histogram', 'summary', 'untyped'].includes(rest)) bad(line, `unknown type ${rest}`);
      f.type = rest;
    }
    return;
  }
  const m = /^([^\s{]+)(?:\{(.*)\})? (\S+)( -?\d+)?$/.exec(raw);
  if (!m) { bad(line, `malformed sample: ${raw}`); return; }
  const [, name, labelText, valueText] = m;
  if (!nameRe.test(name)) bad(line, `bad metric name ${name}`);
  const labels = labelText ? parseLabels(labelText, line) : [];
  if (!labels) return;
  const names = labels.map(([k]) => k);
  if (new Set(names).size !== names.length) bad(line, `repeated label in ${raw}`);
  for (const k of names) if (!labelRe.test(k) || k.startsWith('__')) bad(line, `bad label name ${k}`);
  if (!/^[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|Inf|NaN)$/.test(valueText)) bad(line, `bad value ${valueText}`);
  const fname = familyOf(name);
  const f = families.get(fname);
  if (!f || f.type === null) { bad(line, `sample ${name} has no TYPE line before it`); return; }
  if (current !== fname) {
    if (closed.has(fname)) bad(line, `samples of ${fname} are not together`);
    if (current) closed.add(current);
    current = fname;
  }
  const key = name + JSON.stringify([...labels].sort());
  if (seenSeries.has(key)) bad(line, `duplicate series ${raw}`);
  seenSeries.add(key);
  f.samples.push({ name, labels: Object.fromEntries(labels), value: Number(valueText.replace('Inf', 'Infinity')), line });
});

const units = { amperes: 'amperes', bytes: 'bytes', celsius: 'celsius', grams: 'grams', joules: 'joules', kelvin: 'kelvin', meters: 'meters', metres: 'metres', seconds: 'seconds', volts: 'volts', minutes: 'seconds', hours: 'seconds', days: 'seconds', weeks: 'seconds', kelvins: 'kelvin', fahrenheit: 'celsius', rankine: 'celsius', inches: 'meters', yards: 'meters', miles: 'meters', bits: 'bytes', calories: 'joules', pounds: 'grams', ounces: 'grams' };
const prefixes = ['pico', 'nano', 'micro', 'milli', 'centi', 'deci', 'deca', 'hecto', 'kilo', 'kibi', 'mega', 'mibi', 'giga', 'gibi', 'tera', 'tebi', 'peta', 'pebi'];
const abbreviations = ['s', 'ms', 'us', 'ns', 'sec', 'b', 'kb', 'mb', 'gb', 'tb', 'pb', 'm', 'h', 'd'];
const camel = /[a-z][A-Z]/;

for (const [name, f] of families) {
  const at = `line ${f.line}: ${name}`;
  const n = name.toLowerCase();
  if (!f.help) problems.push(`${at}: no help text`);
  if (f.type === null) problems.push(`${at}: no TYPE`);
  if (name.includes(':')) problems.push(`${at}: metric names should not contain ':'`);
  const isCounter = f.type === 'counter', untyped = f.type === 'untyped';
  if (isCounter && !name.endsWith('_total')) problems.push(`${at}: counter metrics should have "_total" suffix`);
  if (!untyped && !isCounter && name.endsWith('_total')) problems.push(`${at}: non-counter metrics should not have "_total" suffix`);
  if (!untyped) {
    const hist = f.type === 'histogram', summ = f.type === 'summary';
    if (!hist && name.endsWith('_bucket')) problems.push(`${at}: non-histogram metrics should not have "_bucket" suffix`);
    if (!hist && !summ && (name.endsWith('_count') || name.endsWith('_sum'))) problems.push(`${at}: non-histogram and non-summary metrics should not have "_count"/"_sum" suffix`);
    for (const s of f.samples) {
      if (!hist && 'le' in s.labels) problems.push(`${at}: non-histogram metrics should not have "le" label`);
      if (!summ && 'quantile' in s.labels) problems.push(`${at}: non-summary metrics should not have "quantile" label`);
    }
  }
  if (!untyped && f.type !== 'gauge' && name.endsWith('_timestamp_seconds')) problems.push(`${at}: non-gauge metrics should not have "_timestamp_seconds" suffix`);
  for (const t of ['counter', 'gauge', 'histogram', 'summary'])
    if (n.includes(`_${t}_`) || n.endsWith(`_${t}`)) problems.push(`${at}: metric name should not include type '${t}'`);
  if (camel.test(name)) problems.push(`${at}: metric names should be written in 'snake_case' not 'camelCase'`);
  for (const s of f.samples) for (const k of Object.keys(s.labels)) if (camel.test(k)) problems.push(`${at}: label names should be written in 'snake_case' not 'camelCase'`);
  for (const a of abbreviations) if (n.includes(`_${a}_`) || n.endsWith(`_${a}`)) problems.push(`${at}: metric names should not contain abbreviated units`);
  for (const part of name.split('_')) {
    let unit = units[part] ? part : null;
    for (const p of prefixes) if (!unit && part.startsWith(p) && units[part.slice(p.length)]) unit = part;
    if (unit) {
      const base = units[unit] ?? units[prefixes.reduce((u, p) => (u.startsWith(p) ? u.slice(p.length) : u), unit)];
      if (unit !== base) problems.push(`${at}: use base unit "${base}" instead of "${unit}"`);
      break;
    }
  }
  if (f.type === 'histogram') {
    const series = new Map();
    for (const s of f.samples) {
      const { le, ...rest } = s.labels;
      const key = JSON.stringify(Object.entries(rest).sort());
      if (!series.has(key)) series.set(key, { buckets: [], sum: null, count: null });
      const h = series.get(key);
      if (s.name === `${name}_bucket`) {
        if (le === undefined) problems.push(`${at}: a bucket without le`);
        else h.buckets.push([Number(le.replace('Inf', 'Infinity')), s.value]);
      } else if (s.name === `${name}_sum`) h.sum = s.value;
      else if (s.name === `${name}_count`) h.count = s.value;
    }
    for (const [key, h] of series) {
      if (h.sum === null || h.count === null) problems.push(`${at}${key}: no _sum or _count`);
      if (!h.buckets.length || h.buckets[h.buckets.length - 1][0] !== Infinity) problems.push(`${at}${key}: no +Inf bucket last`);
      for (let i = 1; i < h.buckets.length; i++) {
        if (!(h.buckets[i][0] > h.buckets[i - 1][0])) problems.push(`${at}${key}: le not increasing`);
        if (h.buckets[i][1] < h.buckets[i - 1][1]) problems.push(`${at}${key}: buckets not cumulative`);
      }
      if (h.buckets.length && h.count !== null && h.buckets[h.buckets.length - 1][1] !== h.count) problems.push(`${at}${key}: +Inf bucket ${h.buckets[h.buckets.length - 1][1]} != _count ${h.count}`);
    }
  }
}

for (const p of problems) console.log(p);
process.exit(problems.length ? 1 : 0);
