"""atoll.Learner: one learner of a run, over the C API (docs/python.md)."""
from __future__ import annotations

import json
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _atoll
from ._params import LOW_PRECISION, _torch, check_value, is_tensor, named, shareable
from ._staging import Slot, Staging
from ._unit import Unit

Receipts = List[Tuple[int, bool]]


class _Refresh:
    """Low-precision copies (`refresh=`) of exchanged parameters, refreshed from them."""

    def __init__(self, refresh: Any, items: Sequence[Tuple[str, Any]]) -> None:
        self.pairs: Dict[int, Tuple[Any, Any]] = {}
        if refresh is None:
            return
        index = {n: i for i, (n, _) in enumerate(items)}
        for name, target in named(refresh, "refresh"):
            if name not in index:
                raise ValueError("refresh names '%s', which is not among params" % name)
            source = items[index[name]][1]
            if not (is_tensor(target) and is_tensor(source)):
                raise TypeError("refresh needs torch tensors ('%s')" % name)
            if tuple(target.shape) != tuple(source.shape) or not target.is_contiguous() or not source.is_contiguous():
                raise ValueError("refresh '%s' must be contiguous and of its parameter's shape %s, not %s"
                                 % (name, tuple(source.shape), tuple(target.shape)))
            self.pairs[index[name]] = (source, target)

    def all(self) -> None:
        if not self.pairs:
            return
        with _torch.no_grad():
            for source, target in self.pairs.values():
                target.copy_(source.detach())

    def fragments(self, receipts: Receipts, plan: Sequence[Sequence[Tuple[int, int, int]]]) -> None:
        if not self.pairs or not receipts:
            return
        with _torch.no_grad():
            for p, _ in receipts:
                for i, off, cnt in plan[p]:
                    if i in self.pairs:
                        source, target = self.pairs[i]
                        target.view(-1)[off:off + cnt].copy_(source.detach().view(-1)[off:off + cnt])


def _check_args(syncer: Any, items: List[Tuple[str, Any]], embeddings: Sequence[str], low_precision: str) -> None:
    if not isinstance(syncer, str):
        raise TypeError("syncer must be a 'host:port' string")
    if not items:
        raise ValueError("params is empty: atoll needs the model's parameters")
    names = {n for n, _ in items}
    unknown = [e for e in embeddings if e not in names]
    if unknown:
        raise ValueError("embeddings names parameters that do not exist: %s" % ", ".join(unknown))
    if low_precision not in LOW_PRECISION:
        raise ValueError("low_precision must be one of %s, not %r" % (", ".join(LOW_PRECISION), low_precision))
    for name, value in items:
        check_value(name, value, low_precision)


class _Core:
    """The learner of one process (rank 0 of a unit): the C handle, its staging, one lock."""

    def __init__(self, items: List[Tuple[str, Any]], embeddings: Sequence[str], options: Dict[str, Any],
                 settings: Dict[str, Any], alpha: float, async_sends: Optional[bool]) -> None:
        self.shared: Dict[str, bool] = {}
        slots, views = [], []
        for i, (name, value) in enumerate(items):
            if shareable(value):
                view = value.detach().numpy() if is_tensor(value) else value
                views.append((name, view, name in embeddings, False))
                self.shared[name] = True
            else:
                slot = Slot(i, name, value)
                slots.append(slot)
                views.append((name, slot.host.reshape(tuple(value.shape)), name in embeddings, True))
                self.shared[name] = False
        self.staging = Staging(slots, alpha, async_sends, options.get("mode") == "diloco")
        self.lock = threading.Lock()
        try:
            self.staging.load_all()  # the join reads the initial values
            self.impl = _atoll.Learner(options, views, settings)
        except BaseException:
            self.staging.stop()
            raise
        self.plan = [self.impl.fragment_slices(p) for p in range(self.impl.num_fragments())]
        self.staging.set_plan(self.plan)
        self.opened: Receipts = self.impl.receipts()  # the join's global model
        self.sends: List[int] = []
        self.staging.receive(self.opened)

    def _send(self, p: int, values: np.ndarray) -> None:
        with self.lock:
            self.impl.send(p, values)

    def step(self, tokens: int, loss: float) -> Tuple[int, Receipts]:
        self.staging.before_step()
        if self.staging.slots and not self.staging.asynchronous:
            with self.lock:
                due = self.impl.due()
            for p in due:  # given before the step, which sends them at once
                self.staging.send(p, self._send)
        with self.lock:
            applied = self.impl.step(tokens, loss)
            self.sends = self.impl.sends()
            pending = self.impl.pending()
            receipts = self.impl.receipts()
        for p in pending:  # this step's values, before its receipts change them
            self.staging.send(p, self._send)
        self.staging.receive(receipts)
        return applied, receipts

    def close(self, flush_timeout_s: float) -> None:
        try:
            self.staging.before_step()
        finally:
            self.staging.stop()
        self.staging.load_all()  # the flush pushes the live values
        try:
            with self.lock:
                self.impl.close(flush_timeout_s)
        finally:
            self.staging.store_all()  # the final model, with the merges the flush took in

    def call(self, name: str) -> Any:
        with self.lock:
            return getattr(self.impl, name)()


class Learner:
    """One learner of an atoll run (docs/python.md)."""

    def __init__(self, syncer: str, params: Any, *, run_id: str = "atoll", learner_id: int = -1,
                 embeddings: Sequence[str] = (), token: Optional[str] = None,
                 token_file: Optional[str] = None, tls_ca: Optional[str] = None,
                 tls_server_name: Optional[str] = None, tls_cert: Optional[str] = None,
                 tls_key: Optional[str] = None, mode: str = "decoupled", plan: str = "balanced",
                 fragments: int = 24, H: int = 24, tau: int = 2, alpha: float = 0.0,
                 keep_progress: bool = True, join_timeout_s: float = 20.0, rejoin: bool = False,
                 state_dir: Optional[str] = None, refresh: Any = None, low_precision: str = "refuse",
                 process_group: Any = None, call_timeout_s: float = 10.0, push_timeout_s: float = 60.0,
                 min_link_mbps: float = 10.0, heartbeat_s: float = 0.5, backoff_initial_s: float = 0.2,
                 backoff_max_s: float = 5.0, async_sends: Optional[bool] = None) -> None:
        items = named(params)
        _check_args(syncer, items, embeddings, low_precision)
        self._items = items
        self._refresh = _Refresh(refresh, items)
        self._unit = Unit(process_group) if process_group is not None else None
        if self._unit is not None:
            for name, value in items:
                if not is_tensor(value) or not value.is_contiguous():
                    raise TypeError("a unit's parameters are contiguous torch tensors ('%s')" % name)
        self._core: Optional[_Core] = None
        self._finish = False
        self._closed = False
        self._applied: List[int] = []
        self._sent: List[int] = []
        options = dict(syncer=syncer, run_id=run_id, learner_id=learner_id, token=token,
                       token_file=token_file, tls_ca=tls_ca, tls_server_name=tls_server_name,
                       tls_cert=tls_cert, tls_key=tls_key, mode=mode, plan=plan, fragments=fragments,
                       H=H, tau=tau, alpha=alpha, keep_progress=keep_progress,
                       join_timeout_s=join_timeout_s, rejoin=rejoin)
        settings = dict(state_dir=state_dir, call_timeout_s=call_timeout_s, push_timeout_s=push_timeout_s,
                        min_link_mbps=min_link_mbps, heartbeat_s=heartbeat_s, backoff_initial_s=backoff_initial_s,
                        backoff_max_s=backoff_max_s)
        if self._unit is None:
            self._core = _Core(items, embeddings, options, settings, float(alpha), async_sends)
            self._plan = self._core.plan
            self._applied = [p for p, _ in self._core.opened]
        else:
            self._open_unit(items, embeddings, options, settings, float(alpha), async_sends)
        self._refresh.all()

    def _open_unit(self, items: List[Tuple[str, Any]], embeddings: Sequence[str], options: Dict[str, Any],
                   settings: Dict[str, Any], alpha: float, async_sends: Optional[bool]) -> None:
        """Rank 0 opens; every rank learns the plan (or rank 0's error) and takes rank 0's model."""
        unit = self._unit
        error: Optional[BaseException] = None
        if unit.rank == 0:
            try:
                self._core = _Core(items, embeddings, options, settings, alpha, async_sends)
            except BaseException as e:  # every rank must hear of it, or the others would wait forever
                error = e
        info = unit.share(None if unit.rank != 0 else
                          {"plan": self._core.plan if self._core else None,
                           "error": None if error is None else (type(error).__name__, str(error))})
        if error is not None:
            raise error
        if info["error"] is not None:
            kind, message = info["error"]
            raise _rank0_error(kind, message)
        self._plan = info["plan"]
        unit.broadcast_views([v.detach().view(-1) for _, v in items])

    @property
    def shared(self) -> Dict[str, bool]:
        """Per parameter: True when atoll reads and writes its memory (rank 0 of a unit; else {})."""
        return dict(self._core.shared) if self._core is not None else {}

    @property
    def rank(self) -> int:
        return 0 if self._unit is None else self._unit.rank

    def step(self, tokens: int, loss: float = 0.0) -> int:
        """After each inner step: its token count and loss. Returns the fragments applied."""
        if isinstance(tokens, bool) or not isinstance(tokens, (int, np.integer)):
            raise TypeError("tokens must be an int, got %s" % type(tokens).__name__)
        if self._closed:
            raise ValueError("this learner is closed")
        if self._unit is None:
            applied, receipts = self._core.step(int(tokens), float(loss))
            self._refresh.fragments(receipts, self._plan)
            self._applied, self._sent = [p for p, _ in receipts], list(self._core.sends)
            return applied
        return self._unit_step(int(tokens), float(loss))

    @property
    def plan(self) -> List[List[Tuple[str, int, int]]]:
        """The fragment plan: per fragment its slices (parameter name, first element, count)."""
        return [[(self._items[i][0], off, cnt) for i, off, cnt in slices] for slices in self._plan]

    @property
    def applied_fragments(self) -> List[int]:
        """The fragments the last step (or the constructor's join) wrote into the parameters."""
        return list(self._applied)

    @property
    def sent_fragments(self) -> List[int]:
        """The fragments the last step scheduled for sending (rank 0 of a unit; [] elsewhere)."""
        return list(self._sent)

    def _unit_step(self, tokens: int, loss: float) -> int:
        unit = self._unit
        tokens, loss = unit.sum_tokens(tokens, loss)
        header: Optional[List[int]] = None
        error: Optional[BaseException] = None
        if unit.rank == 0:
            try:
                applied, receipts = self._core.step(tokens, loss)
                header = [0, int(self._core.call("finish_requested")), applied, len(receipts)] + [p for p, _ in receipts]
            except BaseException as e:
                error = e
                header = [1, 0, 0, 0]
        header = unit.ints(header, 4 + len(self._plan))
        if header[0] != 0:
            if error is not None:
                raise error
            raise RuntimeError("rank 0 of this unit failed in step(); see its error")
        self._finish = bool(header[1])
        fragments = header[4:4 + header[3]]
        self._applied = list(fragments)
        self._sent = list(self._core.sends) if self._core is not None else []
        views = [self._items[i][1].detach().view(-1)[off:off + cnt] for p in fragments for i, off, cnt in self._plan[p]]
        unit.broadcast_views(views)
        self._refresh.fragments([(p, False) for p in fragments], self._plan)
        return header[2]

    @property
    def finish_requested(self) -> bool:
        """True once the syncer asked the run to finish: stop training and close()."""
        if self._closed:
            raise ValueError("this learner is closed")
        if self._unit is not None:
            return self._finish
        return self._core.call("finish_requested")

    @property
    def closed(self) -> bool:
        return self._closed

    def counters(self) -> Dict[str, Union[int, bool]]:
        """Pushes, pulls, fragments applied, joins, bytes (payload and device<->host), the id..."""
        if self._closed:
            raise ValueError("this learner is closed")
        k: Dict[str, Union[int, bool]] = {"rank": self.rank}
        if self._core is not None:
            k.update(self._core.call("counters"))
            for name, value in json.loads(self._core.call("state"))["counters"].items():
                k.setdefault(name, value)
            k["bytes_to_host"] = self._core.staging.bytes_to_host
            k["bytes_to_device"] = self._core.staging.bytes_to_device
        return k

    def state_dict(self) -> Dict[str, Any]:
        """What the state folder's learner.json holds: id, step, tokens, held fragment versions and
        checksums, counters (rank 0 of a unit; {} on the other ranks)."""
        if self._closed:
            raise ValueError("this learner is closed")
        return json.loads(self._core.call("state")) if self._core is not None else {}

    def close(self, flush_timeout_s: float = 30.0) -> None:
        """Pushes the progress not sent yet (bounded), says goodbye. Idempotent. In a unit every
        rank calls it: rank 0 closes, then every rank takes rank 0's final model."""
        if self._closed:
            return
        self._closed = True
        error: Optional[BaseException] = None
        if self._core is not None:
            try:
                self._core.close(float(flush_timeout_s))
            except BaseException as e:
                error = e
        if self._unit is not None:
            self._unit.broadcast_views([v.detach().view(-1) for _, v in self._items])
        self._refresh.all()
        if error is not None:
            raise error

    def __enter__(self) -> "Learner":
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.closed:
            self.close(30.0 if exc[0] is None else 0.0)


def _rank0_error(kind: str, message: str) -> BaseException:
    """Rank 0's error on another rank, as the same kind where it is one of atoll's or a builtin."""
    known = {"RefusedError": _atoll.RefusedError, "AccessRefusedError": _atoll.AccessRefusedError,
             "ValueError": ValueError, "TypeError": TypeError, "ConnectionError": ConnectionError,
             "PermissionError": PermissionError, "FileNotFoundError": FileNotFoundError}
    return known.get(kind, RuntimeError)("rank 0 of this unit: " + message)
