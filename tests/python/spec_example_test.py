"""Two learners of a model that is not atoll's (examples/llama_learner.py: RMSNorm, rotary
positions, separate q/k/v/o projections, untied head), the syncer started from the spec the
example writes: one learner is a 2-rank torchrun job in fp32, the other one process training a
bf16 model with fp32 master weights. Both
contribute rounds, and the exported global model's loss — evaluated by the example, since the
syncer cannot run this model — falls below the spec's. Real `atoll syncer` (ATOLL_BIN) on
127.0.0.1 port 0; bounded in time."""
import json
import os
import subprocess
import unittest

from atoll_testing import ProcessTestCase, ATOLL, PYTHON, Syncer, log_tail

EXAMPLE = os.environ.get("ATOLL_LLAMA_EXAMPLE", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                                              "examples", "llama_learner.py"))
STEPS = 48


class SpecExampleTest(ProcessTestCase):
    PREFIX = "atoll_llama_"

    def run_example(self, *args):
        r = subprocess.run([PYTHON, EXAMPLE, *args], capture_output=True, text=True, timeout=240)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return r.stdout

    def prepare_data(self):
        with open("/usr/share/games/fortunes/fortunes") as f:
            body = f.read()
        self.assertGreater(len(body), 10000, "fortunes corpus missing: run scripts/setup")
        corpus = os.path.join(self.dir, "corpus.txt")
        with open(corpus, "w") as f:
            f.write(body)
        data = os.path.join(self.dir, "data")
        r = subprocess.run([ATOLL, "data", "prepare", "--out", data, "--tokenizer", "byte", "--input", corpus],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return data

    def eval_loss(self, weights, data):
        out = self.run_example("eval", "--weights", weights, "--data", data, "--seq", "32", "--batches", "4", "--json")
        return json.loads(out)["eval_loss"]

    def test_two_learners_of_a_llama_shaped_model_lower_its_loss(self):
        data = self.prepare_data()
        spec = os.path.join(self.dir, "llama.safetensors")
        self.run_example("spec", "--out", spec, "--vocab", "256", "--d", "64", "--layers", "2", "--heads", "4",
                         "--ffn", "172", "--seq", "32")
        syncer = Syncer(self.dir, spec, ["-M", "2", "--data", data, "--steps", str(STEPS), "--seq", "32", "--batch", "8",
                                         "-P", "4", "-H", "8", "--tau", "2", "--lr", "3e-3", "--warmup", "8",
                                         "--finish-when-done"])
        try:
            learners = []
            # Learner 0 is a 2-rank torchrun job (DDP over Gloo); --redirects/--tee 2: Debian's torch
            # 1.13 under Python 3.11 cannot parse their default 0.
            torchrun = [PYTHON, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
                        "--rdzv_backend", "c10d", "--rdzv_endpoint", "127.0.0.1:0", "--redirects", "2", "--tee", "2",
                        "--log_dir", os.path.join(self.dir, "torchrun")]
            for i, precision, launch in ((0, "fp32", torchrun), (1, "bf16", [PYTHON])):
                log = open(os.path.join(self.dir, "learner-%d.log" % i), "w")
                self.logs.append(log)
                learners.append(subprocess.Popen(
                    [*launch, EXAMPLE, "train", "--run", syncer.out, "--syncer", syncer.target, "--id", str(i),
                     "--precision", precision, "--device", "cpu", "--summary", os.path.join(self.dir, "s%d.json" % i)],
                    stdout=log, stderr=subprocess.STDOUT))
                self.procs.append(learners[-1])
            for i, p in enumerate(learners):
                self.assertEqual(p.wait(timeout=300), 0, log_tail(os.path.join(self.dir, "learner-%d.log" % i)))
            self.assertEqual(syncer.wait(timeout=120), 0, log_tail(syncer.log_path))
            rows = syncer.learner_rows()
            for i in (0, 1):
                self.assertGreater(rows[i]["rounds_joined"], 0, rows[i])
                with open(os.path.join(self.dir, "s%d.json" % i)) as f:
                    summary = json.load(f)
                self.assertEqual(summary["steps"], STEPS)
                self.assertGreater(summary["counters"]["fragments_applied"], 0)
                self.assertEqual(summary["precision"], "bf16" if i else "fp32")
            start = self.eval_loss(spec, data)
            end = self.eval_loss(os.path.join(syncer.out, "global.safetensors"), data)
            print("llama-shaped model from its spec, 2 learners (2-rank fp32 unit, bf16 + fp32 master) x %d steps: "
                  "eval loss %.4f -> %.4f; rounds joined %s" % (STEPS, start, end,
                                                                {i: rows[i]["rounds_joined"] for i in rows}))
            self.assertLess(end, start)
        finally:
            syncer.kill()


if __name__ == "__main__":
    unittest.main(verbosity=2)
