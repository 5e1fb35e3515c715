"""A 2-rank torchrun job (DDP over Gloo, on this CPU) as one learner, beside another learner, in
synchronous DiLoCo with quorum 2: its ranks end bit-identical, and the run's global model is bit
for bit the global model of the same run in which the unit is one process with twice the batch
(two micro-batches, gradients accumulated and averaged: DDP's all-reduce arithmetic). Each run
has its own `atoll syncer --spec` (ATOLL_BIN) on 127.0.0.1 port 0, which finishes by itself once
both learners are done. Bounded: every process is waited for with a timeout and killed past it."""
import json
import os
import subprocess
import unittest

import numpy as np

import atoll
from atoll_testing import ProcessTestCase, PYTHON, Syncer, log_tail

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "unit_learner.py")
STEPS, BATCH = 12, 8
FLAGS = ["-M", "2", "--mode", "diloco", "-K", "2", "-P", "2", "-H", "4", "--tau", "1", "--finish-when-done"]


class UnitTest(ProcessTestCase):
    DEVICE = "cpu"  # tests/python/gpu_check.py runs this on "cuda" (NCCL)
    EXACT = True
    PREFIX = "atoll_unit_"

    def start(self, name, argv):
        log = open(os.path.join(self.dir, name + ".log"), "w")
        self.logs.append(log)
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.dir)
        self.procs.append((p))
        return p

    def train_argv(self, target, spec, out, learner_id, seed, micro=1):
        return ["train", target, spec, out, "--id", str(learner_id), "--steps", str(STEPS), "--batch", str(BATCH),
                "--seed", str(seed), "--micro", str(micro), "--device", self.DEVICE]

    def run_once(self, name, spec, unit):
        """One run: learner 0 is the 2-rank unit (or one process with 2 micro-batches), learner 1 a
        plain process. Returns (global model, {rank: report} of learner 0, learner table)."""
        folder = os.path.join(self.dir, name)
        os.makedirs(folder)
        syncer = Syncer(folder, spec, FLAGS)
        try:
            out0 = os.path.join(folder, "learner0")
            if unit:
                # --redirects/--tee 2: Debian's torch 1.13 under Python 3.11 cannot parse their default 0.
                argv = [PYTHON, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
                        "--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:0", "--redirects", "2", "--tee", "2",
                        "--log_dir", os.path.join(folder, "torchrun"), SCRIPT,
                        *self.train_argv(syncer.target, spec, out0, 0, 1)]
            else:
                argv = [PYTHON, SCRIPT, *self.train_argv(syncer.target, spec, out0, 0, 1, micro=2)]
            learners = [self.start(name + "-0", argv),
                        self.start(name + "-1", [PYTHON, SCRIPT, *self.train_argv(syncer.target, spec,
                                                                                   os.path.join(folder, "learner1"), 1, 2)])]
            for i, p in enumerate(learners):
                self.assertEqual(p.wait(timeout=240), 0, log_tail(os.path.join(self.dir, "%s-%d.log" % (name, i))))
            self.assertEqual(syncer.wait(timeout=120), 0, log_tail(syncer.log_path))
            model, _ = atoll.read_spec(os.path.join(syncer.out, "global.safetensors"))
            reports = {}
            for r in range(2 if unit else 1):
                with open("%s.rank%d.json" % (out0, r)) as f:
                    reports[r] = json.load(f)
            return model, reports, syncer.learner_rows()
        finally:
            syncer.kill()

    def test_a_two_rank_unit_is_one_learner_with_twice_the_batch(self):
        spec = os.path.join(self.dir, "mlp.safetensors")
        r = subprocess.run([PYTHON, SCRIPT, "spec", spec], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        unit_model, unit_reports, unit_rows = self.run_once("unit", spec, unit=True)
        one_model, one_reports, one_rows = self.run_once("one", spec, unit=False)
        self.assertEqual(unit_reports[0]["checksum"], unit_reports[1]["checksum"], "the unit's ranks differ")
        self.assertEqual(unit_reports[1]["counters"]["rank"], 1)
        self.assertGreater(unit_reports[0]["counters"]["fragments_applied"], 0)
        self.assertEqual(sorted(unit_model), sorted(one_model))
        start, _ = atoll.read_spec(spec)
        worst = 0.0
        for n in unit_model:
            self.assertFalse(np.array_equal(unit_model[n], start[n]), "%s: the global model moved" % n)
            worst = max(worst, float(np.abs(unit_model[n] - one_model[n]).max()))
        if self.EXACT:
            self.assertEqual(worst, 0.0, "the global models differ by up to %g" % worst)
            self.assertEqual(unit_reports[0]["checksum"], one_reports[0]["checksum"], "the learner's own models")
        else:  # GPU kernels need not sum in the same order for batch 8 and 2 x 8
            self.assertLess(worst, 1e-4, "the global models differ by up to %g" % worst)
        self.assertEqual(unit_rows[0]["tokens_merged"], one_rows[0]["tokens_merged"])
        self.assertGreater(unit_rows[1]["rounds_joined"], 0)
        print("global model after %d steps on %s: largest difference %g (unit of 2 ranks x batch %d, one process "
              "2 x %d); tokens merged of learner 0: %d" % (STEPS, self.DEVICE, worst, BATCH, BATCH,
                                                         unit_rows[0]["tokens_merged"]))


if __name__ == "__main__":
    unittest.main(verbosity=2)
