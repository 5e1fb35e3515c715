"""A killed Python learner restarted from its state folder rejoins as itself: the same id (given
by the folder, the restart asks for none), its public copies loaded, a catch-up of deltas that
downloads at most a quarter of a full fp32 fetch of the model, and no new row in the syncer's
learner table. Against a real `atoll syncer --spec` (ATOLL_BIN) on 127.0.0.1, with a second
learner moving the global model on by exactly 12 steps while the first one is down. Bounded: every process is waited
for with a timeout and killed past it."""
import json
import os
import subprocess
import time
import unittest

from atoll_testing import ProcessTestCase, PYTHON, Syncer, log_tail, write_equal_spec

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPE = (256, 256)  # 4 tensors: 262,144 values, 1 MiB in fp32


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class ResumeTest(ProcessTestCase):
    PREFIX = "atoll_resume_"

    def learner(self, name, target, spec, learner_id, steps, state=None, hold=None):
        out = os.path.join(self.dir, name + ".json")
        progress = os.path.join(self.dir, name + ".progress")
        argv = [PYTHON, os.path.join(HERE, "resume_learner.py"), target, spec, out, "--id", str(learner_id),
                "--steps", str(steps), "--progress", progress]
        if state:
            argv += ["--state", state]
        if hold:
            argv += ["--hold", hold]
        log = open(os.path.join(self.dir, name + ".log"), "w")
        self.logs.append(log)
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p, out, progress

    def wait_for(self, what, predicate, proc, log, timeout=120):
        deadline = time.time() + timeout
        while not predicate():
            self.assertIsNone(proc.poll(), "%s: the learner exited\n%s" % (what, log_tail(log)))
            self.assertLess(time.time(), deadline, "%s: timed out\n%s" % (what, log_tail(log)))
            time.sleep(0.05)

    def set_hold(self, path, steps):
        with open(path + ".tmp", "w") as f:
            f.write(str(steps))
        os.replace(path + ".tmp", path)

    def steps_of(self, progress):
        p = read_json(progress)
        return p["steps"] if p else 0

    def test_a_killed_learner_rejoins_as_itself_with_deltas(self):
        spec = os.path.join(self.dir, "model.safetensors")
        values = write_equal_spec(spec, tensors=4, shape=SHAPE)
        full_fetch = sum(v.size for v in values.values()) * 4
        syncer = Syncer(self.dir, spec, ["-M", "2", "-P", "4", "-H", "4", "--tau", "1"])
        try:
            state = os.path.join(self.dir, "state-a")
            hold = os.path.join(self.dir, "hold-b")
            b_log = os.path.join(self.dir, "b.log")
            other, _, other_progress = self.learner("b", syncer.target, spec, 1, 100000, hold=hold)
            first, _, first_progress = self.learner("a1", syncer.target, spec, -1, 100000, state)
            a1_log = os.path.join(self.dir, "a1.log")
            copies = [os.path.join(state, "fragment-%03d.bin" % p) for p in range(4)]
            self.wait_for("first run of a: 30 steps and a public copy of every fragment kept",
                          lambda: self.steps_of(first_progress) >= 30 and all(map(os.path.exists, copies)),
                          first, a1_log)
            saved = read_json(os.path.join(state, "learner.json"))
            self.assertIsNotNone(saved, "learner.json was written")
            self.set_hold(hold, 0)  # the other learner stops at its next step...
            first.kill()  # ...and this one is SIGKILLed: no goodbye, no final sync
            first.wait()
            # The other learner moves the global model on by exactly 12 steps (3 rounds of each
            # fragment) while this one is down, then waits for the restart.
            time.sleep(0.2)
            mark = self.steps_of(other_progress)
            self.set_hold(hold, mark + 12)
            self.wait_for("the other learner", lambda: self.steps_of(other_progress) >= mark + 12, other, b_log)
            kept = [int.from_bytes(open(c, "rb").read(16)[8:16], "little") for c in copies]  # ATOLLST1 header
            second, second_out, _ = self.learner("a2", syncer.target, spec, -1, 20, state)
            self.wait_for("the restart's join", lambda: read_json(second_out) is not None, second,
                          os.path.join(self.dir, "a2.log"))
            os.unlink(hold)
            self.assertEqual(second.wait(timeout=120), 0, log_tail(os.path.join(self.dir, "a2.log")))
            opened = read_json(second_out)["open"]
            behind = [h - k for h, k in zip(read_json(second_out)["held"], kept)]
            print("restart: learner %d, %d of %d fragments from the state, %s versions behind, %d bytes down at the "
                  "rejoin (a full fp32 fetch: %d, %.3f of it), %d full pulls, %d delta pulls"
                  % (opened["learner_id"], opened["state_loaded"], 4, behind, opened["payload_bytes_down"], full_fetch,
                     opened["payload_bytes_down"] / full_fetch, opened["pulls_full"], opened["pulls_delta"]))
            self.assertEqual(opened["learner_id"], saved["learner_id"])
            self.assertTrue(opened["joined"])
            self.assertEqual(opened["state_loaded"], 4, "state folder: %s; first run: %s" % (
                {f: os.path.getsize(os.path.join(state, f)) for f in sorted(os.listdir(state))}, saved))
            self.assertEqual(opened["pulls_full"], 0)
            self.assertGreater(opened["pulls_delta"], 0, "the global model moved: deltas were pulled")
            self.assertLessEqual(opened["payload_bytes_down"], full_fetch / 4)
            other.kill()
            other.wait()
            self.assertEqual(syncer.stop(), 0, log_tail(syncer.log_path))
            rows = syncer.learner_rows()
            self.assertEqual(sorted(rows), sorted([1, saved["learner_id"]]), "the learner table did not grow")
            self.assertGreaterEqual(rows[saved["learner_id"]]["joins"], 2)
        finally:
            syncer.kill()


if __name__ == "__main__":
    unittest.main(verbosity=2)
