"""A learner for unit_test.py: a small MLP regression in PyTorch, started from a model spec, in
synchronous DiLoCo. Under torchrun (WORLD_SIZE > 1) it is a DDP job over Gloo that joins as one
learner (atoll.Learner(process_group=...)): rank r trains on rows [s·R·B + r·B, s·R·B + (r+1)·B)
of step s. With --micro M it is one process that takes the same M·B rows as M micro-batches,
accumulating their gradients and dividing by M — the arithmetic of DDP's all-reduce. Writes its
counters and a checksum of its parameters per rank to OUT.rank<r>.json. --device cuda puts the
model on the rank's GPU (the unit then uses NCCL; tests/python/gpu_check.py).

    unit_learner.py spec OUT.safetensors                          (writes the spec)
    unit_learner.py train TARGET SPEC OUT --id ID --steps N --batch B --seed S [--micro M]
"""
import argparse
import hashlib
import json
import os

import torch
import torch.distributed as dist

import atoll

DIM_IN, HIDDEN, DIM_OUT = 8, 16, 4


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(DIM_IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, DIM_OUT))


def data(seed, rows):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, DIM_IN, generator=g)
    w = torch.randn(DIM_IN, DIM_OUT, generator=torch.Generator().manual_seed(1234))
    return x, torch.sin(x @ w)


def checksum(model):
    h = hashlib.sha256()
    for _, p in model.named_parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def train(a):
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = 0
    cuda = a.device == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1:
        dist.init_process_group("nccl" if cuda else "gloo")
        rank = dist.get_rank()
    model = make_model()
    values, _ = atoll.read_spec(a.spec)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(torch.from_numpy(values[n]))
    model = model.to(device)
    wrapped = (torch.nn.parallel.DistributedDataParallel(model, device_ids=[device] if cuda else None)
               if world > 1 else model)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, foreach=False)
    learner = atoll.Learner(a.target, model.named_parameters(), run_id="r", token="tok", learner_id=a.id,
                            mode="diloco", fragments=2, H=4, tau=1,
                            process_group=dist.group.WORLD if world > 1 else None)
    group = world if world > 1 else a.micro  # rows of one learner step = group · batch
    x, y = (t.to(device) for t in data(a.seed, a.steps * group * a.batch))
    for s in range(a.steps):
        opt.zero_grad(set_to_none=True)
        if world > 1:
            lo = (s * group + rank) * a.batch
            loss = torch.nn.functional.mse_loss(wrapped(x[lo:lo + a.batch]), y[lo:lo + a.batch])
            loss.backward()  # DDP: the gradients averaged over the ranks
        else:
            for m in range(a.micro):
                lo = (s * group + m) * a.batch
                loss = torch.nn.functional.mse_loss(model(x[lo:lo + a.batch]), y[lo:lo + a.batch])
                loss.backward()
            if a.micro > 1:
                for p in model.parameters():
                    p.grad.div_(a.micro)
        opt.step()
        learner.step(tokens=a.batch * (1 if world > 1 else a.micro), loss=loss.item())
    counters = learner.counters()
    learner.close()
    with open("%s.rank%d.json" % (a.out, rank), "w") as f:
        json.dump({"checksum": checksum(model), "counters": counters}, f)
    if world > 1:
        # Gloo's worker threads torn down at interpreter exit abort the process now and then
        # ("terminate called without an active exception"): the group goes first, on every rank.
        dist.barrier()
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("spec")
    s.add_argument("out")
    t = sub.add_parser("train")
    for name in ("target", "spec", "out"):
        t.add_argument(name)
    for name in ("--id", "--steps", "--batch", "--seed"):
        t.add_argument(name, type=int, required=True)
    t.add_argument("--micro", type=int, default=1)
    t.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    a = ap.parse_args()
    if a.cmd == "spec":
        atoll.write_spec(make_model(), a.out)
    else:
        train(a)


if __name__ == "__main__":
    main()
