"""atoll for PyTorch and numpy users: one learner of a Decoupled DiLoCo run.

    learner = atoll.Learner(syncer="host:port", params=model.named_parameters(), run_id=..., ...)
    for batch in data:
        loss = train_step(model, batch)          # your loop, your optimizer
        learner.step(tokens=batch.numel(), loss=loss.item())
    learner.close()

The learner exchanges parameter fragments with an `atoll syncer` in the background (the same
agent as `atoll learner`: schedule, codecs, rejoin, heartbeats, tokens, TLS). Merged fragments are
written into the parameters only inside `step()` (and once in the constructor, which starts the
learner from the global model), never from a background thread.

Parameters are shared, not copied, when they are float32, contiguous and on the CPU (a torch
tensor or a numpy array): atoll reads and writes their memory. Any other parameter (a CUDA tensor,
another dtype, a non-contiguous view) is staged: only the fragments that move are copied — a
fragment due to be sent, after the step that made it due; a merged fragment, when it is applied
(`Learner.shared` says which parameters are which; `counters()` counts the bytes). bf16 and fp16
parameters are refused unless their float32 master copies are given (`refresh=`) or the rounding
is accepted (`low_precision="round"`). A torchrun job joins as one learner with
`process_group=`; `state_dir=` lets a restarted learner rejoin as itself. `write_spec` writes the
model spec an `atoll syncer --spec` starts from.

See docs/python.md.
"""
from __future__ import annotations

from ._atoll import AccessRefusedError, RefusedError
from ._learner import Learner
from .spec import read_spec, write_spec

__all__ = ["Learner", "RefusedError", "AccessRefusedError", "write_spec", "read_spec"]
