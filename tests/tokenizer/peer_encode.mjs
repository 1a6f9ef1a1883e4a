// peer_encode.mjs - encodes the test corpus with the npm package gpt-tokenizer
// (o200k_harmony), an independent implementation, for test_peer.c to compare against.
//
// usage: node peer_encode.mjs OUT_FILE
// Writes a little-endian binary file: "GPTK", u32 document count, then per document:
//   u32 name bytes, name, u32 text bytes, text (UTF-8),
//   u32 n, n x i32 ids with special tokens treated as text,
//   u32 m, m x i32 ids with special tokens parsed.
//
// gpt-tokenizer 4.0.0 only recognizes a special token at the very start of the text (its
// search uses a sticky regex and adds the offset twice), so for the "parsed" ids the text is
// cut before every special token of tokenizer.json and each chunk is encoded on its own:
// the chunk's leading special token is still recognized by the peer itself, and tiktoken
// also encodes the text between special tokens independently, so the result is the same.
import { writeFileSync } from "node:fs";
import { encode } from "gpt-tokenizer/encoding/o200k_harmony";
import { makeCorpus } from "./corpus.mjs";

const out = process.argv[2];
if (!out) {
  console.error("usage: node peer_encode.mjs OUT_FILE");
  process.exit(2);
}
// The added tokens of the gpt-oss tokenizer.json (ids 199998..200018).
const SPECIALS = [
  "<|startoftext|>", "<|endoftext|>", "<|reserved_200000|>", "<|reserved_200001|>", "<|return|>",
  "<|constrain|>", "<|reserved_200004|>", "<|channel|>", "<|start|>", "<|end|>", "<|message|>",
  "<|reserved_200009|>", "<|reserved_200010|>", "<|reserved_200011|>", "<|call|>",
  "<|reserved_200013|>", "<|reserved_200014|>", "<|reserved_200015|>", "<|reserved_200016|>",
  "<|reserved_200017|>", "<|endofprompt|>",
];
const specialRe = new RegExp(SPECIALS.map((s) => s.replace(/[|]/g, "\\|")).join("|"), "g");

function encodeParsed(text) {
  const starts = [...text.matchAll(specialRe)].map((m) => m.index);
  const bounds = [0, ...starts.filter((i) => i > 0), text.length];
  const ids = [];
  for (let i = 0; i + 1 < bounds.length; i++) {
    const chunk = text.slice(bounds[i], bounds[i + 1]);
    if (chunk.length) ids.push(...encode(chunk, { allowedSpecial: "all" }));
  }
  return ids;
}

const docs = makeCorpus();
const chunks = [Buffer.from("GPTK")];
const u32 = (n) => {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(n);
  return b;
};
const ids = (list) => {
  const b = Buffer.alloc(4 * list.length);
  list.forEach((id, i) => b.writeInt32LE(id, 4 * i));
  return Buffer.concat([u32(list.length), b]);
};
chunks.push(u32(docs.length));
let bytes = 0;
for (const doc of docs) {
  const name = Buffer.from(doc.name, "utf8");
  const text = Buffer.from(doc.text, "utf8");
  bytes += text.length;
  chunks.push(u32(name.length), name, u32(text.length), text);
  chunks.push(ids(encode(doc.text, { disallowedSpecial: new Set() })));
  chunks.push(ids(encodeParsed(doc.text)));
}
writeFileSync(out, Buffer.concat(chunks));
console.log(`peer_encode: ${docs.length} documents, ${bytes} bytes`);
