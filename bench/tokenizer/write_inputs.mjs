// write_inputs.mjs - writes the tokenizer benchmark inputs into a folder:
//   corpus.txt   the >= 2.2 MB multilingual test corpus (tests/tokenizer/corpus.mjs), documents
//                joined by blank lines
//   english.txt  ~2 MB of English prose and source code (the common case for chat traffic)
//   spaces.txt   1 MB of spaces (one pre-token: the long-piece merge path)
//   word.txt     1 MB of pseudo-random lowercase letters with no break (one pre-token)
// usage: node bench/tokenizer/write_inputs.mjs OUT_DIR
import { writeFileSync } from "node:fs";
import { CODE, PROSE, makeCorpus, rng } from "../../tests/tokenizer/corpus.mjs";

const dir = process.argv[2];
if (!dir) {
  console.error("usage: node write_inputs.mjs OUT_DIR");
  process.exit(2);
}
writeFileSync(`${dir}/corpus.txt`, makeCorpus(2.2e6).map((d) => d.text).join("\n\n"));
const english = PROSE.english.join(" ") + "\n" + CODE.join("\n");
writeFileSync(`${dir}/english.txt`, english.repeat(Math.ceil(2e6 / english.length)));
writeFileSync(`${dir}/spaces.txt`, " ".repeat(1 << 20));
const r = rng(7);
writeFileSync(`${dir}/word.txt`, Array.from({ length: 1 << 20 }, () => String.fromCharCode(97 + Math.floor(r() * 26))).join(""));
