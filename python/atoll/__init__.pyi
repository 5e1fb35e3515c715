from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

class RefusedError(RuntimeError):
    """The syncer refused this learner for good (run id, model, plan or schedule differ)."""

_Param = Any  # torch.Tensor or numpy.ndarray
_Params = Union[Any, Mapping[str, _Param], Iterable[Tuple[str, _Param]], Iterable[_Param]]

class Learner:
    shared: Dict[str, bool]
    def __init__(self, syncer: str, params: _Params, *, run_id: str = ..., learner_id: int = ...,
                 embeddings: Sequence[str] = ..., token: Optional[str] = ...,
                 token_file: Optional[str] = ..., tls_ca: Optional[str] = ...,
                 tls_server_name: Optional[str] = ..., tls_cert: Optional[str] = ...,
                 tls_key: Optional[str] = ..., mode: str = ..., plan: str = ..., fragments: int = ...,
                 H: int = ..., tau: int = ..., alpha: float = ..., keep_progress: bool = ...,
                 join_timeout_s: float = ..., rejoin: bool = ...) -> None: ...
    def step(self, tokens: int, loss: float = ...) -> int: ...
    @property
    def finish_requested(self) -> bool: ...
    @property
    def closed(self) -> bool: ...
    def counters(self) -> Dict[str, Union[int, bool]]: ...
    def close(self, flush_timeout_s: float = ...) -> None: ...
    def __enter__(self) -> "Learner": ...
    def __exit__(self, *exc: Any) -> None: ...
