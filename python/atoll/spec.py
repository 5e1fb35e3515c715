"""Model specs (docs/model.md, "Any model"): a safetensors file of a model's initial weights that
starts an `atoll syncer --spec FILE` for that model. write_spec writes one from a PyTorch model
(or any named tensors) in their order, with the embeddings the learners will name; read_spec
reads a spec — or the global model `atoll export` and the syncer write — back as float32 arrays.
Pure Python and numpy: the safetensors format is an 8-byte header length, a JSON header and the
tensors' bytes."""
from __future__ import annotations

import json
import os
import struct
import tempfile
from collections import OrderedDict
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np

from ._params import is_tensor, named

__all__ = ["write_spec", "read_spec"]

_MAX_HEADER = 100 << 20  # the reference implementation's limit


def _float32(name: str, value: Any) -> np.ndarray:
    if is_tensor(value):
        value = value.detach().to("cpu").float().contiguous().numpy()
    a = np.ascontiguousarray(value, dtype=np.float32)
    if not np.all(np.isfinite(a)):
        raise ValueError("parameter '%s' has values that are not finite: a spec's weights must be" % name)
    return a


def write_spec(params: Any, path: str, embeddings: Sequence[str] = (),
               metadata: Optional[Mapping[str, str]] = None) -> int:
    """Writes the spec of `params` (a module, named parameters or a {name: tensor} mapping) to
    `path`: float32, in this order, `atoll.embeddings` listing `embeddings` (the tensors merged by
    weighted mean; the learners must pass the same names). `metadata` adds string entries to the
    header (keys starting with "atoll." are atoll's). Atomic (a temp file renamed over `path`).
    Returns the number of parameters. ValueError for an empty model, unknown embedding names, a
    reserved metadata key or non-finite values; the file is then not written."""
    items = named(params)
    if not items:
        raise ValueError("no parameters: a spec needs the model's tensors")
    names = [n for n, _ in items]
    if len(set(names)) != len(names):
        raise ValueError("parameter names repeat")
    unknown = [e for e in embeddings if e not in names]
    if unknown:
        raise ValueError("embeddings names parameters that do not exist: %s" % ", ".join(unknown))
    meta: Dict[str, str] = {}
    for k, v in (metadata or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise ValueError("metadata maps strings to strings, got %r: %r" % (k, v))
        if k.startswith("atoll."):
            raise ValueError("metadata key '%s' is reserved for atoll" % k)
        meta[k] = v
    meta["atoll.embeddings"] = json.dumps(list(embeddings))
    arrays = [(n, _float32(n, v)) for n, v in items]
    header: Dict[str, Any] = OrderedDict([("__metadata__", meta)])
    offset = 0
    for n, a in arrays:
        header[n] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for _, a in arrays:
                f.write(a.tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return sum(int(a.size) for _, a in arrays)


def _decode(dtype: str, raw: bytes, shape: Sequence[int], name: str) -> np.ndarray:
    if dtype == "F32":
        a = np.frombuffer(raw, dtype="<f4")
    elif dtype == "F16":
        a = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    elif dtype == "BF16":
        a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        raise ValueError("tensor '%s' is %s: atoll reads F32, BF16 and F16" % (name, dtype))
    return a.astype(np.float32).reshape(tuple(shape))


def read_spec(path: str) -> Tuple["OrderedDict[str, np.ndarray]", Dict[str, str]]:
    """The tensors of a safetensors file as float32 arrays in data order, and its metadata.
    ValueError for a file that is not safetensors or is cut short."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("%s is not a safetensors file (shorter than 8 bytes)" % path)
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER:
            raise ValueError("%s: header of %d bytes (not safetensors?)" % (path, n))
        try:
            header = json.loads(f.read(n))
        except ValueError as e:
            raise ValueError("%s: the header is not JSON (%s)" % (path, e)) from None
        data = f.read()
    meta = header.pop("__metadata__", {}) or {}
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    out: "OrderedDict[str, np.ndarray]" = OrderedDict()
    for name, e in entries:
        begin, end = e["data_offsets"]
        if end > len(data) or begin > end:
            raise ValueError("%s is cut short: tensor '%s' ends at byte %d of %d" % (path, name, end, len(data)))
        out[name] = _decode(e["dtype"], data[begin:end], e["shape"], name)
    return out, dict(meta)
