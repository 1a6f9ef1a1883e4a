// stream_peer.mjs - random byte sequences for checking our U+FFFD replacement against the
// WHATWG TextDecoder (node's, an independent implementation of the same "maximal subpart"
// rule). Writes OUT_DIR/ids.txt (the single-byte token ids of the bytes, o200k rank order of
// spec 5.4) and OUT_DIR/expected.json (JSON string of TextDecoder's decode of the bytes).
// usage: node stream_peer.mjs OUT_DIR SEED
import { writeFileSync } from "node:fs";
import { rng } from "./corpus.mjs";

const [dir, seedText] = process.argv.slice(2);
const r = rng(Number(seedText || 1));
const printable = (b) => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
const idOf = [];
let p = 0, o = 188;
for (let b = 0; b < 256; b++) idOf[b] = printable(b) ? p++ : o++;

// Mostly well-formed characters of every length, with truncations, stray continuation
// bytes, overlongs, surrogates and out-of-range leads mixed in.
const bytes = [];
const enc = new TextEncoder();
while (bytes.length < 6000) {
  const k = r();
  if (k < 0.5) {
    const cp = [0x41 + Math.floor(r() * 26), 0xe9, 0x4e2d, 0x1f600 + Math.floor(r() * 80)][Math.floor(r() * 4)];
    let b = [...enc.encode(String.fromCodePoint(cp))];
    if (r() < 0.3) b = b.slice(0, Math.max(1, Math.floor(r() * b.length)));
    bytes.push(...b);
  } else {
    bytes.push(...[[0x80], [0xbf], [0xc0, 0xaf], [0xc1], [0xed, 0xa0, 0x80], [0xf4, 0x90], [0xf5], [0xff], [0xe0, 0x80], [0xf0, 0x8f]][Math.floor(r() * 10)]);
  }
}
writeFileSync(`${dir}/ids.txt`, bytes.map((b) => idOf[b]).join(" ") + "\n");
writeFileSync(`${dir}/expected.json`, JSON.stringify(new TextDecoder().decode(Uint8Array.from(bytes))));
