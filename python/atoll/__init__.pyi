from collections import OrderedDict
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

class RefusedError(RuntimeError):
    """The syncer refused this learner (run id, model, plan, schedule, an id already held)."""
    code: str

class AccessRefusedError(RefusedError, PermissionError):
    """The syncer refused this learner's token or credentials."""

_Param = Any  # torch.Tensor or numpy.ndarray
_Params = Union[Any, Mapping[str, _Param], Iterable[Tuple[str, _Param]], Iterable[_Param]]

class Learner:
    def __init__(self, syncer: str, params: _Params, *, run_id: str = ..., learner_id: int = ...,
                 embeddings: Sequence[str] = ..., token: Optional[str] = ...,
                 token_file: Optional[str] = ..., tls_ca: Optional[str] = ...,
                 tls_server_name: Optional[str] = ..., tls_cert: Optional[str] = ...,
                 tls_key: Optional[str] = ..., mode: str = ..., plan: str = ..., fragments: int = ...,
                 H: int = ..., tau: int = ..., alpha: float = ..., keep_progress: bool = ...,
                 join_timeout_s: float = ..., rejoin: bool = ..., state_dir: Optional[str] = ...,
                 refresh: Optional[_Params] = ..., low_precision: str = ..., process_group: Any = ...,
                 call_timeout_s: float = ..., push_timeout_s: float = ..., min_link_mbps: float = ...,
                 heartbeat_s: float = ..., backoff_initial_s: float = ..., backoff_max_s: float = ...,
                 async_sends: Optional[bool] = ...) -> None: ...
    @property
    def shared(self) -> Dict[str, bool]: ...
    @property
    def rank(self) -> int: ...
    def step(self, tokens: int, loss: float = ...) -> int: ...
    @property
    def finish_requested(self) -> bool: ...
    @property
    def closed(self) -> bool: ...
    def counters(self) -> Dict[str, Union[int, bool]]: ...
    def state_dict(self) -> Dict[str, Any]: ...
    def close(self, flush_timeout_s: float = ...) -> None: ...
    def __enter__(self) -> "Learner": ...
    def __exit__(self, *exc: Any) -> None: ...

def write_spec(params: _Params, path: str, embeddings: Sequence[str] = ...,
               metadata: Optional[Mapping[str, str]] = ...) -> int: ...
def read_spec(path: str) -> Tuple["OrderedDict[str, np.ndarray]", Dict[str, str]]: ...
