"""A Python learner process for resume_test.py: trains the spec's model (each value pulled towards
1.0) with an optional state folder, writes its counters right after the constructor (the join and
its catch-up) and at the end, and its step count after every step (so the test knows when to kill
it).

    resume_learner.py TARGET SPEC OUT_JSON --id ID --steps N [--state DIR] [--progress FILE] [--hold FILE]

--hold FILE: before each step, while FILE holds a number ≤ the steps done, wait (the heartbeats go
on): the test decides exactly how many steps this learner makes.
"""
import argparse
import json
import os
import time

import torch

import atoll


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def held(path, done):
    try:
        with open(path) as f:
            return int(f.read()) <= done
    except (OSError, ValueError):
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("target")
    ap.add_argument("spec")
    ap.add_argument("out")
    ap.add_argument("--id", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--state")
    ap.add_argument("--progress")
    ap.add_argument("--hold")
    a = ap.parse_args()
    values, _ = atoll.read_spec(a.spec)
    params = {n: torch.from_numpy(v.copy()) for n, v in values.items()}
    learner = atoll.Learner(a.target, params, run_id="r", token="tok", learner_id=a.id, fragments=4, H=4, tau=1,
                            state_dir=a.state)
    report = {"open": learner.counters(), "held": [f["version"] for f in learner.state_dict()["fragments"]]}
    write_json(a.out, report)
    for step in range(a.steps):
        while a.hold and held(a.hold, step):
            time.sleep(0.02)
        with torch.no_grad():
            for t in params.values():
                t.sub_(0.005 * (t - 1.0))  # slow enough that rounds move it by similar amounts
        time.sleep(0.01)
        learner.step(tokens=256, loss=1.0)
        if a.progress:
            write_json(a.progress, {"steps": step + 1})
    report["end"] = learner.counters()
    learner.close()
    write_json(a.out, report)


if __name__ == "__main__":
    main()
