"""Staged parameters against a real `atoll syncer --spec` (ATOLL_BIN) on 127.0.0.1: a bf16 model
moves only the fragments due to be sent and the fragments applied (measured by the package's
counters, against the bound (1/H + applied/P) x model bytes per step); a staged learner keeps the
model a shared learner has (receipts applied outside atoll, the device -> host hand-overs on the
copier thread); merges reach fp32 master weights and the bf16 model is refreshed from them. The
spec's 4 tensors are equal, so with P = 4 every fragment is exactly a quarter of the model."""
import os
import shutil
import tempfile
import threading
import time
import unittest

import numpy as np
import torch

import atoll
from atoll_testing import Syncer, log_tail, write_equal_spec

P = H = 4
OPTS = dict(run_id="r", token="tok", fragments=P, H=H, tau=1)


def descend(params, eta=0.05):
    """One inner step of ½‖w − 1‖² on every tensor, in its own dtype."""
    with torch.no_grad():
        for t in params.values():
            t.sub_(eta * (t - 1.0))


class StagingTest(unittest.TestCase):
    DEVICE = "cpu"  # tests/python/gpu_check.py runs these on "cuda"
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="atoll_staging_")
        self.spec = os.path.join(self.dir, "model.safetensors")
        self.values = write_equal_spec(self.spec, tensors=4, shape=(32, 32))
        self.syncer = None

    def tearDown(self):
        if self.syncer is not None:
            self.syncer.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, *flags):
        self.syncer = Syncer(self.dir, self.spec, ["-P", str(P), "-H", str(H), "--tau", "1", *flags])
        return self.syncer.target

    def test_bf16_copies_only_the_fragments_that_move(self):
        self.bf16_run(async_sends=False)

    def test_bf16_with_sends_handed_over_by_the_copier_thread(self):
        self.bf16_run(async_sends=True)  # the hand-over a CUDA learner uses, here without CUDA

    def bf16_run(self, async_sends):
        target = self.start("-M", "1")
        params = {n: torch.from_numpy(v).to(self.DEVICE, torch.bfloat16) for n, v in self.values.items()}
        model_bytes = sum(t.numel() * t.element_size() for t in params.values())
        with self.assertRaises(ValueError) as e:
            atoll.Learner(target, params, **OPTS)  # bf16 needs master copies or an explicit choice
        self.assertIn("master", str(e.exception))
        self.assertIn("low_precision='round'", str(e.exception))
        learner = atoll.Learner(target, params, low_precision="round", async_sends=async_sends, **OPTS)
        self.assertFalse(any(learner.shared.values()), learner.shared)
        k = learner.counters()
        self.assertEqual(k["bytes_to_host"], model_bytes, "the open reads the model once")
        moved_total, old_total, steps_applying, sends = 0, 0, 0, 0
        for step in range(2000):  # 40 steps at least, then until 8 of them applied merges
            if step >= 40 and steps_applying >= 8:
                break
            descend(params)
            time.sleep(0.01)  # compute: the rounds keep up
            before = learner.counters()
            applied = learner.step(tokens=64, loss=1.0)
            after = learner.counters()
            d2h = after["bytes_to_host"] - before["bytes_to_host"]
            h2d = after["bytes_to_device"] - before["bytes_to_device"]
            self.assertLessEqual(d2h + h2d, (1.0 / H + applied / P) * model_bytes, "step %d" % step)
            # Exactly the fragments that move: each is one tensor, a quarter of the model.
            self.assertEqual(d2h, len(learner.sent_fragments) * model_bytes // P, "step %d" % step)
            self.assertEqual(h2d, applied * model_bytes // P, "step %d" % step)
            self.assertEqual(applied, len(learner.applied_fragments))
            moved_total += d2h + h2d
            old_total += model_bytes * (2 if applied else 1)  # whole model before, and back when applied
            steps_applying += 1 if applied else 0
            sends += len(learner.sent_fragments)
        self.assertGreater(sends, 0)
        print("bf16 staging over %d steps (%s): %d bytes moved, whole-model staging %d (%.1fx)"
              % (step, "copier thread" if async_sends else "synchronous", moved_total, old_total,
                 old_total / moved_total))
        learner.close()
        # The run moved the global model towards the learner's optimum (1.0 everywhere).
        self.assertEqual(self.syncer.stop(), 0, log_tail(self.syncer.log_path))
        final, _ = atoll.read_spec(os.path.join(self.syncer.out, "global.safetensors"))
        start = np.mean([np.abs(v - 1).mean() for v in self.values.values()])
        end = np.mean([np.abs(v - 1).mean() for v in final.values()])
        self.assertLess(end, start)

    def test_a_staged_learner_keeps_the_shared_learners_model(self):
        """Synchronous DiLoCo, quorum 2: two identical learners get the same merges; one shares its
        fp32 tensors, the other stages non-contiguous views of the same values (sent by the copier
        thread, as on a GPU). Their models stay the same up to the rounding of applying a merge as
        θ + (Θ − θ_sent) instead of Θ + (θ − θ_sent)."""
        target = self.start("-M", "2", "--mode", "diloco", "-K", "2")
        shared = {n: torch.from_numpy(v.copy()) for n, v in self.values.items()}
        staged = {n: torch.from_numpy(np.ascontiguousarray(v.T)).to(self.DEVICE).t() for n, v in self.values.items()}
        staged["w0"] = staged["w0"].contiguous()  # one tensor shared (on the CPU), the others staged
        results, errors = {}, []

        def run(learner_id, params, **extra):
            try:
                with atoll.Learner(target, params, learner_id=learner_id, **dict(OPTS, mode="diloco"),
                                   **extra) as learner:
                    for _ in range(3 * H):
                        descend(params)
                        learner.step(tokens=64, loss=1.0)
                    results[learner_id] = (learner.shared, learner.counters())
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=run, args=(0, shared)),
                   threading.Thread(target=run, args=(1, staged), kwargs=dict(async_sends=True))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        self.assertEqual(errors, [])
        self.assertTrue(all(results[0][0].values()))
        self.assertEqual(results[1][0], {"w0": self.DEVICE == "cpu", "w1": False, "w2": False, "w3": False})
        self.assertEqual(results[0][1]["fragments_applied"], results[1][1]["fragments_applied"])
        self.assertGreaterEqual(results[1][1]["fragments_applied"], 3 * P)
        for n in shared:
            moved = float((shared[n] - torch.from_numpy(self.values[n])).abs().max())
            self.assertGreater(moved, 0.01, n)
            diff = float((shared[n] - staged[n].cpu()).abs().max())
            self.assertLess(diff, 1e-5, "%s: staged and shared learners differ by %g" % (n, diff))

    def test_merges_reach_the_fp32_master_weights(self):
        target = self.start("-M", "1")
        model = {n: torch.from_numpy(v).to(self.DEVICE, torch.bfloat16) for n, v in self.values.items()}
        master = {n: t.float() for n, t in model.items()}  # what a mixed-precision optimizer keeps
        learner = atoll.Learner(target, master, refresh=model, **OPTS)
        if self.DEVICE == "cpu":
            self.assertTrue(all(learner.shared.values()), "CPU fp32 master copies are shared")
        fragment_of = {name: p for p, slices in enumerate(learner.plan) for name, _, _ in slices}
        for n in model:
            self.assertTrue(torch.equal(model[n], master[n].to(torch.bfloat16)), n)
        merged = 0
        for step in range(2000):  # 30 steps at least, then until 10 merges landed
            if step >= 30 and merged >= 10:
                break
            descend(master)  # the optimizer updates the master copies...
            time.sleep(0.01)
            with torch.no_grad():
                for n in model:
                    model[n].copy_(master[n])  # ...and the model is refreshed from them
            before = {n: t.clone() for n, t in master.items()}
            learner.step(tokens=64, loss=1.0)
            for n in model:
                if fragment_of[n] in learner.applied_fragments:
                    self.assertFalse(torch.equal(master[n], before[n]), "the merge reached %s's master copy" % n)
                    merged += 1
                else:
                    self.assertTrue(torch.equal(master[n], before[n]), n)
                self.assertTrue(torch.equal(model[n], master[n].to(torch.bfloat16)), "step %d: %s refreshed" % (step, n))
        self.assertGreaterEqual(merged, 10)
        learner.close()
        with self.assertRaisesRegex(ValueError, "low_precision"):
            atoll.Learner(target, master, low_precision="sometimes", **OPTS)
        with self.assertRaisesRegex(ValueError, "not among params"):
            atoll.Learner(target, master, refresh={"nope": model["w0"]}, **OPTS)


if __name__ == "__main__":
    unittest.main(verbosity=2)
