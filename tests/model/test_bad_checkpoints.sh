#!/usr/bin/env bash
# Broken checkpoints must fail with a specific, actionable message and a non-zero exit:
# never a crash (signals give exit codes >= 128), never a hang (every run has a timeout),
# never a leak (the ASan build runs this same script).
set -uo pipefail
bin=${GPTOSS_BIN:?run through ctest}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

"$bin" make-model --config "$GPTOSS_SOURCE_DIR/tests/golden/configs/moe.json" -o "$work/good" --seed 5 >/dev/null ||
  { echo "FAIL: make-model"; exit 1; }
"$bin" make-model --config "$GPTOSS_SOURCE_DIR/tests/golden/configs/moe.json" -o "$work/single" --seed 5 --single-file >/dev/null ||
  { echo "FAIL: make-model --single-file"; exit 1; }
for good in good single; do
  if ! timeout 60 "$bin" info -m "$work/$good" >/dev/null 2>"$work/err"; then
    echo "FAIL: the intact checkpoint ($good) does not load: $(cat "$work/err")"; exit 1
  fi
done

# expect NAME PATTERN -- runs `gptoss info` on $work/case and checks exit status and message.
expect() {
  local name=$1 pattern=$2
  local out rc
  out=$(timeout 60 "$bin" info -m "$work/case" 2>&1)
  rc=$?
  if [ $rc -eq 0 ]; then
    echo "FAIL [$name]: accepted a broken checkpoint"; failures=$((failures + 1))
  elif [ $rc -ge 124 ]; then
    echo "FAIL [$name]: crashed or hung (exit $rc): $out"; failures=$((failures + 1))
  elif ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL [$name]: message does not match /$pattern/: $out"; failures=$((failures + 1))
  else
    echo "ok   [$name] $out"
  fi
}
fresh() { rm -rf "$work/case"; cp -r "$work/${1:-good}" "$work/case"; }
shard() { ls "$work/case"/model-*.safetensors | sort | head -n1; }
# Rewrites the JSON header of a safetensors file through python-free tools: node.
rewrite_header() { # file, js expression transforming `h` (the parsed header object)
  node -e '
    const fs = require("fs"); const f = process.argv[1];
    const b = fs.readFileSync(f); const n = Number(b.readBigUInt64LE(0));
    let h = JSON.parse(b.subarray(8, 8 + n).toString());
    h = (function(h) { '"$2"'; return h; })(h);
    let text = JSON.stringify(h); while ((text.length % 8) !== 0) text += " ";
    const len = Buffer.alloc(8); len.writeBigUInt64LE(BigInt(Buffer.byteLength(text)));
    fs.writeFileSync(f, Buffer.concat([len, Buffer.from(text), b.subarray(8 + n)]));' "$1"
}
first_tensor='Object.keys(h).filter(k => k !== "__metadata__").sort((a,b)=>h[a].data_offsets[0]-h[b].data_offsets[0])'

fresh; f=$(shard); truncate -s 5 "$f"
expect "file shorter than a header" "too short for a safetensors header"
fresh; f=$(shard); truncate -s $(( $(stat -c %s "$f") - 100 )) "$f"
expect "truncated data" "run past the end of the data|truncated"
fresh; f=$(shard); printf '\xff\xff\xff\x00\x00\x00\x00\x00' | dd of="$f" bs=1 seek=0 count=8 conv=notrunc 2>/dev/null
expect "header length past the end" "header length .* runs past the end|exceeds"
fresh; f=$(shard); printf '\x00\x00\x00\x00\x10\x00\x00\x00' | dd of="$f" bs=1 seek=0 count=8 conv=notrunc 2>/dev/null
expect "absurd header length" "exceeds the .* byte limit"
fresh; f=$(shard); rewrite_header "$f" "const k = $first_tensor; h[k[1]].data_offsets = [h[k[0]].data_offsets[0], h[k[0]].data_offsets[0] + (h[k[1]].data_offsets[1] - h[k[1]].data_offsets[0])]"
expect "overlapping offsets" "overlap"
fresh; f=$(shard); rewrite_header "$f" "const k = $first_tensor; const t = h[k[0]]; const len = t.data_offsets[1]-t.data_offsets[0]; t.data_offsets = [1e12, 1e12 + len]"
expect "out-of-range offsets" "run past the end of the data"
fresh; f=$(shard); rewrite_header "$f" "const k = $first_tensor; h[k[0]].dtype = \"Q7\""
expect "unknown dtype" "unknown dtype \"Q7\""
fresh; f=$(shard); rewrite_header "$f" "const k = Object.keys(h).find(k => k.endsWith(\"q_proj.weight\")); h[k].dtype = \"F16\""
expect "wrong dtype" "q_proj.weight: dtype F16, expected BF16"
fresh; f=$(shard); rewrite_header "$f" "const k = Object.keys(h).find(k => k.endsWith(\"q_proj.weight\")); h[k].shape = [h[k].shape[1], h[k].shape[0]]"
expect "wrong shape" "q_proj.weight: expected shape \\[128,96\\] from config.json, file has \\[96,128\\]"
fresh; f=$(shard); rewrite_header "$f" "const k = Object.keys(h).find(k => k.endsWith(\"q_proj.weight\")); h[k].shape = [h[k].shape[0], h[k].shape[1] + 1]"
expect "shape disagrees with byte range" "needs .* bytes but data_offsets span"
fresh; f=$(shard); rewrite_header "$f" "h[\"{not json\"] = 1; " ; printf '{"a":' | dd of="$f" bs=1 seek=8 count=5 conv=notrunc 2>/dev/null
expect "invalid header JSON" "not valid JSON"
fresh single; rewrite_header "$work/case/model.safetensors" "const k = Object.keys(h).find(k => k.endsWith(\"layers.1.self_attn.sinks\")); delete h[k]"
expect "missing tensor" "missing: model.layers.1.self_attn.sinks"
fresh single; rewrite_header "$work/case/model.safetensors" "const k = Object.keys(h).find(k => k.endsWith(\"layers.1.self_attn.sinks\")); h[\"model.layers.1.self_attn.extra\"] = h[k]; delete h[k]"
expect "renamed tensor: missing and unexpected" "missing: model.layers.1.self_attn.sinks.*unexpected tensor\\(s\\): model.layers.1.self_attn.extra"
fresh; node -e 'const fs=require("fs");const p=process.argv[1];const j=JSON.parse(fs.readFileSync(p));delete j.weight_map["model.layers.2.mlp.router.bias"];fs.writeFileSync(p,JSON.stringify(j))' "$work/case/model.safetensors.index.json"
expect "tensor missing from the index" "model.layers.2.mlp.router.bias is not in the weight_map"
fresh; rm "$(shard)"
expect "missing shard" "shard model-00000-of-.* does not exist"
fresh; echo '{"weight_map": ' >"$work/case/model.safetensors.index.json"
expect "invalid index JSON" "model.safetensors.index.json: not valid JSON"
fresh; echo '{ "model_type": "gpt_oss", ' >"$work/case/config.json"
expect "invalid config JSON" "config.json is not valid JSON"
fresh; sed -i 's/"gpt_oss"/"llama"/' "$work/case/config.json"
expect "unknown architecture" "model_type is \"llama\", not \"gpt_oss\""
for field in num_hidden_layers hidden_size num_attention_heads vocab_size num_local_experts head_dim; do
  fresh; sed -i "s/\"$field\": [0-9]*/\"$field\": 0/" "$work/case/config.json"
  expect "$field = 0" "\"$field\" = 0 is outside|$field"
  fresh; sed -i "s/\"$field\": [0-9]*/\"$field\": -3/" "$work/case/config.json"
  expect "$field negative" "\"$field\" = -3 is outside"
done
fresh; sed -i 's/"hidden_size": [0-9]*/"hidden_size": 60000/; s/"vocab_size": [0-9]*/"vocab_size": 16000000/' "$work/case/config.json"
expect "absurd sizes" "GB of weights; refusing"
fresh; sed -i 's/"hidden_size": [0-9]*/"hidden_size": 100/' "$work/case/config.json"
expect "hidden not a multiple of 32" "multiple of 32"
fresh; sed -i 's/"num_key_value_heads": [0-9]*/"num_key_value_heads": 3/' "$work/case/config.json"
expect "heads not a multiple of KV heads" "must be a positive multiple of num_key_value_heads"
fresh; sed -i 's/"num_experts_per_tok": [0-9]*/"num_experts_per_tok": 64/; s/"experts_per_token": [0-9]*/"experts_per_token": 64/' "$work/case/config.json"
expect "top-k above experts" "num_experts_per_tok \\(64\\) must be in"
fresh; sed -i 's/"hidden_size": [0-9]*/"hidden_size": "big"/' "$work/case/config.json"
expect "size of the wrong type" "\"hidden_size\" must be an integer"
fresh; node -e 'const fs=require("fs");const p=process.argv[1];const j=JSON.parse(fs.readFileSync(p));delete j.rope_scaling;fs.writeFileSync(p,JSON.stringify(j))' "$work/case/config.json"
expect "missing rope_scaling" "rope_scaling.*missing"
fresh; rm "$work/case/config.json"
expect "missing config" "config.json: cannot open"
fresh; rm "$work/case/tokenizer.json"
expect "missing tokenizer" "tokenizer.json is missing"
fresh; rm "$work/case"/model*
expect "no weights" "no weights"
rm -rf "$work/case"
expect "missing folder" "No such file or directory"

if [ $failures -ne 0 ]; then
  echo "$failures case(s) failed"
  exit 1
fi
echo "all broken-checkpoint cases rejected with specific messages"
