"""A torchrun job as one learner (docs/decisions/010 for the C++ units; docs/python.md, "torchrun
jobs"): rank 0 of the unit's process group talks to the syncer; every step the ranks sum their
token counts (and average their losses) so rank 0 reports the unit's, and after rank 0 applied
merged fragments it broadcasts those fragments' values — only those — over the unit's own group
(NCCL on GPUs, Gloo on CPUs), so every rank holds the same bits after every step."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from ._params import _torch


def _dist() -> Any:
    import torch.distributed as dist  # only units need it

    return dist


class Unit:
    """The ranks of one learner: collectives over `group` (None: the default group)."""

    def __init__(self, group: Any) -> None:
        if _torch is None:
            raise TypeError("process_group needs torch")
        dist = _dist()
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("process_group given but torch.distributed is not initialised "
                             "(torch.distributed.init_process_group first)")
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.src = self._global_rank(0)
        backend = dist.get_backend(group)
        self.device = (_torch.device("cuda", _torch.cuda.current_device()) if backend == "nccl"
                       else _torch.device("cpu"))

    def _global_rank(self, group_rank: int) -> int:
        dist = _dist()
        if self.group is None or self.group is dist.group.WORLD:
            return group_rank
        get = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
        return get(self.group, group_rank)

    def share(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank (pickled; small things only)."""
        box = [obj if self.rank == 0 else None]
        _dist().broadcast_object_list(box, src=self.src, group=self.group,
                                      device=self.device if self.device.type == "cuda" else None)
        return box[0]

    def sum_tokens(self, tokens: int, loss: float) -> Tuple[int, float]:
        """The unit's tokens (summed) and loss (averaged) of this step."""
        t = _torch.tensor([float(tokens), float(loss)], dtype=_torch.float64, device=self.device)
        _dist().all_reduce(t, group=self.group)
        return int(round(t[0].item())), t[1].item() / self.size

    def ints(self, values: Optional[Sequence[int]], n: int) -> List[int]:
        """Rank 0's `values` (n integers) on every rank."""
        t = _torch.zeros(n, dtype=_torch.int64, device=self.device)
        if self.rank == 0:
            t[:len(values)] = _torch.tensor(list(values), dtype=_torch.int64)
        _dist().broadcast(t, src=self.src, group=self.group)
        return [int(v) for v in t.tolist()]

    def broadcast_views(self, views: Sequence[Any]) -> None:
        """Rank 0's values of every view (1-D views of the parameters) on every rank: one
        broadcast per (dtype, device), through a flat buffer."""
        groups: Dict[Tuple[Any, Any], List[Any]] = {}
        for v in views:
            groups.setdefault((v.dtype, v.device), []).append(v)
        for (dtype, device), vs in groups.items():
            n = sum(v.numel() for v in vs)
            if self.rank == 0:
                buf = _torch.cat([v.reshape(-1) for v in vs]) if len(vs) > 1 else vs[0].reshape(-1).clone()
            else:
                buf = _torch.empty(n, dtype=dtype, device=device)
            _dist().broadcast(buf, src=self.src, group=self.group)
            if self.rank != 0:
                pos = 0
                with _torch.no_grad():
                    for v in vs:
                        v.copy_(buf[pos:pos + v.numel()].view_as(v))
                        pos += v.numel()
