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
another dtype, a non-contiguous view) is staged: copied into a host float32 buffer before each
step and copied back after it when fragments were applied (`Learner.shared` says which).

See docs/python.md.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from . import _atoll

RefusedError = _atoll.RefusedError

__all__ = ["Learner", "RefusedError"]

try:  # torch is optional: numpy arrays work without it
    import torch as _torch
except ImportError:  # pragma: no cover - exercised only without torch
    _torch = None


def _is_tensor(x: Any) -> bool:
    return _torch is not None and isinstance(x, _torch.Tensor)


def _named(params: Any) -> List[Tuple[str, Any]]:
    """(name, tensor/array) pairs from a module, a mapping, named pairs or bare tensors."""
    if _torch is not None and isinstance(params, _torch.nn.Module):
        return list(params.named_parameters())
    if isinstance(params, Mapping):
        items = list(params.items())
    elif isinstance(params, (str, bytes)) or not isinstance(params, Iterable):
        raise TypeError("params must be a torch.nn.Module, a {name: tensor or array} mapping, "
                        "model.named_parameters() or model.parameters(), not %s" % type(params).__name__)
    else:
        items = list(params)
        if items and not isinstance(items[0], tuple):  # model.parameters(): named by position
            items = [(str(i), p) for i, p in enumerate(items)]
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise TypeError("each parameter must be a (name, tensor or array) pair, got %r" % (item,))
        if not (_is_tensor(item[1]) or isinstance(item[1], np.ndarray)):
            raise TypeError("parameter '%s' is a %s, not a torch.Tensor or numpy.ndarray"
                            % (item[0], type(item[1]).__name__))
    return items


class _Staged:
    """A parameter atoll cannot share: a host float32 copy, synced around each step."""

    def __init__(self, value: Any) -> None:
        self.value = value
        if _is_tensor(value):
            self.host = value.detach().to("cpu", _torch.float32).contiguous().numpy().copy()
        else:
            self.host = np.ascontiguousarray(value, dtype=np.float32).copy()

    def to_host(self) -> None:
        if _is_tensor(self.value):
            self.host[...] = self.value.detach().to("cpu", _torch.float32).numpy()
        else:
            self.host[...] = self.value

    def from_host(self) -> None:
        if _is_tensor(self.value):
            with _torch.no_grad():
                self.value.copy_(_torch.from_numpy(self.host))
        else:
            np.copyto(self.value, self.host, casting="unsafe")


def _view(value: Any) -> Union[np.ndarray, _Staged]:
    """A float32 numpy view sharing the parameter's memory, or a staged copy."""
    if _is_tensor(value):
        if value.device.type == "cpu" and value.dtype == _torch.float32 and value.is_contiguous():
            return value.detach().numpy()
        return _Staged(value)
    if value.dtype == np.float32 and value.flags.c_contiguous and value.flags.writeable and value.flags.aligned:
        return value
    if not value.flags.writeable:
        raise ValueError("a read-only numpy array cannot receive the merged fragments")
    return _Staged(value)


class Learner:
    """One learner of an atoll run (see the module docstring and docs/python.md)."""

    def __init__(self, syncer: str, params: Any, *, run_id: str = "atoll", learner_id: int = -1,
                 embeddings: Sequence[str] = (), token: Optional[str] = None,
                 token_file: Optional[str] = None, tls_ca: Optional[str] = None,
                 tls_server_name: Optional[str] = None, tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None, mode: str = "decoupled", plan: str = "balanced",
                 fragments: int = 24, H: int = 24, tau: int = 2, alpha: float = 0.0,
                 keep_progress: bool = True, join_timeout_s: float = 20.0, rejoin: bool = False) -> None:
        if not isinstance(syncer, str):
            raise TypeError("syncer must be a 'host:port' string")
        items = _named(params)
        if not items:
            raise ValueError("params is empty: atoll needs the model's parameters")
        names = {n for n, _ in items}
        unknown = [e for e in embeddings if e not in names]
        if unknown:
            raise ValueError("embeddings names parameters that do not exist: %s" % ", ".join(unknown))
        self._staged: List[_Staged] = []
        self.shared: Dict[str, bool] = {}
        views = []
        for name, value in items:
            v = _view(value)
            self.shared[name] = not isinstance(v, _Staged)
            if isinstance(v, _Staged):
                self._staged.append(v)
                v = v.host
            views.append((name, v, name in embeddings))
        options = dict(syncer=syncer, run_id=run_id, learner_id=learner_id, token=token,
                       token_file=token_file, tls_ca=tls_ca, tls_server_name=tls_server_name,
                       tls_cert=tls_cert, tls_key=tls_key, mode=mode, plan=plan, fragments=fragments,
                       H=H, tau=tau, alpha=alpha, keep_progress=keep_progress,
                       join_timeout_s=join_timeout_s, rejoin=rejoin)
        self._impl = _atoll.Learner(options, views)
        for s in self._staged:  # the join wrote the global model into the staging buffers
            s.from_host()

    def step(self, tokens: int, loss: float = 0.0) -> int:
        """After each inner step: its token count and loss. Returns the fragments applied."""
        if isinstance(tokens, bool) or not isinstance(tokens, (int, np.integer)):
            raise TypeError("tokens must be an int, got %s" % type(tokens).__name__)
        for s in self._staged:
            s.to_host()
        applied = self._impl.step(int(tokens), float(loss))
        if applied:
            for s in self._staged:
                s.from_host()
        return applied

    @property
    def finish_requested(self) -> bool:
        """True once the syncer asked the run to finish: stop training and close()."""
        return self._impl.finish_requested()

    @property
    def closed(self) -> bool:
        return self._impl.closed

    def counters(self) -> Dict[str, Union[int, bool]]:
        """Pushes, pulls, fragments applied, joins, bytes, the learner id the syncer gave, ..."""
        return self._impl.counters()

    def close(self, flush_timeout_s: float = 30.0) -> None:
        """Pushes the progress not sent yet (bounded), says goodbye. Idempotent."""
        self._impl.close(float(flush_timeout_s))

    def __enter__(self) -> "Learner":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.closed:
            self.close(30.0 if exc[0] is None else 0.0)
