"""The parameters a Learner is given: names, and for each whether atoll shares its memory or stages
it through a host float32 buffer (docs/python.md, "Shared and staged parameters")."""
from __future__ import annotations

from typing import Any, Iterable, List, Mapping, Tuple

import numpy as np

try:  # torch is optional: numpy arrays work without it
    import torch as _torch
except ImportError:  # pragma: no cover - exercised only without torch
    _torch = None

LOW_PRECISION = ("refuse", "round")


def is_tensor(x: Any) -> bool:
    return _torch is not None and isinstance(x, _torch.Tensor)


def named(params: Any, what: str = "params") -> List[Tuple[str, Any]]:
    """(name, tensor/array) pairs from a module, a mapping, named pairs or bare tensors."""
    if _torch is not None and isinstance(params, _torch.nn.Module):
        return list(params.named_parameters())
    if isinstance(params, Mapping):
        items = list(params.items())
    elif isinstance(params, (str, bytes)) or not isinstance(params, Iterable):
        raise TypeError("%s must be a torch.nn.Module, a {name: tensor or array} mapping, "
                        "model.named_parameters() or model.parameters(), not %s" % (what, type(params).__name__))
    else:
        items = list(params)
        if items and not isinstance(items[0], tuple):  # model.parameters(): named by position
            items = [(str(i), p) for i, p in enumerate(items)]
    for item in items:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise TypeError("each parameter must be a (name, tensor or array) pair, got %r" % (item,))
        if not (is_tensor(item[1]) or isinstance(item[1], np.ndarray)):
            raise TypeError("parameter '%s' is a %s, not a torch.Tensor or numpy.ndarray"
                            % (item[0], type(item[1]).__name__))
    return items


def shareable(value: Any) -> bool:
    """Whether atoll can read and write the value's own memory: host float32, contiguous."""
    if is_tensor(value):
        return value.device.type == "cpu" and value.dtype == _torch.float32 and value.is_contiguous()
    return (value.dtype == np.float32 and value.flags.c_contiguous and value.flags.writeable
            and value.flags.aligned)


def low_precision(value: Any) -> bool:
    """Narrower than float32: a merge written into it is rounded."""
    if is_tensor(value):
        return value.dtype in (_torch.bfloat16, _torch.float16)
    return value.dtype == np.float16


def check_value(name: str, value: Any, rounding: str) -> None:
    """Refuses what cannot hold merged fragments (ValueError; nothing is changed)."""
    if is_tensor(value):
        if not value.dtype.is_floating_point:
            raise ValueError("parameter '%s' is %s, not a floating-point tensor" % (name, value.dtype))
    else:
        if value.dtype.kind != "f":
            raise ValueError("parameter '%s' is a numpy %s array, not floating point" % (name, value.dtype))
        if not value.flags.writeable:
            raise ValueError("parameter '%s': a read-only numpy array cannot receive the merged fragments" % name)
    if low_precision(value) and rounding != "round":
        dtype = str(value.dtype).replace("torch.", "")
        raise ValueError(
            "parameter '%s' is %s: merges written into it would be rounded to %s. Give atoll the optimizer's "
            "float32 master copies as params= and this model as refresh= (merges land in the master copies and "
            "the model is refreshed from them), or pass low_precision='round' to accept the rounding"
            % (name, dtype, dtype))
