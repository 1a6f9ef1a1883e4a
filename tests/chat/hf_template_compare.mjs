// hf_template_compare.mjs - renders OpenAI-style conversations with the Hugging Face chat
// template of gpt-oss (through @huggingface/jinja) and compares them, message by message,
// with our harmony renderings; every difference must be listed and explained.
//
// usage: node hf_template_compare.mjs CONVERSATIONS.json OURS.json DIFFERENCES.json [--show]
//   CONVERSATIONS  [{name, request: {messages, tools?, tool_choice?, reasoning_effort?}, our_date?}]
//   OURS           {name: {text} | {error}}  (written by test_hf_template.c from our renderer)
//   DIFFERENCES    {kinds: {kind: reason}, conversations: {name: [kind, ...]}}
// The template file is read from $GPTOSS_SHARED_DIR/reference/harmony/chat_template.jinja.
// Exit status 0 when every conversation differs exactly as listed, 1 otherwise (each
// mismatch printed). --show prints the kinds found for every conversation.
//
// How the request is handed to the template (as a server using it would): messages as given,
// except that reasoning_content is passed under the template's own name, "thinking";
// request.tools as `tools`; request.reasoning_effort when present; add_generation_prompt true;
// the clock fixed at 2025-06-28 (the template calls strftime_now, which reads Date).
import { Template } from "@huggingface/jinja";
import fs from "node:fs";
import path from "node:path";

const FIXED_DATE = [2025, 5, 28, 12]; // 2025-06-28, month is 0-based
const RealDate = Date;
globalThis.Date = class extends RealDate {
  constructor(...args) {
    if (args.length === 0) super(...FIXED_DATE);
    else super(...args);
  }
};

const [conversationsPath, oursPath, differencesPath] = process.argv.slice(2);
const show = process.argv.includes("--show");
if (!conversationsPath || !oursPath || !differencesPath || !process.env.GPTOSS_SHARED_DIR) {
  console.error("usage: GPTOSS_SHARED_DIR=... node hf_template_compare.mjs CONVERSATIONS OURS DIFFERENCES [--show]");
  process.exit(2);
}
const readJson = (p) => JSON.parse(fs.readFileSync(p, "utf8"));
const conversations = readJson(conversationsPath);
const ours = readJson(oursPath);
const expected = readJson(differencesPath);
const templatePath = path.join(process.env.GPTOSS_SHARED_DIR, "reference/harmony/chat_template.jinja");
const template = new Template(fs.readFileSync(templatePath, "utf8"));

function renderWithTemplate(request) {
  const messages = request.messages.map((m) => {
    const copy = { ...m };
    if ("reasoning_content" in copy) {
      copy.thinking = copy.reasoning_content;
      delete copy.reasoning_content;
    }
    return copy;
  });
  const context = { messages, add_generation_prompt: true };
  if (request.tools) context.tools = request.tools;
  if (request.reasoning_effort) context.reasoning_effort = request.reasoning_effort;
  try {
    return { text: template.render(context) };
  } catch (e) {
    return { error: String(e.message || e) };
  }
}

// ---- splitting a rendering into messages -------------------------------------------------

const END_TOKENS = ["<|end|>", "<|call|>", "<|return|>"];

function splitMessages(text) {
  const pieces = text.split("<|start|>");
  const messages = [];
  if (pieces[0] !== "") messages.push({ cls: "text_outside_messages", raw: pieces[0], header: "", content: pieces[0], end: "" });
  for (const raw of pieces.slice(1)) {
    const at = raw.indexOf("<|message|>");
    const header = at < 0 ? raw : raw.slice(0, at);
    let body = at < 0 ? null : raw.slice(at + "<|message|>".length);
    let end = "";
    if (body !== null) {
      for (const token of END_TOKENS)
        if (body.endsWith(token)) {
          end = token;
          body = body.slice(0, -token.length);
        }
    }
    messages.push({ cls: classify(header, body), raw, header, content: body, end });
  }
  return messages;
}

function classify(header, body) {
  const role = header.split(/[\s<]/)[0];
  if (role === "system" || role === "developer" || role === "user") return role;
  if (role === "assistant") {
    if (body === null) return "generation_prompt";
    if (/ to=/.test(header)) return "tool_call";
    const channel = (header.match(/<\|channel\|>(\w+)/) || [])[1];
    if (channel === "analysis") return "analysis";
    if (channel === "commentary") return "preamble";
    if (channel === "final") return "final";
    return "assistant_other";
  }
  return "tool_result";
}

// Longest common subsequence of message classes, so that a message missing on one side does
// not shift the comparison of every later one.
function align(a, b) {
  const n = a.length, m = b.length;
  const L = Array.from({ length: n + 1 }, () => new Array(m + 1).fill(0));
  for (let i = n - 1; i >= 0; i--)
    for (let j = m - 1; j >= 0; j--)
      L[i][j] = a[i].cls === b[j].cls ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
  const steps = [];
  let i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && a[i].cls === b[j].cls) steps.push([a[i++], b[j++]]);
    else if (j >= m || (i < n && L[i + 1][j] >= L[i][j + 1])) steps.push([a[i++], null]);
    else steps.push([null, b[j++]]);
  }
  return steps;
}

// ---- naming the difference between two messages of the same class ------------------------

function jsonEqual(x, y) {
  try {
    return JSON.stringify(JSON.parse(x)) === JSON.stringify(JSON.parse(y));
  } catch {
    return false;
  }
}

function systemKinds(o, t) {
  const kinds = [];
  const lines = (s) => s.split("\n");
  const pick = (s, test) => lines(s).filter(test).join("\n");
  const categories = [
    ["date_line", (l) => l.startsWith("Current date:")],
    ["reasoning_line", (l) => l.startsWith("Reasoning:")],
    ["knowledge_cutoff_line", (l) => l.startsWith("Knowledge cutoff:")],
    ["functions_channel_note", (l) => l.startsWith("Calls to these tools must go to")],
  ];
  for (const [kind, test] of categories) if (pick(o, test) !== pick(t, test)) kinds.push(kind);
  const rest = (l) => !categories.some(([, test]) => test(l));
  if (pick(o, rest) !== pick(t, rest)) kinds.push("system_content");
  return kinds;
}

function splitDeveloper(s) {
  if (s.startsWith("# Tools\n\n")) return ["", s];
  const at = s.indexOf("\n\n# Tools\n\n");
  return at < 0 ? [s, ""] : [s.slice(0, at), s.slice(at + 2)];
}

function developerKinds(o, t) {
  const kinds = [];
  const [oi, ot] = splitDeveloper(o);
  const [ti, tt] = splitDeveloper(t);
  if (oi !== ti) kinds.push(ti === oi + "\n\n" ? "developer_instructions_trailing_blank_line" : "developer_instructions");
  if (ot !== tt) {
    // The template ends every "// default: V" line with an extra comma.
    const withCommas = ot.replace(/(\/\/ default: [^\n]*[^,\n])$/gm, "$1,");
    kinds.push(withCommas === tt ? "function_schema_default_comma" : "function_schema_rendering");
  }
  return kinds;
}

function pairKinds(o, t) {
  if (o.raw === t.raw) return [];
  const kinds = [];
  const c = o.cls;
  if (o.header !== t.header) {
    if (c === "tool_call" && o.header.replace(" <|constrain|>json", " json") === t.header) kinds.push("tool_call_constrain_token");
    else kinds.push(`${c}_header`);
  }
  if (o.content !== t.content) {
    if (c === "system") kinds.push(...systemKinds(o.content, t.content));
    else if (c === "developer") kinds.push(...developerKinds(o.content, t.content));
    else if (c === "tool_call" && t.content === JSON.stringify(o.content)) kinds.push("tool_call_arguments_json_quoted");
    else if (c === "tool_call" && jsonEqual(o.content, t.content)) kinds.push("tool_call_arguments_reformatted");
    else if (c === "tool_result" && t.content === JSON.stringify(o.content)) kinds.push("tool_result_content_json_quoted");
    else kinds.push(`${c}_content`);
  }
  if (o.end !== t.end) kinds.push(`${c}_end_token`);
  return kinds;
}

function differenceKinds(our, their) {
  if (our.error !== undefined && their.error !== undefined) return ["rejected_by_both"];
  if (our.error !== undefined) return ["rejected_by_us"];
  if (their.error !== undefined) return ["template_error"];
  const kinds = new Set();
  for (const [o, t] of align(splitMessages(our.text), splitMessages(their.text))) {
    if (o && t) pairKinds(o, t).forEach((k) => kinds.add(k));
    else if (o) kinds.add(`${o.cls}_dropped_by_template`);
    else kinds.add(`${t.cls}_added_by_template`);
  }
  return [...kinds].sort();
}

// ---- comparing with the list of explained differences ------------------------------------

const problems = [];
const used = new Set();
let identical = 0;
const names = new Set();
for (const conversation of conversations) {
  const name = conversation.name;
  if (names.has(name)) problems.push(`${name}: the conversation name is used twice`);
  names.add(name);
  const our = ours[name];
  if (!our) {
    problems.push(`${name}: no rendering of ours`);
    continue;
  }
  const their = renderWithTemplate(conversation.request);
  const found = differenceKinds(our, their);
  if (found.length === 0) identical++;
  found.forEach((k) => used.add(k));
  if (show) console.log(`${name}: ${JSON.stringify(found)}${their.error ? "  (template: " + their.error + ")" : ""}`);
  const listed = expected.conversations[name];
  if (!listed) {
    problems.push(`${name}: not listed in the differences file (found ${JSON.stringify(found)})`);
    continue;
  }
  const listedSorted = [...listed].sort();
  const unexplained = found.filter((k) => !listedSorted.includes(k));
  const gone = listedSorted.filter((k) => !found.includes(k));
  if (unexplained.length || gone.length) {
    problems.push(`${name}: differs in ${JSON.stringify(unexplained)} not listed; listed ${JSON.stringify(gone)} no longer occur`);
    problems.push(`  ours:     ${JSON.stringify(our.text ?? our.error)}`);
    problems.push(`  template: ${JSON.stringify(their.text ?? their.error)}`);
  }
  for (const k of listed)
    if (!expected.kinds[k]) problems.push(`${name}: kind '${k}' has no reason in the "kinds" table`);
}
for (const name of Object.keys(expected.conversations))
  if (!names.has(name)) problems.push(`${name}: listed in the differences file but not a conversation`);
for (const kind of Object.keys(expected.kinds))
  if (!used.has(kind)) problems.push(`kind '${kind}' is explained but occurs in no conversation`);

console.log(`${conversations.length} conversations: ${identical} identical to the template, ` +
  `${conversations.length - identical} differ, ${used.size} kinds of difference`);
if (problems.length) {
  console.error(problems.join("\n"));
  process.exit(1);
}
