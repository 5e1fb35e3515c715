"""Staged parameters: the ones atoll cannot share (a CUDA tensor, bf16, float64, a non-contiguous
view). Each has a host float32 buffer that the C API reads only when the learner opens and closes;
between, only the fragments that move are copied (include/atoll/c_api.h, "Staged buffers"):

- a fragment due to be sent: its staged slices, device -> host, after the step that made it due;
- a fragment a step applied: its receipt, host -> device, in the parameter's dtype.

On CUDA the device -> host copies go into pinned buffers on a side stream: the slices are first
copied on the device on the current stream (so neither atoll's receipts nor the next optimizer step
can change them under the copy), the side stream waits for that and copies them to the host while
the next step computes, and a copier thread hands them to atoll once the copy's event completes.
Host -> device copies come from pinned buffers, non-blocking on the current stream; before atoll
writes those buffers again (the next step) the learner waits for the event recorded after them.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._params import _torch, is_tensor

SendFn = Callable[[int, np.ndarray], None]


class Slot:
    """One staged parameter: its live value and atoll's host float32 buffer (`host`)."""

    def __init__(self, index: int, name: str, value: Any) -> None:
        self.index, self.name, self.value = index, name, value
        self.torch = is_tensor(value)
        self.cuda = self.torch and value.device.type == "cuda"
        if self.torch:
            self.numel, self.elem = value.numel(), value.element_size()
            self.contiguous = value.is_contiguous()
        else:
            self.numel, self.elem = int(value.size), value.itemsize
            self.contiguous = value.flags.c_contiguous
        if self.cuda:
            pin = dict(pin_memory=True)
            self.host_t = _torch.empty(self.numel, dtype=_torch.float32, **pin)
            self.send_t = _torch.empty(self.numel, dtype=value.dtype, **pin)  # device -> host lands here
            self.recv_t = None if value.dtype == _torch.float32 else _torch.empty(self.numel, dtype=value.dtype, **pin)
            self.host = self.host_t.numpy()
        else:
            self.host = np.empty(self.numel, dtype=np.float32)

    # ---- host values (CPU tensors and numpy arrays) ----
    def read(self, off: int, cnt: int) -> np.ndarray:
        """A float32 copy of elements [off, off + cnt) of the live value (host parameters)."""
        if self.torch:
            v = self.value.detach()
            flat = v.view(-1) if self.contiguous else v.reshape(-1)
            return flat[off:off + cnt].to(_torch.float32).numpy().copy()
        if self.contiguous:
            return np.array(self.value.reshape(-1)[off:off + cnt], dtype=np.float32)
        return np.array(self.value.flat[off:off + cnt], dtype=np.float32)

    def receive(self, off: int, cnt: int, additive: bool, alpha: float) -> None:
        """Applies the receipt in host[off:off + cnt] to the live value, in the value's dtype."""
        src = self.host[off:off + cnt]
        if self.cuda:
            if self.recv_t is None:
                pinned = self.host_t[off:off + cnt]
            else:
                pinned = self.recv_t[off:off + cnt]
                pinned.copy_(self.host_t[off:off + cnt])  # to the parameter's dtype on the host
            x = pinned.to(self.value.device, non_blocking=True)
            self._combine_tensor(off, cnt, x, additive, alpha)
        elif self.torch:
            self._combine_tensor(off, cnt, _torch.from_numpy(src).to(self.value.dtype), additive, alpha)
        else:
            x = src.astype(self.value.dtype)
            if self.contiguous:
                live = self.value.reshape(-1)[off:off + cnt]
                live[...] = _combined(live, x, additive, alpha)
            else:
                self.value.flat[off:off + cnt] = _combined(np.array(self.value.flat[off:off + cnt]), x, additive, alpha)

    def _combine_tensor(self, off: int, cnt: int, x: Any, additive: bool, alpha: float) -> None:
        with _torch.no_grad():
            v = self.value.detach()
            whole = v if self.contiguous else v.contiguous()
            live = whole.view(-1)[off:off + cnt]
            if additive:
                live.add_(x)
            elif alpha == 0.0:
                live.copy_(x)
            else:
                live.mul_(alpha).add_(x, alpha=1.0 - alpha)
            if not self.contiguous:
                v.copy_(whole)

    # ---- device values (CUDA) ----
    def snapshot(self, off: int, cnt: int, side: Any) -> Any:
        """Queues the copy of [off, off + cnt) into the pinned send buffer on `side` (None: copies
        now, on the current stream); returns the pinned buffer."""
        v = self.value.detach()
        live = (v.view(-1) if self.contiguous else v.reshape(-1))[off:off + cnt]
        dst = self.send_t[off:off + cnt]
        if side is None:
            dst.copy_(live)
            return dst
        snap = live.clone()  # on the current stream: the values of this step, before any receipt
        side.wait_stream(_torch.cuda.current_stream(v.device))
        with _torch.cuda.stream(side):
            dst.copy_(snap, non_blocking=True)
        snap.record_stream(side)  # the allocator keeps snap until the side stream has read it
        return dst


def _combined(live: np.ndarray, x: np.ndarray, additive: bool, alpha: float) -> np.ndarray:
    if additive:
        return live + x
    return x if alpha == 0.0 else alpha * live + (1.0 - alpha) * x


class Copier:
    """A thread that runs the hand-overs of device -> host copies (wait for the copy, then send)."""

    def __init__(self) -> None:
        self._jobs: "queue.Queue[Optional[Callable[[], None]]]" = queue.Queue()
        self._error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="atoll-copier", daemon=True)
        self._thread.start()

    def put(self, job: Callable[[], None]) -> None:
        self._jobs.put(job)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                job()
            except BaseException as e:  # raised on the training thread by drain()
                self._error = self._error or e
            finally:
                self._jobs.task_done()

    def drain(self) -> None:
        """Waits until every queued hand-over ran; raises the first error one raised."""
        self._jobs.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def stop(self) -> None:
        self._jobs.put(None)
        self._thread.join()


class Staging:
    """The staged parameters of one learner and the copies of the fragments that move."""

    def __init__(self, slots: Sequence[Slot], alpha: float, async_sends: Optional[bool], synchronous_mode: bool) -> None:
        self.slots = list(slots)
        self.alpha = alpha
        self.bytes_to_host = 0
        self.bytes_to_device = 0
        self._slices: Dict[int, List[Tuple[Slot, int, int]]] = {}
        devices = {s.value.device for s in self.slots if s.cuda}
        if len(devices) > 1:
            raise ValueError("staged parameters on several CUDA devices (%s): one learner's parameters live on "
                             "one device" % ", ".join(sorted(str(d) for d in devices)))
        self.device = next(iter(devices)) if devices else None
        self._side = _torch.cuda.Stream(device=self.device) if self.device is not None else None
        self._h2d_done: Any = None
        # Asynchronous hand-overs by default on CUDA; never at diloco's barrier, which waits only
        # for the sends it has when the step ends.
        use_thread = self.device is not None if async_sends is None else bool(async_sends)
        self._copier = Copier() if use_thread and self.slots and not synchronous_mode else None

    def set_plan(self, plan: Sequence[Sequence[Tuple[int, int, int]]]) -> None:
        """plan[p]: fragment p's (parameter index, offset, count) slices; keeps the staged ones."""
        by_index = {s.index: s for s in self.slots}
        self._slices = {p: [(by_index[i], o, c) for i, o, c in slices if i in by_index]
                        for p, slices in enumerate(plan)}

    def load_all(self) -> None:
        """host <- live for every staged parameter (before the learner opens and closes)."""
        self.wait_transfers()
        for s in self.slots:
            if s.cuda:  # in the parameter's dtype over the bus, to float32 on the host
                s.send_t.copy_(s.value.detach().reshape(-1))
                s.host_t.copy_(s.send_t)
            else:
                s.host[...] = s.read(0, s.numel)
            self.bytes_to_host += s.numel * s.elem

    def store_all(self) -> None:
        """live <- host for every staged parameter (after the learner closed: its final model)."""
        for s in self.slots:
            s.receive(0, s.numel, False, 0.0)
            self.bytes_to_device += s.numel * s.elem
        self._record_h2d()
        self.wait_transfers()

    def before_step(self) -> None:
        """Every hand-over of the last step done and every host -> device copy read its buffer."""
        if self._copier is not None:
            self._copier.drain()
        self.wait_transfers()

    def wait_transfers(self) -> None:
        if self._h2d_done is not None:
            self._h2d_done.synchronize()
            self._h2d_done = None

    @property
    def asynchronous(self) -> bool:
        """Whether sends are handed over after the step, by the copier thread."""
        return self._copier is not None

    def send(self, p: int, send: SendFn) -> None:
        """Fragment p's staged values, as they are now, to `send`: at once, or (asynchronous)
        copied on the side stream and handed over by the copier thread."""
        pieces = self._slices.get(p, [])
        if not pieces:
            return
        n = sum(c for _, _, c in pieces)
        self.bytes_to_host += sum(c * s.elem for s, _, c in pieces)
        side = self._side if self.asynchronous else None
        if self.device is not None and any(s.cuda for s, _, _ in pieces):
            views = [(s.snapshot(o, c, side) if s.cuda else s.read(o, c)) for s, o, c in pieces]
            done = None
            if side is not None:
                done = _torch.cuda.Event()
                done.record(side)
            job = lambda: send(p, _gather(views, n, done))  # noqa: E731
        else:
            values = _gather([s.read(o, c) for s, o, c in pieces], n, None)
            job = lambda: send(p, values)  # noqa: E731
        if self._copier is not None:
            self._copier.put(job)
        else:
            job()

    def receive(self, receipts: Sequence[Tuple[int, bool]]) -> None:
        """Applies each receipt's staged slices to the live values."""
        for p, additive in receipts:
            for s, o, c in self._slices.get(p, []):
                s.receive(o, c, additive, self.alpha)
                self.bytes_to_device += c * s.elem
        if receipts:
            self._record_h2d()

    def _record_h2d(self) -> None:
        if self.device is not None:
            self._h2d_done = _torch.cuda.Event()
            self._h2d_done.record(_torch.cuda.current_stream(self.device))

    def stop(self) -> None:
        if self._copier is not None:
            self._copier.stop()
            self._copier = None


def _gather(views: Sequence[Any], n: int, done: Any) -> np.ndarray:
    """The staged values of one fragment as float32, after `done` (a CUDA event) completed."""
    if done is not None:
        done.synchronize()
    out = np.empty(n, dtype=np.float32)
    pos = 0
    for v in views:
        k = len(v)
        if isinstance(v, np.ndarray):
            out[pos:pos + k] = v
        else:
            _torch.from_numpy(out[pos:pos + k]).copy_(v)  # pinned (any dtype) -> float32
        pos += k
    return out
