#!/usr/bin/env python3
"""Golden logits for gptoss from Hugging Face transformers' GptOssForCausalLM.

Runs where torch and transformers are installed (never in CI). For each case below it writes a
random-weight checkpoint with `gptoss make-model`, loads it into transformers in float32, runs
fixed token sequences through it and writes a compact fixture to tests/golden/fixtures/:
per position the top-k token ids and logits, plus the logits at a fixed set of vocabulary
indices, and the SHA-256 of the checkpoint's safetensors files so the CI test can prove it
regenerated the very same weights.

How MXFP4 is dequantized: transformers' own path, `Mxfp4Config(dequantize=True)`, which turns
each `*_blocks`/`*_scales` pair into dense weights (E2M1 code looked up, times 2^(scale-127))
when loading. Nothing here dequantizes by hand, so the fixtures test our reading of the format
against transformers', not against ourselves. transformers keeps the dequantized expert
weights in bf16 (the values are exact) and then runs the expert matmuls in the weights' dtype;
the script widens them to float32 after loading so that every operation is float32. Attention uses the eager implementation (the one
that applies the sinks as an extra softmax column) and TF32 is disabled so float32 means
float32.

usage: make_golden.py --gptoss PATH/TO/gptoss [--out DIR] [--device cpu|cuda]
"""
import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

# name, make-model arguments, seed, prompt lengths
CASES = [
    ("swa", ["--config", os.path.join(HERE, "configs", "swa.json")], 11, [48, 37]),
    ("yarn", ["--config", os.path.join(HERE, "configs", "yarn.json")], 12, [300]),
    ("moe", ["--config", os.path.join(HERE, "configs", "moe.json")], 13, [40, 25]),
    ("tiny", ["--preset", "tiny"], 14, [40]),
]
TOP_K = 8
N_PROBES = 16


def checkpoint_sha256(folder):
    """SHA-256 over every tensor, in name order: name, NUL, dtype, NUL, shape as decimal
    numbers joined by ',', NUL, then the tensor's bytes. Independent of how the tensors are
    split into shards or ordered in a file."""
    tensors = []
    for file in os.listdir(folder):
        if not file.endswith(".safetensors"):
            continue
        with open(os.path.join(folder, file), "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
            data_start = 8 + n
        for name, entry in header.items():
            if name != "__metadata__":
                tensors.append((name, entry, os.path.join(folder, file), data_start))
    h = hashlib.sha256()
    for name, entry, path, data_start in sorted(tensors, key=lambda t: t[0].encode()):
        h.update(name.encode() + b"\0" + entry["dtype"].encode() + b"\0")
        h.update(",".join(str(d) for d in entry["shape"]).encode() + b"\0")
        begin, end = entry["data_offsets"]
        with open(path, "rb") as f:
            f.seek(data_start + begin)
            h.update(f.read(end - begin))
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gptoss", required=True)
    ap.add_argument("--out", default=os.path.join(HERE, "fixtures"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--only", default=None)
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import GptOssForCausalLM, Mxfp4Config

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    os.makedirs(args.out, exist_ok=True)

    for name, make_args, seed, lengths in CASES:
        if args.only and name != args.only:
            continue
        with tempfile.TemporaryDirectory() as folder:
            cmd = [args.gptoss, "make-model", *make_args, "-o", folder, "--seed", str(seed), "--no-tokenizer"]
            subprocess.run(cmd, check=True)
            config = json.load(open(os.path.join(folder, "config.json")))
            vocab = config["vocab_size"]
            model = GptOssForCausalLM.from_pretrained(
                folder,
                quantization_config=Mxfp4Config(dequantize=True),
                torch_dtype=torch.float32,
                attn_implementation="eager",
                device_map=args.device,
            )
            # transformers leaves the dequantized experts in bf16 and its grouped-matmul expert
            # path casts activations to the weights' dtype, which would put bf16 rounding into
            # the reference. The dequantized values are exact in float32, so widen them.
            model = model.to(torch.float32)
            bad = [n for n, p in model.named_parameters() if p.dtype != torch.float32]
            assert not bad, "parameters not in float32: %s" % bad[:4]
            model.eval()
            rng = random.Random(seed)
            probes = sorted(rng.sample(range(vocab), N_PROBES))
            prompts = []
            for length in lengths:
                ids = [rng.randrange(vocab) for _ in range(length)]
                with torch.no_grad():
                    out = model(torch.tensor([ids], device=args.device), use_cache=False)
                logits = out.logits[0].to(torch.float64).cpu()
                assert torch.isfinite(logits).all(), "non-finite logits"
                top = torch.topk(logits, TOP_K, dim=-1)
                prompts.append({
                    "ids": ids,
                    "top_ids": top.indices.tolist(),
                    "top_logits": [[float("%.7g" % v) for v in row] for row in top.values.tolist()],
                    "probe_logits": [[float("%.7g" % v) for v in row] for row in logits[:, probes].tolist()],
                })
            fixture = {
                "format": "gptoss-golden/1",
                "case": name,
                "make_model_args": make_args_relative(make_args),
                "seed": seed,
                "checkpoint_sha256": checkpoint_sha256(folder),
                "generator": "transformers %s, torch %s, device %s, float32, eager attention, Mxfp4Config(dequantize=True)"
                % (transformers.__version__, torch.__version__, args.device),
                "top_k": TOP_K,
                "probe_ids": probes,
                "prompts": prompts,
            }
            path = os.path.join(args.out, name + ".json")
            with open(path, "w") as f:
                json.dump(fixture, f, separators=(",", ":"))
            print("wrote", path, "max|logit| %.3f" % max(abs(v) for p in prompts for r in p["top_logits"] for v in r))
            del model


def make_args_relative(make_args):
    out = []
    for a in make_args:
        out.append(os.path.relpath(a, HERE) if os.path.isabs(a) else a)
    return out


if __name__ == "__main__":
    sys.exit(main())
