"""The GPU check (ctest label `gpu`): the staging tests with CUDA parameters — fp32 and bf16, the
device -> host copies of the fragments due on a side stream into pinned buffers, handed over by
the copier thread, host -> device receipts, fp32 master weights on the GPU — and, with two GPUs
or more, a 2-rank torchrun unit over NCCL against one process with twice the batch. Exits 77
(ctest: skipped) with a message when torch sees no CUDA device.

    PYTHONPATH=build/python ATOLL_BIN=build/atoll /usr/bin/python3 tests/python/gpu_check.py
"""
import sys
import unittest

import torch

SKIPPED = 77


def main():
    if not torch.cuda.is_available():
        print("SKIPPED: torch.cuda.is_available() is false (no CUDA device or no CUDA build of torch); "
              "the GPU check needs one")
        return SKIPPED
    import atoll
    import staging_test
    import unit_test

    class CudaStaging(staging_test.StagingTest):
        DEVICE = "cuda"

        def test_host_buffers_are_pinned_and_the_copier_hands_over(self):
            target = self.start("-M", "1")
            params = {n: torch.from_numpy(v).cuda() for n, v in self.values.items()}
            with atoll.Learner(target, params, **staging_test.OPTS) as learner:
                staging = learner._core.staging
                self.assertTrue(staging.asynchronous, "CUDA learners hand sends over on the copier thread")
                for slot in staging.slots:
                    self.assertTrue(slot.host_t.is_pinned() and slot.send_t.is_pinned(), slot.name)
                for _ in range(40):
                    staging_test.descend(params)
                    learner.step(tokens=64, loss=1.0)
                self.assertGreater(learner.counters()["pushes"], 0)

    class NcclUnit(unit_test.UnitTest):
        DEVICE = "cuda"
        EXACT = False

        def setUp(self):
            if torch.cuda.device_count() < 2:
                self.skipTest("an NCCL unit needs 2 GPUs, this machine has %d" % torch.cuda.device_count())
            super().setUp()

    print("GPU check on %s (%d device(s)), torch %s" % (torch.cuda.get_device_name(0), torch.cuda.device_count(),
                                                       torch.__version__))
    suite = unittest.TestSuite()
    loader = unittest.TestLoader()
    suite.addTests(loader.loadTestsFromTestCase(CudaStaging))
    suite.addTests(loader.loadTestsFromTestCase(NcclUnit))
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
