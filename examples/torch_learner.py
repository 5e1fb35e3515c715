#!/usr/bin/env python3
"""A plain PyTorch training loop that joins an `atoll syncer` as one more learner.

The syncer holds atoll's GPT (the run file's [model] preset), so this learner trains the same
architecture, written here in PyTorch with the same parameter names, shapes and order as
src/model/gpt.cc (rotary attention, RMSNorm, SwiGLU MLP, tied embedding). Start it next to C++
learners of the same run:

    atoll syncer -c run.toml --listen 127.0.0.1:7070 --out runs/r   # writes runs/r/config.json
    atoll learner -c runs/r/config.json --id 0 --syncer 127.0.0.1:7070
    PYTHONPATH=build/python /usr/bin/python3 examples/torch_learner.py \
        --run runs/r --syncer 127.0.0.1:7070 --id 1

The run folder's config.json gives everything the learner must agree on with the syncer (run id,
token, model preset, data folder, batch, fragments, H, tau, mode, plan, steps, learning rate).
Only the loop below is PyTorch; `atoll.Learner` does the exchange (docs/python.md).
"""
import argparse
import glob
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

import atoll

PRESETS = {"tiny": (128, 4, 4, 344), "small": (256, 5, 8, 688), "base": (512, 6, 8, 1280)}  # d, layers, heads, ffn


class RmsNorm(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.weight


class Attention(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.wqkv = torch.nn.Linear(d, 3 * d, bias=False)
        self.wo = torch.nn.Linear(d, d, bias=False)


class Mlp(torch.nn.Module):
    def __init__(self, d, ffn):
        super().__init__()
        self.w_in = torch.nn.Linear(d, 2 * ffn, bias=False)
        self.w_out = torch.nn.Linear(ffn, d, bias=False)


class Block(torch.nn.Module):
    def __init__(self, d, ffn):
        super().__init__()
        self.attn_norm = RmsNorm(d)
        self.attn = Attention(d)
        self.mlp_norm = RmsNorm(d)
        self.mlp = Mlp(d, ffn)


class Gpt(torch.nn.Module):
    """atoll's GPT: the parameter list of src/model/gpt.cc, in its order."""

    def __init__(self, vocab, d, layers, heads, ffn, seq):
        super().__init__()
        self.tok_emb = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.ModuleList(Block(d, ffn) for _ in range(layers))
        self.final_norm = RmsNorm(d)
        self.heads = heads
        hd = d // heads
        inv_freq = torch.pow(10000.0, -torch.arange(0, hd, 2, dtype=torch.float32) / hd)
        angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)  # [T, hd/2]
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def rope(self, x, t):  # x [B,H,T,hd]: rotate the pairs (first half, second half)
        half = x.size(-1) // 2
        cos, sin = self.cos[:t], self.sin[:t]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)

    def forward(self, idx):
        B, T = idx.shape
        x = self.tok_emb(idx)
        D = x.size(-1)
        H, hd = self.heads, D // self.heads
        mask = torch.full((T, T), float("-inf")).triu(1)
        for b in self.blocks:
            qkv = b.attn.wqkv(b.attn_norm(x)).view(B, T, 3, H, hd).permute(2, 0, 3, 1, 4)
            q, k, v = self.rope(qkv[0], T) / math.sqrt(hd), self.rope(qkv[1], T), qkv[2]
            att = torch.softmax(q @ k.transpose(-2, -1) + mask, -1)
            x = x + b.attn.wo((att @ v).transpose(1, 2).reshape(B, T, D))
            gate, up = b.mlp.w_in(b.mlp_norm(x)).chunk(2, -1)
            x = x + b.mlp.w_out(F.silu(gate) * up)
        return F.linear(self.final_norm(x), self.tok_emb.weight)


def read_tokens(data_dir):
    """The training stream: every train shard (shard.h: 32-byte header, uint16 tokens)."""
    parts = []
    for path in sorted(glob.glob(os.path.join(data_dir, "train_*.bin"))):
        raw = np.fromfile(path, dtype=np.uint8)
        if raw[:4].tobytes() != b"ATOK":
            sys.exit("%s is not an atoll token shard" % path)
        count = int(raw[16:24].view(np.uint64)[0])
        parts.append(raw[32:32 + 2 * count].view(np.uint16))
    if not parts:
        sys.exit("no train_*.bin in %s (atoll data prepare)" % data_dir)
    return np.concatenate(parts).astype(np.int64)


def batches(stream, seq, batch, shard, shards, seed):
    """This learner's windows (j mod shards == shard), a fresh permutation every epoch."""
    windows = np.arange(shard, (len(stream) - 1) // seq, shards) * seq
    rng = np.random.default_rng([seed, shard])
    while True:
        order = rng.permutation(windows)
        for i in range(0, len(order) - batch + 1, batch):
            rows = np.stack([stream[s:s + seq + 1] for s in order[i:i + batch]])
            yield torch.from_numpy(rows[:, :-1]), torch.from_numpy(rows[:, 1:])


def lr_at(step, c):  # linear warm-up, cosine to 0.1·lr at the last step (model/trainer.h)
    if step < c["warmup"]:
        return c["lr"] * (step + 1) / c["warmup"]
    frac = min(1.0, (step - c["warmup"]) / max(1, c["steps"] - c["warmup"]))
    return c["lr"] * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--run", required=True, help="the syncer's run folder (its config.json)")
    ap.add_argument("--syncer", required=True, help="host:port")
    ap.add_argument("--id", type=int, required=True, help="learner id, 0..learners-1")
    ap.add_argument("--steps", type=int, help="inner steps (default: the run's)")
    ap.add_argument("--summary", help="write a JSON summary here at the end")
    ap.add_argument("--state", help="state folder: a restarted learner rejoins as itself, with deltas")
    a = ap.parse_args()
    with open(os.path.join(a.run, "config.json")) as f:
        c = json.load(f)
    steps = a.steps or c["steps"]
    torch.manual_seed(c["seed"])
    torch.set_num_threads(max(1, c.get("threads", 1)))
    with open(os.path.join(c["data"], "data.json")) as f:
        vocab = json.load(f)["vocab_size"]
    d, layers, heads, ffn = PRESETS[c["preset"]]
    model = Gpt(vocab, d, layers, heads, ffn, c["seq"])
    batch = c["batches"][a.id] if c.get("batches") else c["batch"]
    decay = [p for n, p in model.named_parameters() if not n.endswith("norm.weight")]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("norm.weight")]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=c["lr"], betas=(0.9, 0.95))
    learner = atoll.Learner(a.syncer, model.named_parameters(), run_id=c["run_id"], learner_id=a.id,
                            embeddings=["tok_emb.weight"], token=c.get("token") or None, mode=c["mode"],
                            plan=c["plan"], fragments=c["fragments"], H=c["H"], tau=c["tau"],
                            alpha=c["alpha"], keep_progress=c["keep_progress"], state_dir=a.state)
    data = batches(read_tokens(c["data"]), c["seq"], batch, a.id, c["learners"], c["seed"])
    losses = []
    for step in range(steps):
        if learner.finish_requested:
            break
        x, y = next(data)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, dict(c, steps=steps))
        loss = F.cross_entropy(model(x).view(-1, vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        learner.step(tokens=x.numel(), loss=loss.item())
        losses.append(loss.item())
        if (step + 1) % 25 == 0:
            print("torch learner %d: step %d/%d loss %.4f" % (a.id, step + 1, steps, loss.item()), flush=True)
    counters = learner.counters()
    learner.close()
    print("torch learner %d: done, %d steps, %d pushes, %d fragments applied"
          % (a.id, len(losses), counters["pushes"], counters["fragments_applied"]), flush=True)
    if a.summary:
        with open(a.summary, "w") as f:
            json.dump({"steps": len(losses), "losses": losses, "counters": counters,
                       "shared": all(learner.shared.values())}, f)


if __name__ == "__main__":
    main()
