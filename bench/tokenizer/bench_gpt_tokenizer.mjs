// bench_gpt_tokenizer.mjs - times gpt-tokenizer's o200k_harmony encode (one thread) on a
// file, the same way `gptoss tokenize --bench` times ours: best of >= 3 runs over ~2 s,
// after one warm-up run (which also fills its merge cache, as in steady-state use).
// usage: node bench/tokenizer/bench_gpt_tokenizer.mjs FILE
import { readFileSync } from "node:fs";
import { encode } from "gpt-tokenizer/encoding/o200k_harmony";

const file = process.argv[2];
if (!file) {
  console.error("usage: node bench_gpt_tokenizer.mjs FILE");
  process.exit(2);
}
const bytes = readFileSync(file);
const text = bytes.toString("utf8");
let n = encode(text, { disallowedSpecial: new Set() }).length;
let best = Infinity;
let runs = 0;
const start = performance.now();
while (runs < 3 || performance.now() - start < 2000) {
  const t0 = performance.now();
  n = encode(text, { disallowedSpecial: new Set() }).length;
  best = Math.min(best, (performance.now() - t0) / 1000);
  runs++;
}
console.log(`gpt-tokenizer ${process.version}: input ${bytes.length} bytes, ${n} tokens`);
console.log(`encode: best of ${runs} runs ${best.toFixed(4)} s = ${(bytes.length / best / 1e6).toFixed(2)} MB/s, ${(n / best / 1e6).toFixed(2)} M tokens/s`);
