#!/usr/bin/env python3
"""PyTorch reference of an EAGLE3 draft head, checked against what gptoss computed.

Written from the published EAGLE3 design (docs/speculative.md), independently of gptoss's C
code. It loads a head folder in the Hugging Face layout (config.json + *.safetensors), reads
the rows gptoss dumped with GPTOSS_EAGLE3_DUMP=DIR (each row: position, the token after it,
the start of the head's cache, the target's three hidden states and the head's logits over
the draft vocabulary), runs the head itself in float64 with its own KV cache, and compares.

    mkdir dump
    GPTOSS_EAGLE3_DUMP=dump gptoss run -m TARGET --draft eagle3 --draft-model HEAD -p "..."
    python3 scripts/eagle3-reference.py HEAD dump --target TARGET

--target is needed when the head has no embed_tokens.weight (published gpt-oss heads read the
target's embedding). Exit status 0 when every row's logits agree within --tolerance (relative
to the largest logit) and the argmax agrees wherever the top two logits are apart.

Needs torch (no other package); CI does not run it.
"""

import argparse
import json
import os
import struct
import sys

import torch

DTYPES = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "I64": torch.int64,
    "I32": torch.int32,
    "BOOL": torch.bool,
    "U8": torch.uint8,
}


def read_safetensors(path, wanted=None):
    """The tensors of one file (only `wanted` names when given), as torch tensors."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        out = {}
        for name, info in header.items():
            if name == "__metadata__" or (wanted is not None and name not in wanted):
                continue
            begin, end = info["data_offsets"]
            f.seek(base + begin)
            raw = bytearray(f.read(end - begin))
            t = torch.frombuffer(raw, dtype=DTYPES[info["dtype"]]) if raw else torch.empty(0)
            out[name] = t.reshape(info["shape"]).clone()
        return out


def read_folder(folder, wanted=None):
    tensors = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".safetensors"):
            tensors.update(read_safetensors(os.path.join(folder, name), wanted))
    return tensors


def tensor(tensors, name):
    """midlayer.* may also be spelled layers.0.*; others may carry a model. prefix."""
    candidates = [name]
    if name.startswith("midlayer."):
        candidates.append("layers.0." + name[len("midlayer."):])
    else:
        candidates.append("model." + name)
    for c in candidates:
        if c in tensors:
            return tensors[c]
    raise SystemExit(f"tensor {name} is missing from the head")


class Head:
    def __init__(self, folder, target_folder):
        with open(os.path.join(folder, "config.json")) as f:
            cfg = json.load(f)
        self.H = cfg["hidden_size"]
        self.NH = cfg["num_attention_heads"]
        self.NKV = cfg.get("num_key_value_heads", self.NH)
        self.D = cfg.get("head_dim", self.H // self.NH)
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        theta = cfg.get("rope_theta", 10000.0)
        if cfg.get("rope_scaling"):
            raise SystemExit("rope_scaling heads are outside this reference (and gptoss)")
        t = read_folder(folder)
        d = torch.float64
        self.fc = tensor(t, "fc.weight").to(d)
        self.input_norm = tensor(t, "midlayer.input_layernorm.weight").to(d)
        self.hidden_norm = tensor(t, "midlayer.hidden_norm.weight").to(d)
        self.q = tensor(t, "midlayer.self_attn.q_proj.weight").to(d)
        self.k = tensor(t, "midlayer.self_attn.k_proj.weight").to(d)
        self.v = tensor(t, "midlayer.self_attn.v_proj.weight").to(d)
        self.o = tensor(t, "midlayer.self_attn.o_proj.weight").to(d)
        self.post_norm = tensor(t, "midlayer.post_attention_layernorm.weight").to(d)
        self.gate = tensor(t, "midlayer.mlp.gate_proj.weight").to(d)
        self.up = tensor(t, "midlayer.mlp.up_proj.weight").to(d)
        self.down = tensor(t, "midlayer.mlp.down_proj.weight").to(d)
        self.norm = tensor(t, "norm.weight").to(d)
        self.lm_head = tensor(t, "lm_head.weight").to(d)
        self.d2t = tensor(t, "d2t").to(torch.int64)
        embed = t.get("embed_tokens.weight", t.get("model.embed_tokens.weight"))
        if embed is None:
            if not target_folder:
                raise SystemExit("the head has no embed_tokens.weight: pass --target TARGET")
            name = "model.embed_tokens.weight"
            embed = read_folder(target_folder, {name}).get(name)
            if embed is None:
                raise SystemExit(f"{target_folder} has no {name}")
        self.embed = embed  # kept in its own dtype; rows are widened when used
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.D, 2, dtype=d) / self.D))
        self.reset(0)

    def reset(self, start):
        self.start = start
        self.keys = []
        self.values = []

    def rms(self, x, g):
        return g * (x / torch.sqrt((x * x).mean() + self.eps))

    def rope(self, x, pos):
        """Rotate-half RoPE of x [heads, D] at position pos."""
        angle = pos * self.inv_freq
        cos = torch.cat([angle.cos(), angle.cos()])
        sin = torch.cat([angle.sin(), angle.sin()])
        half = self.D // 2
        rotated = torch.cat([-x[:, half:], x[:, :half]], dim=-1)
        return x * cos + rotated * sin

    def step(self, pos, token, aux=None, hidden=None):
        """The head at `pos`: its own state (for chaining) and logits over the draft vocab."""
        if aux is not None:
            hidden = self.fc @ aux  # the three target states, concatenated low..high
        e = self.embed[token].to(torch.float64)
        x = torch.cat([self.rms(e, self.input_norm), self.rms(hidden, self.hidden_norm)])
        q = self.rope((self.q @ x).reshape(self.NH, self.D), pos)
        k = self.rope((self.k @ x).reshape(self.NKV, self.D), pos)
        v = (self.v @ x).reshape(self.NKV, self.D)
        self.keys.append(k)
        self.values.append(v)
        K = torch.stack(self.keys)  # [n, NKV, D]
        V = torch.stack(self.values)
        group = self.NH // self.NKV
        out = []
        for h in range(self.NH):
            g = h // group
            scores = (K[:, g, :] @ q[h]) / (self.D ** 0.5)
            p = torch.softmax(scores, dim=0)
            out.append(p @ V[:, g, :])
        h = self.o @ torch.cat(out) + hidden  # residual: the fc output
        t = self.rms(h, self.post_norm)
        mlp = self.down @ (torch.nn.functional.silu(self.gate @ t) * (self.up @ t))
        prenorm = h + mlp  # fed back as the hidden state of the next draft step
        logits = self.lm_head @ self.rms(prenorm, self.norm)
        return prenorm, logits


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("head", help="the EAGLE3 head folder")
    ap.add_argument("dump", help="the GPTOSS_EAGLE3_DUMP folder")
    ap.add_argument("--target", help="the target model folder (for its embedding)")
    ap.add_argument("--tolerance", type=float, default=1e-3,
                    help="largest |logit difference| / largest |logit| (default 1e-3)")
    args = ap.parse_args()

    head = Head(args.head, args.target)
    with open(os.path.join(args.dump, "eagle3_dump.json")) as f:
        meta = json.load(f)
    H, DV = meta["hidden_size"], meta["draft_vocab_size"]
    if H != head.H or DV != head.lm_head.shape[0]:
        raise SystemExit(f"the dump is of another head (hidden {H}, draft vocabulary {DV})")
    record = 12 + 4 * 3 * H + 4 * DV
    with open(os.path.join(args.dump, "eagle3_dump.bin"), "rb") as f:
        data = f.read()
    n_rows = len(data) // record
    worst, argmax_misses, compared = 0.0, 0, 0
    for i in range(n_rows):
        chunk = data[i * record:(i + 1) * record]
        pos, token, start = struct.unpack("<3i", chunk[:12])
        aux = torch.frombuffer(bytearray(chunk[12:12 + 12 * H]), dtype=torch.float32)
        got = torch.frombuffer(bytearray(chunk[12 + 12 * H:]), dtype=torch.float32)
        # gptoss's cache starts where the target's states start and rolls back with them.
        if start != head.start or pos < start:
            head.reset(start)
        del head.keys[pos - head.start:]
        del head.values[pos - head.start:]
        if pos != head.start + len(head.keys):
            raise SystemExit(f"row {i}: position {pos} leaves a gap in the cache")
        _, want = head.step(pos, token, aux=aux.to(torch.float64))
        scale = max(1.0, want.abs().max().item())
        err = (got.to(torch.float64) - want).abs().max().item() / scale
        worst = max(worst, err)
        top2 = torch.topk(want, 2).values
        if (top2[0] - top2[1]).item() > 10 * args.tolerance * scale:
            compared += 1
            if int(got.argmax()) != int(want.argmax()):
                argmax_misses += 1
    draft = head.d2t + torch.arange(head.d2t.shape[0])
    print(f"{n_rows} rows; worst relative logit error {worst:.3g}; argmax differs in "
          f"{argmax_misses} of {compared} rows with a clear winner; draft ids map to target "
          f"ids {int(draft.min())}..{int(draft.max())}")
    ok = n_rows > 0 and worst <= args.tolerance and argmax_misses == 0
    print("OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
