"""The atoll Python package against the toy syncer (tests/capi/toy_syncer.h: "emb.weight" [16, 4],
"layers.0.w" [8, 8], "layers.1.w" [8, 8], "norm" [8]; P = H = 4, τ = 1, every value 0.25) on
127.0.0.1: buffers are shared (the C API writes the merged fragments into the caller's own
memory, no copy per step), staged parameters still work, and every bad argument raises a Python
exception with a clear message. Run by ctest with PYTHONPATH at build/python and
ATOLL_TOY_SYNCER set."""
import os
import subprocess
import tempfile
import time
import unittest

import numpy as np
import torch

import atoll

SHAPES = [("emb.weight", (16, 4)), ("layers.0.w", (8, 8)), ("layers.1.w", (8, 8)), ("norm", (8,))]
OPTS = dict(run_id="toy", token="toy-token", fragments=4, H=4, tau=1, embeddings=["emb.weight"])


class ToySyncer:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="atoll_py_")
        port_file = os.path.join(self.dir, "port")
        self.proc = subprocess.Popen([os.environ["ATOLL_TOY_SYNCER"], port_file, "toy-token"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while not os.path.exists(port_file):
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError("the toy syncer did not start")
            time.sleep(0.05)
        with open(port_file) as f:
            self.target = "127.0.0.1:" + f.read().strip()

    def stop(self):
        """Ends the syncer; returns (rounds closed, mean of Θ)."""
        out, _ = self.proc.communicate(timeout=60)
        words = out.split()
        return int(words[1]), float(words[3])


def numpy_params(value):
    return {n: np.full(s, value, dtype=np.float32) for n, s in SHAPES}


def torch_params(value):
    return {n: torch.full(s, value, dtype=torch.float32) for n, s in SHAPES}


def train(learner, params, steps):
    """Gradient descent on ½‖w − 1‖², 10 ms a step: at least `steps` steps, then until merged
    fragments were applied (bounded: 2000 steps). Returns the fragments applied."""
    applied = 0
    for step in range(2000):
        if step >= steps and applied > 0:
            break
        loss = 0.0
        for p in params.values():
            d = p - 1.0
            loss += float((d * d).sum()) / 2
            p -= 0.1 * d  # in place: numpy and torch alike
        time.sleep(0.01)
        applied += learner.step(tokens=64, loss=loss)
    return applied


class LearnerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.syncer = ToySyncer()

    @classmethod
    def tearDownClass(cls):
        rounds, mean = cls.syncer.stop()
        assert rounds > 0, "no round closed"
        assert abs(mean - 1.0) < 0.75, "the global model did not move towards the learners' optimum: %f" % mean

    def test_torch_buffers_are_shared(self):
        params = torch_params(-3.0)
        ptrs = {n: t.data_ptr() for n, t in params.items()}
        learner = atoll.Learner(self.syncer.target, params, **OPTS)
        self.assertTrue(all(learner.shared.values()), learner.shared)
        # The C API reads and writes the tensors' own memory...
        self.assertEqual(learner._core.impl.addresses(), [params[n].data_ptr() for n, _ in SHAPES])
        # ...so the join's global model is already in them (they held -3, the syncer never did).
        for t in params.values():
            self.assertFalse(torch.any(t == -3.0), t)
        applied = train(learner, params, 24)
        self.assertGreater(applied, 0)
        self.assertEqual({n: t.data_ptr() for n, t in params.items()}, ptrs)
        self.assertEqual(learner._core.impl.addresses(), list(ptrs.values()))
        k = learner.counters()
        self.assertGreater(k["pushes"], 0)
        self.assertGreaterEqual(k["steps"], 24)
        learner.close()
        self.assertTrue(learner.closed)
        learner.close()  # idempotent

    def test_numpy_buffers_are_shared(self):
        params = numpy_params(-3.0)
        with atoll.Learner(self.syncer.target, params, **OPTS) as learner:
            self.assertEqual(learner._core.impl.addresses(), [params[n].ctypes.data for n, _ in SHAPES])
            self.assertFalse(np.any(params["layers.1.w"] == -3.0))
            self.assertGreater(train(learner, params, 16), 0)

    def test_staged_parameters(self):
        params = numpy_params(-3.0)
        params["norm"] = np.full(8, -3.0, dtype=np.float64)          # another dtype
        base = torch.full((8, 8), -3.0)
        tparams = {n: torch.from_numpy(v) if v.dtype == np.float32 else v for n, v in params.items()}
        tparams["layers.0.w"] = base.t()                              # not contiguous
        with atoll.Learner(self.syncer.target, tparams, **OPTS) as learner:
            self.assertFalse(learner.shared["norm"])
            self.assertFalse(learner.shared["layers.0.w"])
            self.assertTrue(learner.shared["layers.1.w"])
            self.assertFalse(np.any(params["norm"] == -3.0))           # copied back after the join
            self.assertFalse(torch.any(base == -3.0))
            self.assertGreater(train(learner, tparams, 8), 0)          # staged: copied around steps

    def test_model_parameters_of_a_module(self):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4))
        # model.parameters() is named by position ("0", "1"): not the toy model's names.
        with self.assertRaises(atoll.RefusedError) as e:
            atoll.Learner(self.syncer.target, model.parameters(), **dict(OPTS, embeddings=[]))
        self.assertIn("model signature", str(e.exception))
        self.assertIn("0 [4,4]", str(e.exception))

    def test_bad_arguments_raise(self):
        t = self.syncer.target
        cases = [
            (TypeError, "host:port", lambda: atoll.Learner(7070, numpy_params(0), **OPTS)),
            (TypeError, "mapping", lambda: atoll.Learner(t, 42, **OPTS)),
            (TypeError, "not a torch.Tensor", lambda: atoll.Learner(t, {"emb.weight": [1.0, 2.0]}, **OPTS)),
            (ValueError, "empty", lambda: atoll.Learner(t, {}, **OPTS)),
            (ValueError, "do not exist", lambda: atoll.Learner(t, numpy_params(0), **dict(OPTS, embeddings=["x"]))),
            (ValueError, "ddp", lambda: atoll.Learner(t, numpy_params(0), **dict(OPTS, mode="ddp"))),
            (ValueError, "zigzag", lambda: atoll.Learner(t, numpy_params(0), **dict(OPTS, plan="zigzag"))),
            (ValueError, "alpha", lambda: atoll.Learner(t, numpy_params(0), **dict(OPTS, alpha=2.0))),
            (ValueError, "syncer", lambda: atoll.Learner("", numpy_params(0), **OPTS)),
            (atoll.RefusedError, "schedule mismatch", lambda: atoll.Learner(t, numpy_params(0), **dict(OPTS, tau=2))),
            (atoll.RefusedError, "run id", lambda: atoll.Learner(t, numpy_params(0), **dict(OPTS, run_id="other"))),
            (PermissionError, "", lambda: atoll.Learner(t, numpy_params(0), **dict(OPTS, token="wrong"))),
            (FileNotFoundError, "", lambda: atoll.Learner(t, numpy_params(0), **dict(OPTS, token_file="/nonexistent"))),
        ]
        for exc, text, call in cases:
            with self.subTest(expected=exc.__name__, text=text):
                with self.assertRaises(exc) as e:
                    call()
                self.assertIn(text, str(e.exception))
        ro = numpy_params(0)
        ro["norm"].flags.writeable = False
        with self.assertRaisesRegex(ValueError, "read-only"):
            atoll.Learner(t, ro, **OPTS)
        wrong = numpy_params(0)
        wrong["layers.0.w"] = np.zeros((4, 16), dtype=np.float32)
        with self.assertRaises(atoll.RefusedError) as e:
            atoll.Learner(t, wrong, **OPTS)
        self.assertIn("layers.0.w [4,16]", str(e.exception))

    def test_refusals_settings_and_state(self):
        t = self.syncer.target
        with atoll.Learner(t, numpy_params(0), learner_id=3, **OPTS) as first:
            # The id a live learner holds: refused, distinctly.
            with self.assertRaises(atoll.RefusedError) as e:
                atoll.Learner(t, numpy_params(0), learner_id=3, **OPTS)
            self.assertEqual(e.exception.code, "ALREADY_EXISTS")
            self.assertIn("held by a live learner", str(e.exception))
            state = first.state_dict()
            self.assertEqual(state["learner_id"], 3)
            self.assertEqual(len(state["fragments"]), 4)
            self.assertEqual(state["fragments_count"], 4)
            self.assertEqual(sum(c for f in first.plan for _, _, c in f), 64 + 64 + 64 + 8)
            self.assertEqual(sorted({n for f in first.plan for n, _, _ in f}), sorted(n for n, _ in SHAPES))
        with self.assertRaises(atoll.AccessRefusedError) as e:
            atoll.Learner(t, numpy_params(0), **dict(OPTS, token="wrong"))
        self.assertIsInstance(e.exception, PermissionError)
        self.assertIsInstance(e.exception, atoll.RefusedError)
        for key, value in (("push_timeout_s", 0.0), ("call_timeout_s", -1.0), ("min_link_mbps", -5.0),
                           ("heartbeat_s", 0.0), ("backoff_max_s", 0.01)):
            with self.subTest(setting=key):
                with self.assertRaisesRegex(ValueError, key):
                    atoll.Learner(t, numpy_params(0), **dict(OPTS, **{key: value}))
        with self.assertRaisesRegex(ValueError, "alpha"):
            atoll.Learner(t, numpy_params(0), **dict(OPTS, alpha=1.0))

    def test_syncer_gone_raises_connection_error(self):
        own = ToySyncer()
        params = numpy_params(0)
        learner = atoll.Learner(own.target, params, **OPTS)
        own.stop()
        for _ in range(4):  # training goes on; the agent retries in the background
            learner.step(tokens=8, loss=1.0)
        with self.assertRaises(ConnectionError):
            learner.close(0)
        self.assertTrue(learner.closed, "closed even though the goodbye failed")

    def test_bad_step_and_use_after_close(self):
        params = numpy_params(0)
        learner = atoll.Learner(self.syncer.target, params, **OPTS)
        before = {n: v.copy() for n, v in params.items()}
        with self.assertRaisesRegex(ValueError, "tokens 0"):
            learner.step(tokens=0)
        with self.assertRaisesRegex(ValueError, "not finite"):
            learner.step(tokens=8, loss=float("nan"))
        with self.assertRaisesRegex(TypeError, "tokens must be an int"):
            learner.step(tokens="8")
        self.assertEqual(learner.counters()["steps"], 0, "a refused step changes nothing")
        for n, v in params.items():
            np.testing.assert_array_equal(v, before[n])
        learner.close(0)
        for call in (lambda: learner.step(8), learner.counters, lambda: learner.finish_requested):
            with self.assertRaisesRegex(ValueError, "closed"):
                call()


if __name__ == "__main__":
    unittest.main(verbosity=2)
