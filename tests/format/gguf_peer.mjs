// gguf_peer.mjs - reads a file written by `gptoss convert --to gguf` with @huggingface/gguf (an
// independent GGUF parser) and checks it against the Hugging Face folder it came from, read
// here directly (config.json, tokenizer.json, safetensors headers and bytes):
//   - metadata: llama.cpp's gpt-oss keys with the config's values and the expected types;
//   - tokenizer: tokens, token types and merges equal tokenizer.json's;
//   - tensors: llama.cpp's names, shapes (reversed), ggml types, aligned non-overlapping
//     offsets inside the file;
//   - bytes: F32 vectors equal the BF16 values, BF16 matrices are copied, MXFP4 blocks follow
//     ggml's layout (scale byte, then qs[j] = lane j | lane j+16 << 4), gate/up split by row
//     parity.
// usage: node tests/format/gguf_peer.mjs MODEL_DIR FILE.gguf   (exit 1 with a list on mismatch)
import { gguf } from "@huggingface/gguf";
import fs from "node:fs";
import path from "node:path";

const [dir, file] = process.argv.slice(2);
const failures = [];
const fail = (msg) => {
  if (failures.length < 40) failures.push(msg);
};

const { typedMetadata: md, tensorInfos, tensorDataOffset } = await gguf(file, {
  allowLocalFile: true,
  typedMetadata: true,
});
const cfg = JSON.parse(fs.readFileSync(path.join(dir, "config.json"), "utf8"));
const rope = cfg.rope_scaling ?? cfg.rope_parameters ?? {};

// ---- metadata ----
const U32 = 4, F32 = 6, STRING = 8, ARRAY = 9, I32 = 5;
const expectKey = (key, type, value) => {
  const got = md[key];
  if (!got) return fail(`metadata ${key} missing`);
  if (got.type !== type) fail(`metadata ${key}: type ${got.type}, expected ${type}`);
  const want = type === F32 ? Math.fround(value) : value;
  if (got.value !== want) fail(`metadata ${key}: ${got.value}, expected ${want}`);
};
expectKey("general.architecture", STRING, "gpt-oss");
expectKey("gpt-oss.block_count", U32, cfg.num_hidden_layers);
expectKey("gpt-oss.context_length", U32, cfg.max_position_embeddings);
expectKey("gpt-oss.embedding_length", U32, cfg.hidden_size);
expectKey("gpt-oss.feed_forward_length", U32, cfg.intermediate_size);
expectKey("gpt-oss.expert_feed_forward_length", U32, cfg.intermediate_size);
expectKey("gpt-oss.attention.head_count", U32, cfg.num_attention_heads);
expectKey("gpt-oss.attention.head_count_kv", U32, cfg.num_key_value_heads);
expectKey("gpt-oss.attention.key_length", U32, cfg.head_dim);
expectKey("gpt-oss.attention.value_length", U32, cfg.head_dim);
expectKey("gpt-oss.attention.sliding_window", U32, cfg.sliding_window);
expectKey("gpt-oss.attention.layer_norm_rms_epsilon", F32, cfg.rms_norm_eps);
expectKey("gpt-oss.expert_count", U32, cfg.num_local_experts);
expectKey("gpt-oss.expert_used_count", U32, cfg.num_experts_per_tok ?? cfg.experts_per_token);
expectKey("gpt-oss.rope.freq_base", F32, cfg.rope_theta ?? rope.rope_theta);
expectKey("gpt-oss.rope.scaling.type", STRING, "yarn");
expectKey("gpt-oss.rope.scaling.factor", F32, rope.factor);
expectKey("gpt-oss.rope.scaling.original_context_length", U32, rope.original_max_position_embeddings);
expectKey("gpt-oss.rope.scaling.yarn_beta_fast", F32, rope.beta_fast ?? 32);
expectKey("gpt-oss.rope.scaling.yarn_beta_slow", F32, rope.beta_slow ?? 1);
expectKey("tokenizer.ggml.model", STRING, "gpt2");
expectKey("tokenizer.ggml.pre", STRING, "gpt-4o");
expectKey("tokenizer.ggml.eos_token_id", U32, [cfg.eos_token_id].flat()[0]);
expectKey("tokenizer.ggml.padding_token_id", U32, cfg.pad_token_id);

// ---- tokenizer ----
const tj = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
const tokens = md["tokenizer.ggml.tokens"], types = md["tokenizer.ggml.token_type"];
const merges = md["tokenizer.ggml.merges"];
if (tokens?.type !== ARRAY || tokens.subType !== STRING) fail("tokenizer.ggml.tokens is not an array of strings");
if (types?.type !== ARRAY || types.subType !== I32) fail("tokenizer.ggml.token_type is not an array of i32");
if (merges?.type !== ARRAY || merges.subType !== STRING) fail("tokenizer.ggml.merges is not an array of strings");
const byId = new Map();
for (const [text, id] of Object.entries(tj.model.vocab)) byId.set(id, [text, 1]);
for (const t of tj.added_tokens) byId.set(t.id, [t.content, t.special === false ? 4 : 3]);
let maxId = -1;
for (const id of byId.keys()) if (id > maxId) maxId = id;
if (tokens.value.length !== Math.max(cfg.vocab_size, maxId + 1))
  fail(`${tokens.value.length} tokens for vocab ${cfg.vocab_size}`);
for (let id = 0; id < tokens.value.length; id++) {
  const [text, type] = byId.get(id) ?? [`[PAD${id}]`, 5];
  if (tokens.value[id] !== text) fail(`token ${id}: ${JSON.stringify(tokens.value[id])}, expected ${JSON.stringify(text)}`);
  if (types.value[id] !== type) fail(`token ${id}: type ${types.value[id]}, expected ${type}`);
}
const wantMerges = (tj.model.merges ?? []).map((m) => (Array.isArray(m) ? m.join(" ") : m));
if (merges.value.length !== wantMerges.length) fail(`${merges.value.length} merges, expected ${wantMerges.length}`);
for (let i = 0; i < wantMerges.length; i++)
  if (merges.value[i] !== wantMerges[i]) { fail(`merge ${i} differs`); break; }

// ---- the Hugging Face tensors ----
const hf = new Map(); // name -> {dtype, shape, file, start, end}
const indexPath = path.join(dir, "model.safetensors.index.json");
const shards = fs.existsSync(indexPath)
  ? [...new Set(Object.values(JSON.parse(fs.readFileSync(indexPath, "utf8")).weight_map))]
  : ["model.safetensors"];
for (const shard of shards) {
  const p = path.join(dir, shard);
  const fd = fs.openSync(p, "r");
  const lenBuf = Buffer.alloc(8);
  fs.readSync(fd, lenBuf, 0, 8, 0);
  const hlen = Number(lenBuf.readBigUInt64LE(0));
  const head = Buffer.alloc(hlen);
  fs.readSync(fd, head, 0, hlen, 8);
  fs.closeSync(fd);
  for (const [name, t] of Object.entries(JSON.parse(head.toString("utf8")))) {
    if (name === "__metadata__") continue;
    hf.set(name, { ...t, file: p, start: 8 + hlen + t.data_offsets[0], end: 8 + hlen + t.data_offsets[1] });
  }
}
const readHF = (name) => {
  const t = hf.get(name);
  const buf = Buffer.alloc(t.end - t.start);
  const fd = fs.openSync(t.file, "r");
  fs.readSync(fd, buf, 0, buf.length, t.start);
  fs.closeSync(fd);
  return buf;
};

// ---- tensors ----
const BF16 = 30, F32T = 0, MXFP4 = 39;
const infos = new Map(tensorInfos.map((t) => [t.name, t]));
const E = cfg.num_local_experts, H = cfg.hidden_size, I = cfg.intermediate_size;
const expected = new Map(); // gguf name -> [ggml type, ne]
const rev = (s) => [...s].reverse();
const shapeOf = (name) => hf.get(name).shape;
expected.set("token_embd.weight", [BF16, rev(shapeOf("model.embed_tokens.weight")), "model.embed_tokens.weight"]);
expected.set("output_norm.weight", [F32T, [H], "model.norm.weight"]);
expected.set("output.weight", [BF16, rev(shapeOf("lm_head.weight")), "lm_head.weight"]);
for (let l = 0; l < cfg.num_hidden_layers; l++) {
  const p = `model.layers.${l}.`;
  const add = (g, type, hfName) => expected.set(`blk.${l}.${g}`, [type, rev(shapeOf(p + hfName)), p + hfName]);
  add("attn_norm.weight", F32T, "input_layernorm.weight");
  for (const [g, h] of [["attn_q", "q_proj"], ["attn_k", "k_proj"], ["attn_v", "v_proj"], ["attn_output", "o_proj"]]) {
    add(`${g}.weight`, BF16, `self_attn.${h}.weight`);
    add(`${g}.bias`, F32T, `self_attn.${h}.bias`);
  }
  add("attn_sinks.weight", F32T, "self_attn.sinks");
  add("post_attention_norm.weight", F32T, "post_attention_layernorm.weight");
  add("ffn_gate_inp.weight", F32T, "mlp.router.weight");
  add("ffn_gate_inp.bias", F32T, "mlp.router.bias");
  expected.set(`blk.${l}.ffn_gate_exps.weight`, [MXFP4, [H, I, E]]);
  expected.set(`blk.${l}.ffn_up_exps.weight`, [MXFP4, [H, I, E]]);
  expected.set(`blk.${l}.ffn_down_exps.weight`, [MXFP4, [I, H, E]]);
  expected.set(`blk.${l}.ffn_gate_exps.bias`, [F32T, [I, E]]);
  expected.set(`blk.${l}.ffn_up_exps.bias`, [F32T, [I, E]]);
  add("ffn_down_exps.bias", F32T, "mlp.experts.down_proj_bias");
}
if (tensorInfos.length !== expected.size) fail(`${tensorInfos.length} tensors, expected ${expected.size}`);
if (tensorInfos.length !== hf.size) fail(`${tensorInfos.length} tensors, the folder has ${hf.size}`);
const bytesOf = (type, ne) => {
  const count = ne.reduce((a, b) => a * b, 1);
  return type === F32T ? count * 4 : type === BF16 ? count * 2 : (count / 32) * 17;
};
for (const [name, [type, ne]] of expected) {
  const t = infos.get(name);
  if (!t) { fail(`tensor ${name} missing`); continue; }
  if (t.dtype !== type) fail(`tensor ${name}: type ${t.dtype}, expected ${type}`);
  const shape = t.shape.map(Number);
  if (JSON.stringify(shape) !== JSON.stringify(ne)) fail(`tensor ${name}: ne [${shape}], expected [${ne}]`);
}
const fileSize = fs.statSync(file).size;
const sorted = [...tensorInfos].sort((a, b) => (a.offset < b.offset ? -1 : 1));
let end = 0;
for (const t of sorted) {
  const off = Number(t.offset);
  if (off % 32) fail(`tensor ${t.name}: offset ${off} not aligned to 32`);
  if (off < end) fail(`tensor ${t.name} overlaps the previous one`);
  end = off + bytesOf(t.dtype, t.shape.map(Number));
}
if (Number(tensorDataOffset) + end > fileSize) fail(`tensor data runs past the file (${fileSize} bytes)`);

// ---- bytes ----
const fd = fs.openSync(file, "r");
const readGGUF = (name) => {
  const t = infos.get(name);
  const buf = Buffer.alloc(bytesOf(t.dtype, t.shape.map(Number)));
  fs.readSync(fd, buf, 0, buf.length, Number(tensorDataOffset) + Number(t.offset));
  return buf;
};
const bf16 = (buf, i) => {
  const b = Buffer.alloc(4);
  b.writeUInt16LE(buf.readUInt16LE(2 * i), 2);
  return b.readFloatLE(0);
};
for (const [name, [type, , hfName]] of expected) {
  if (!hfName) continue;
  const g = readGGUF(name), h = readHF(hfName);
  if (type === BF16) {
    if (!g.equals(h)) fail(`tensor ${name}: bytes differ from ${hfName}`);
  } else {
    for (let i = 0; i < g.length / 4; i++)
      if (g.readFloatLE(4 * i) !== bf16(h, i)) { fail(`tensor ${name}[${i}] != ${hfName}`); break; }
  }
}
// Experts: ggml block = scale, then qs[j] = lane j | lane (j + 16) << 4.
const lane = (blocks, base, m) => (blocks[base + (m >> 1)] >> (4 * (m & 1))) & 15;
for (let l = 0; l < cfg.num_hidden_layers; l++) {
  const p = `model.layers.${l}.mlp.experts.`;
  for (const [g, hfBase, rows, K, step, first] of [
    ["ffn_gate_exps", "gate_up_proj", I, H, 2, 0],
    ["ffn_up_exps", "gate_up_proj", I, H, 2, 1],
    ["ffn_down_exps", "down_proj", H, I, 1, 0],
  ]) {
    const out = readGGUF(`blk.${l}.${g}.weight`);
    const blocks = readHF(p + hfBase + "_blocks"), scales = readHF(p + hfBase + "_scales");
    const G = K / 32;
    let bad = 0;
    for (let e = 0; e < E && !bad; e++)
      for (let r = 0; r < rows && !bad; r++) {
        const src = (e * rows * step + r * step + first) * G;
        for (let b = 0; b < G; b++) {
          const o = ((e * rows + r) * G + b) * 17;
          if (out[o] !== scales[src + b]) bad++;
          for (let j = 0; j < 16; j++) {
            const base = (src + b) * 16;
            if (out[o + 1 + j] !== (lane(blocks, base, j) | (lane(blocks, base, j + 16) << 4))) bad++;
          }
        }
      }
    if (bad) fail(`blk.${l}.${g}.weight: MXFP4 blocks differ from ${hfBase}`);
    if (g !== "ffn_down_exps") {
      const bias = readGGUF(`blk.${l}.${g}.bias`), hb = readHF(p + "gate_up_proj_bias");
      for (let i = 0; i < E * I; i++)
        if (bias.readFloatLE(4 * i) !== bf16(hb, 2 * i + first)) { fail(`blk.${l}.${g}.bias[${i}] differs`); break; }
    }
  }
}
fs.closeSync(fd);

if (failures.length) {
  console.error(failures.join("\n"));
  process.exit(1);
}
console.log(`gguf_peer: ${tensorInfos.length} tensors, ${Object.keys(md).length} metadata keys, ${tokens.value.length} tokens agree`);
