"""One syncer, two C++ learners (`atoll learner`) and one PyTorch learner
(examples/torch_learner.py over the atoll package) in the same run on 127.0.0.1: all three
contribute rounds and the global model's eval loss falls. Run by ctest with ATOLL_BIN, PYTHONPATH
(build/python) and ATOLL_EXAMPLE set; bounded in time (every process is waited for with a
timeout and killed past it)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

ATOLL = os.environ["ATOLL_BIN"]
STEPS = 24


def run_flags(data, out):
    return ["--data", data, "--out", out, "-M", "3", "--steps", str(STEPS), "--seq", "32", "--batch", "4",
            "-P", "4", "-H", "4", "--tau", "1", "--eval-batches", "2", "--eval-every", "0", "--token", "py-token"]


def log(path):
    try:
        with open(path) as f:
            return f.read()[-4000:]
    except OSError:
        return "(no %s)" % path


class TorchClusterTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="atoll_torch_cluster_")
        self.procs = []
        self.logs = []

    def tearDown(self):
        for f in self.logs:
            f.close()
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, argv, name):
        out = open(os.path.join(self.dir, name + ".log"), "w")
        self.logs.append(out)
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def prepare_data(self):
        with open("/usr/share/games/fortunes/fortunes") as f:
            body = f.read()
        self.assertGreater(len(body), 10000, "fortunes corpus missing: run scripts/setup")
        corpus = os.path.join(self.dir, "corpus.txt")
        with open(corpus, "w") as f:
            f.write(body * 2)
        data = os.path.join(self.dir, "data")
        r = subprocess.run([ATOLL, "data", "prepare", "--out", data, "--tokenizer", "byte", "--input", corpus],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        return data

    def test_python_and_cpp_learners_train_one_model(self):
        data, out = self.prepare_data(), os.path.join(self.dir, "run")
        port_file = os.path.join(self.dir, "syncer.port")
        syncer = self.start([ATOLL, "syncer", *run_flags(data, out), "--port-file", port_file,
                             "--finish-when-done", "--checkpoint-every", "0"], "syncer")
        deadline = time.time() + 240
        while not os.path.exists(port_file):
            self.assertIsNone(syncer.poll(), log(os.path.join(self.dir, "syncer.log")))
            self.assertLess(time.time(), deadline, "the syncer did not start")
            time.sleep(0.1)
        with open(port_file) as f:
            target = "127.0.0.1:" + f.read().strip()
        learners = [self.start([ATOLL, "learner", "--id", str(i), "--syncer", target, *run_flags(data, out)],
                               "learner-%d" % i) for i in (0, 1)]
        summary = os.path.join(self.dir, "torch.json")
        learners.append(self.start([sys.executable, os.environ["ATOLL_EXAMPLE"], "--run", out, "--syncer", target,
                                    "--id", "2", "--summary", summary], "learner-2"))
        for i, p in enumerate(learners):
            self.assertEqual(p.wait(timeout=300), 0, log(os.path.join(self.dir, "learner-%d.log" % i)))
        self.assertEqual(syncer.wait(timeout=120), 0, log(os.path.join(self.dir, "syncer.log")))

        with open(summary) as f:
            torch_run = json.load(f)
        self.assertEqual(torch_run["steps"], STEPS)
        self.assertTrue(torch_run["shared"], "CPU float32 parameters are shared, not staged")
        self.assertGreater(torch_run["counters"]["pushes"], 0)
        self.assertGreater(torch_run["counters"]["fragments_applied"], 0)
        # The PyTorch GPT learns on its own data too (its loss is atoll's cross-entropy).
        self.assertLess(sum(torch_run["losses"][-4:]) / 4, sum(torch_run["losses"][:4]) / 4)
        with open(os.path.join(out, "state", "learners.json")) as f:
            table = json.load(f)
        rows = {r["id"]: r for r in table.get("learners", table.get("value", {}).get("learners", []))}
        for i in (0, 1, 2):
            self.assertIn(i, rows, table)
            self.assertGreater(rows[i]["rounds_joined"], 0, rows[i])
            self.assertGreater(rows[i]["tokens_merged"], 0, rows[i])
        with open(os.path.join(out, "syncer-summary.json")) as f:
            s = json.load(f)
        cpp = []
        for i in (0, 1):
            with open(os.path.join(out, "learner-%d.json" % i)) as f:
                cpp.append(json.load(f)["loss"])
        print("eval loss %.4f -> %.4f; rounds joined: %s; last loss: C++ %.4f %.4f, torch %.4f"
              % (s["eval_loss_start"], s["eval_loss"], {i: rows[i]["rounds_joined"] for i in rows},
                 cpp[0], cpp[1], torch_run["losses"][-1]))
        self.assertLess(s["eval_loss"], s["eval_loss_start"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
