"""Shared pieces of the Python tests that run a real `atoll syncer` (ATOLL_BIN) from a model spec
on 127.0.0.1 port 0: start it, wait for its port, read its learner table, stop it within a bound."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

import atoll

ATOLL = os.environ.get("ATOLL_BIN", "")
PYTHON = sys.executable


def log_tail(path, n=4000):
    try:
        with open(path) as f:
            return f.read()[-n:]
    except OSError:
        return "(no %s)" % path


def write_equal_spec(path, tensors=4, shape=(32, 32), seed=0, embeddings=()):
    """A spec of `tensors` tensors w0..w{n-1} of one shape: a balanced plan with P = tensors puts
    one whole tensor in each fragment, so every fragment is exactly 1/P of the model."""
    rng = np.random.default_rng(seed)
    params = {"w%d" % i: rng.normal(0.0, 0.5, size=shape).astype(np.float32) for i in range(tensors)}
    atoll.write_spec(params, path, embeddings=list(embeddings))
    return params


class Syncer:
    """`atoll syncer --spec SPEC` in `folder`, with its output in folder/syncer.log."""

    def __init__(self, folder, spec, flags, token="tok", run_id="r", name="syncer"):
        self.folder, self.token, self.run_id = folder, token, run_id
        self.out = os.path.join(folder, "run-" + name)
        self.log_path = os.path.join(folder, name + ".log")
        port_file = os.path.join(folder, name + ".port")
        self._log = open(self.log_path, "w")
        argv = [ATOLL, "syncer", "--spec", spec, "--out", self.out, "--port-file", port_file, "--token", token,
                "--run-id", run_id, "--checkpoint-every", "0", *flags]
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while not os.path.exists(port_file):
            if self.proc.poll() is not None or time.time() > deadline:
                self.kill()
                raise RuntimeError("the syncer did not start:\n" + log_tail(self.log_path))
            time.sleep(0.05)
        with open(port_file) as f:
            self.target = "127.0.0.1:" + f.read().strip()

    def learner_rows(self):
        """The learner table the syncer committed: {id: row}."""
        with open(os.path.join(self.out, "state", "learners.json")) as f:
            table = json.load(f)
        rows = table.get("learners", table.get("value", {}).get("learners", []))
        return {r["id"]: r for r in rows}

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.kill()

    def stop(self, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


class ProcessTestCase(unittest.TestCase):
    """A test with a scratch folder (self.dir, prefix PREFIX) and child processes (self.procs, their
    logs self.logs) that are killed and removed after it, whatever it did."""
    PREFIX = "atoll_test_"

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix=self.PREFIX)
        self.procs, self.logs = [], []

    def tearDown(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for f in self.logs:
            f.close()
        shutil.rmtree(self.dir, ignore_errors=True)
