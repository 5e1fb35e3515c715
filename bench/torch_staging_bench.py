#!/usr/bin/env python3
"""Whole-model staging against fragment staging, side by side in one run.

Two learners of one `atoll syncer --spec` (a model of TENSORS equal bf16 tensors) train the same
way, step after step in turn:
  whole     what the atoll package did before fragment staging: a float32 host copy of the whole
            model shared with atoll, copied from the bf16 parameters before every step and back
            after every step that applied a merge;
  fragments the package now: bf16 parameters staged by fragment — the fragments due to be sent,
            before their step, and the merges applied, after it.
It prints the device<->host bytes per step of each (the package's counters for `fragments`, the
copies it makes for `whole`), the seconds per step spent in copies + learner.step(), and their
ratios. On a CPU the "device" is the bf16 tensors in host memory, so the seconds measure the
conversions, not a bus.

    PYTHONPATH=build/python /usr/bin/python3 bench/torch_staging_bench.py --atoll build/atoll
"""
import argparse
import os
import shutil
import signal
import subprocess
import tempfile
import time

import numpy as np
import torch

import atoll


def start_syncer(atoll_bin, folder, spec, P, H, tau):
    port_file = os.path.join(folder, "port")
    log = open(os.path.join(folder, "syncer.log"), "w")
    proc = subprocess.Popen([atoll_bin, "syncer", "--spec", spec, "--out", os.path.join(folder, "run"), "-M", "2",
                             "-P", str(P), "-H", str(H), "--tau", str(tau), "--port-file", port_file,
                             "--token", "tok", "--run-id", "bench", "--checkpoint-every", "0"],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while not os.path.exists(port_file):
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit("the syncer did not start; see %s/syncer.log" % folder)
        time.sleep(0.05)
    with open(port_file) as f:
        return proc, log, "127.0.0.1:" + f.read().strip()


def descend(params):
    with torch.no_grad():
        for t in params.values():
            t.sub_(0.01 * (t - 1.0))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--atoll", default="build/atoll")
    ap.add_argument("--tensors", type=int, default=24)
    ap.add_argument("--rows", type=int, default=512, help="each tensor is rows x 512")
    ap.add_argument("--steps", type=int, default=96)
    ap.add_argument("--step-ms", type=float, default=20.0, help="simulated compute per step")
    a = ap.parse_args()
    P = H = a.tensors
    folder = tempfile.mkdtemp(prefix="atoll_staging_bench_")
    spec = os.path.join(folder, "model.safetensors")
    rng = np.random.default_rng(0)
    values = {"w%02d" % i: rng.normal(0, 0.5, (a.rows, 512)).astype(np.float32) for i in range(a.tensors)}
    atoll.write_spec(values, spec)
    proc, log, target = start_syncer(a.atoll, folder, spec, P, H, 2)
    try:
        opts = dict(run_id="bench", token="tok", fragments=P, H=H, tau=2)
        whole_params = {n: torch.from_numpy(v).to(torch.bfloat16) for n, v in values.items()}
        frag_params = {n: t.clone() for n, t in whole_params.items()}
        host = {n: t.float().numpy().copy() for n, t in whole_params.items()}  # the old staging buffers
        model_bytes = sum(t.numel() * t.element_size() for t in whole_params.values())
        whole = atoll.Learner(target, host, learner_id=0, **opts)
        for n, t in whole_params.items():
            t.copy_(torch.from_numpy(host[n]))
        frag = atoll.Learner(target, frag_params, learner_id=1, low_precision="round", **opts)
        k0 = frag.counters()
        whole_bytes, whole_s, frag_s = run_steps(a, whole, whole_params, host, frag, frag_params, model_bytes)
        report(a, whole, frag, k0, whole_bytes, whole_s, frag_s, model_bytes, P, H)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


def run_steps(a, whole, whole_params, host, frag, frag_params, model_bytes):
    """The two learners' steps in turn; returns the whole-model bytes and both learners' seconds."""
    whole_bytes, whole_s, frag_s = 0, 0.0, 0.0
    for _ in range(a.steps):
        descend(whole_params)
        descend(frag_params)
        time.sleep(a.step_ms / 1000)
        t0 = time.perf_counter()
        for n, t in whole_params.items():  # before every step: the whole model to the host
            host[n][...] = t.float().numpy()
        applied = whole.step(tokens=4096, loss=1.0)
        whole_bytes += model_bytes
        if applied:  # after a step that applied merges: the whole model back
            for n, t in whole_params.items():
                t.copy_(torch.from_numpy(host[n]))
            whole_bytes += model_bytes
        t1 = time.perf_counter()
        frag.step(tokens=4096, loss=1.0)
        t2 = time.perf_counter()
        whole_s += t1 - t0
        frag_s += t2 - t1
    return whole_bytes, whole_s, frag_s


def report(a, whole, frag, k0, whole_bytes, whole_s, frag_s, model_bytes, P, H):
    k1 = frag.counters()
    frag_bytes = (k1["bytes_to_host"] - k0["bytes_to_host"]) + (k1["bytes_to_device"] - k0["bytes_to_device"])
    applied_whole = whole.counters()["fragments_applied"]
    applied_frag = k1["fragments_applied"] - k0["fragments_applied"]
    whole.close(0)
    frag.close(0)
    n = a.steps
    print("model: %d bf16 parameters (%.1f MB), P = H = %d, tau 2, %d steps of %.0f ms compute"
          % (model_bytes // 2, model_bytes / 1e6, P, n, a.step_ms))
    print("fragments applied: whole %d, fragments %d" % (applied_whole, applied_frag))
    print("device<->host bytes per step: whole %.0f, fragments %.0f (%.1fx less; bound (1/H + applied/P) x "
          "model = %.0f)" % (whole_bytes / n, frag_bytes / n, whole_bytes / max(1, frag_bytes),
                             (1.0 / H + applied_frag / n / P) * model_bytes))
    print("ms per step in copies + learner.step(): whole %.2f, fragments %.2f (%.1fx)"
          % (1e3 * whole_s / n, 1e3 * frag_s / n, whole_s / max(frag_s, 1e-9)))


if __name__ == "__main__":
    main()
