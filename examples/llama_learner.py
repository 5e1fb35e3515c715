#!/usr/bin/env python3
"""A PyTorch model that is not atoll's, trained as learners of one atoll run.

The model is Llama-shaped — RMSNorm, rotary positions, separate q/k/v/o projections, a SwiGLU
MLP and an untied output head — with Hugging Face-style names (model.embed_tokens.weight,
model.layers.<i>.self_attn.q_proj.weight, ..., lm_head.weight). atoll's syncer does not know it:
it is started from the model's spec, a safetensors file of its initial weights that this script
writes. Three commands (docs/python.md walks through them):

    python3 examples/llama_learner.py spec --out llama.safetensors --vocab 256
    atoll syncer --spec llama.safetensors -M 2 --data data --listen 0.0.0.0:7070 --out runs/r --token T
    python3 examples/llama_learner.py train --run runs/r --syncer HOST:7070 --id 0     # a region
    torchrun --nproc_per_node 8 examples/llama_learner.py train --run runs/r --syncer HOST:7070 --id 1
    python3 examples/llama_learner.py eval --weights runs/r/global.safetensors --data data

`train` reads what it must agree on from the run folder's config.json (run id, token, spec, data,
batch, seq, schedule, steps, learning rate). Under torchrun the job is one learner (DDP; NCCL on
GPUs, Gloo on CPUs): rank 0 talks to the syncer, the ranks share the applied fragments.
`--precision bf16` trains a bf16 model whose fp32 master weights the optimizer keeps: atoll
merges into the master copies and refreshes the bf16 model from them. `eval` prints the mean
token cross-entropy of a safetensors file of this model (the spec, or the exported global model)
on the first batches of the data folder's validation windows.
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

EMBEDDINGS = ["model.embed_tokens.weight"]  # merged by weighted mean (the spec says so too)


class RmsNorm(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(d))

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * self.weight


class Attention(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (torch.nn.Linear(d, d, bias=False) for _ in range(4))


class Mlp(torch.nn.Module):
    def __init__(self, d, ffn):
        super().__init__()
        self.gate_proj = torch.nn.Linear(d, ffn, bias=False)
        self.up_proj = torch.nn.Linear(d, ffn, bias=False)
        self.down_proj = torch.nn.Linear(ffn, d, bias=False)


class Layer(torch.nn.Module):
    def __init__(self, d, ffn):
        super().__init__()
        self.input_layernorm = RmsNorm(d)
        self.self_attn = Attention(d)
        self.post_attention_layernorm = RmsNorm(d)
        self.mlp = Mlp(d, ffn)


class Body(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(c["vocab"], c["d"])
        self.layers = torch.nn.ModuleList(Layer(c["d"], c["ffn"]) for _ in range(c["layers"]))
        self.norm = RmsNorm(c["d"])


class Llama(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.model = Body(c)
        self.lm_head = torch.nn.Linear(c["d"], c["vocab"], bias=False)  # untied
        hd = c["d"] // c["heads"]
        inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        angles = torch.outer(torch.arange(c["seq"], dtype=torch.float32), inv)
        self.register_buffer("cos", torch.cat([angles.cos()] * 2, -1), persistent=False)
        self.register_buffer("sin", torch.cat([angles.sin()] * 2, -1), persistent=False)

    def rotate(self, x, t):  # rotary positions, rotate-half form; x [B, H, T, hd]
        half = x.size(-1) // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
        return x * self.cos[:t].to(x.dtype) + rotated * self.sin[:t].to(x.dtype)

    def forward(self, idx):
        B, T = idx.shape
        h, nh = self.model.embed_tokens(idx), self.c["heads"]
        hd = h.size(-1) // nh
        mask = torch.full((T, T), float("-inf"), device=idx.device).triu(1)
        for layer in self.model.layers:
            a, x = layer.self_attn, layer.input_layernorm(h)
            q, k, v = (p(x).view(B, T, nh, hd).transpose(1, 2) for p in (a.q_proj, a.k_proj, a.v_proj))
            q, k = self.rotate(q, T), self.rotate(k, T)
            att = torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(hd) + mask.to(q.dtype), -1)
            h = h + a.o_proj((att @ v).transpose(1, 2).reshape(B, T, -1))
            m, x = layer.mlp, layer.post_attention_layernorm(h)
            h = h + m.down_proj(F.silu(m.gate_proj(x)) * m.up_proj(x))
        return self.lm_head(self.model.norm(h))


def init_weights(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.fill_(1.0)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)


def load_model(path):
    """The model of a spec (or of a global model written from it) with its weights."""
    values, meta = atoll.read_spec(path)
    if "example.config" not in meta:
        sys.exit("%s was not written by this example (no example.config metadata)" % path)
    model = Llama(json.loads(meta["example.config"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(values[name]))
    return model


def read_tokens(data_dir, pattern):
    """Token shards (32-byte header, uint16 tokens) as one stream."""
    parts = []
    for path in sorted(glob.glob(os.path.join(data_dir, pattern))):
        raw = np.fromfile(path, dtype=np.uint8)
        if raw[:4].tobytes() != b"ATOK":
            sys.exit("%s is not an atoll token shard" % path)
        count = int(raw[16:24].view(np.uint64)[0])
        parts.append(raw[32:32 + 2 * count].view(np.uint16))
    if not parts:
        sys.exit("no %s in %s (atoll data prepare)" % (pattern, data_dir))
    return np.concatenate(parts).astype(np.int64)


def batches(stream, seq, batch, shard, shards, seed):
    windows = np.arange(shard, (len(stream) - 1) // seq, shards) * seq
    rng = np.random.default_rng([seed, shard])
    while True:
        order = rng.permutation(windows)
        for i in range(0, len(order) - batch + 1, batch):
            rows = np.stack([stream[s:s + seq + 1] for s in order[i:i + batch]])
            yield torch.from_numpy(rows[:, :-1]), torch.from_numpy(rows[:, 1:])


def cmd_spec(a):
    c = dict(vocab=a.vocab, d=a.d, layers=a.layers, heads=a.heads, ffn=a.ffn, seq=a.seq)
    model = Llama(c)
    init_weights(model, a.seed)
    n = atoll.write_spec(model, a.out, embeddings=EMBEDDINGS, metadata={"example.config": json.dumps(c)})
    print("wrote %s: %d parameters, %d tensors" % (a.out, n, len(list(model.parameters()))))


def evaluate(model, data_dir, seq, batch, batches_n):
    stream = read_tokens(data_dir, "val.bin")
    starts = np.arange(0, (len(stream) - 1) // seq)[:batches_n * batch] * seq
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(starts) - batch + 1, batch):
            rows = torch.from_numpy(np.stack([stream[s:s + seq + 1] for s in starts[i:i + batch]]))
            logits = model(rows[:, :-1]).float()
            total += F.cross_entropy(logits.reshape(-1, logits.size(-1)), rows[:, 1:].reshape(-1), reduction="sum").item()
            count += rows[:, 1:].numel()
    return total / max(1, count)


def cmd_eval(a):
    model = load_model(a.weights)
    loss = evaluate(model, a.data, a.seq or model.c["seq"], a.batch, a.batches)
    print(json.dumps({"weights": a.weights, "eval_loss": loss}) if a.json else "eval loss %.4f (%s)" % (loss, a.weights))


def model_and_master(spec, device, precision):
    """The model on `device`; in bf16 also the fp32 master weights the optimizer keeps."""
    model = load_model(spec).to(device)
    if precision != "bf16":
        return model, None
    master = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    return model.to(torch.bfloat16), master


def cmd_train(a):
    with open(os.path.join(a.run, "config.json")) as f:
        c = json.load(f)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    cuda = a.device == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    group = None
    if world > 1:
        if cuda:
            torch.cuda.set_device(device)
        torch.distributed.init_process_group("nccl" if cuda else "gloo")
        group = torch.distributed.group.WORLD
    torch.set_num_threads(max(1, c.get("threads", 1)))
    model, master = model_and_master(a.spec or c["spec"], device, a.precision)
    trained = master if master is not None else dict(model.named_parameters())
    opt = torch.optim.AdamW(list(trained.values()), lr=c["lr"], betas=(0.9, 0.95), weight_decay=0.1)
    learner = atoll.Learner(
        a.syncer, trained, run_id=c["run_id"], learner_id=a.id, embeddings=EMBEDDINGS, token=c.get("token") or None,
        mode=c["mode"], plan=c["plan"], fragments=c["fragments"], H=c["H"], tau=c["tau"], alpha=c["alpha"],
        keep_progress=c["keep_progress"], state_dir=a.state, process_group=group,
        refresh=dict(model.named_parameters()) if master is not None else None)
    forward = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    steps = a.steps or c["steps"]
    data = batches(read_tokens(c["data"], "train_*.bin"), c["seq"], c["batch"], a.id * world + rank,
                   c["learners"] * world, c["seed"])
    losses = []
    for step in range(steps):
        if learner.finish_requested:
            break
        x, y = (t.to(device) for t in next(data))
        for g in opt.param_groups:
            g["lr"] = c["lr"] * min(1.0, (step + 1) / max(1, c.get("warmup", 1)))
        logits = forward(x).float()
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
        loss.backward()
        if master is not None:  # the bf16 gradients to the master copies, and the update back
            for n, p in model.named_parameters():
                master[n].grad = p.grad.float()
        torch.nn.utils.clip_grad_norm_(list(trained.values()), 1.0)
        opt.step()
        if master is not None:
            with torch.no_grad():
                for n, p in model.named_parameters():
                    p.copy_(master[n])
        learner.step(tokens=x.numel(), loss=loss.item())
        losses.append(loss.item())
        if rank == 0 and (step + 1) % 25 == 0:
            print("llama learner %d: step %d/%d loss %.4f" % (a.id, step + 1, steps, loss.item()), flush=True)
    counters = learner.counters()
    learner.close()
    if rank == 0:
        print("llama learner %d: done, %d steps, %d pushes, %d fragments applied"
              % (a.id, len(losses), counters.get("pushes", 0), counters.get("fragments_applied", 0)), flush=True)
        if a.summary:
            with open(a.summary, "w") as f:
                json.dump({"steps": len(losses), "losses": losses, "counters": counters, "precision": a.precision}, f)
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()  # before exit: Gloo's threads at exit can abort it


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("spec", help="write the model's spec (its initial weights)")
    s.add_argument("--out", required=True)
    for name, default in (("vocab", 256), ("d", 64), ("layers", 2), ("heads", 4), ("ffn", 172), ("seq", 64), ("seed", 0)):
        s.add_argument("--" + name, type=int, default=default)
    t = sub.add_parser("train", help="one learner (or, under torchrun, one unit) of a run")
    t.add_argument("--run", required=True, help="the syncer's run folder (its config.json)")
    t.add_argument("--syncer", required=True, help="host:port")
    t.add_argument("--id", type=int, required=True, help="learner id, 0..learners-1")
    t.add_argument("--spec", help="the spec file (default: the run's)")
    t.add_argument("--steps", type=int, help="inner steps (default: the run's)")
    t.add_argument("--state", help="state folder: a restarted learner rejoins as itself")
    t.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    t.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    t.add_argument("--summary", help="write a JSON summary here at the end")
    e = sub.add_parser("eval", help="the loss of a safetensors file of this model on validation windows")
    e.add_argument("--weights", required=True)
    e.add_argument("--data", required=True)
    e.add_argument("--seq", type=int)
    e.add_argument("--batch", type=int, default=8)
    e.add_argument("--batches", type=int, default=8)
    e.add_argument("--json", action="store_true")
    a = ap.parse_args()
    {"spec": cmd_spec, "train": cmd_train, "eval": cmd_eval}[a.cmd](a)


if __name__ == "__main__":
    main()
