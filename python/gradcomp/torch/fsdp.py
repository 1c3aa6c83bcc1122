"""gradcomp as FSDP2's reduce-scatter: compressed gradients with error feedback for
``fully_shard`` (torch 2.x).

::

    from torch.distributed.fsdp import FSDPModule, fully_shard

    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_custom_reduce_scatter(gradcomp.torch.fsdp.ReduceScatter(method="topk_ef", density=0.01))

FSDP hands the reduce-scatter each parameter group's unsharded gradient laid out as W
equal chunks, chunk j destined for rank j. :class:`ReduceScatter` compresses the whole
of it on every rank with its compressor (its selector and corrector: error feedback
keeps what is not sent), sends each chunk's entries to the chunk's owner
(``all_to_all_single``: counts, then the entries), and the owner writes the sum of what
it received, divided as FSDP's reduce op asks (``AVG``: by W; ``SUM``: not), into the
shard FSDP expects; entries nobody sent are 0. This is the C++
``comm::sparse_allreduce::reduce_scatter`` (docs/algorithms.md, "Global top-k", steps
1-3), over the process group FSDP passes.

Memory: one compressor per parameter group (one ReduceScatter per FSDPModule), whose
residual is the size of the group's *unsharded* gradient, on every rank: with error
feedback that is one float per parameter of the group, W times the shard FSDP keeps.

A NaN or infinity on any rank, a bad shape, or ranks configured differently make every
rank raise the same :class:`gradcomp.Error` (nothing changes, no rank waits). CPU
tensors (gloo); torch 1.x has no FSDP2.
"""

from typing import Any, Dict, Optional, Sequence, Union

import torch
import torch.distributed as dist

from .. import _C
from .. import _arguments as check
from . import Compressor

__all__ = ["ReduceScatter"]

try:  # torch 2.x
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _ReduceScatterBase
except Exception:  # torch 1.x: no FSDP2 (1.13's FSDP raises ValueError on import under Python 3.11)
    _ReduceScatterBase = object

_WHO = "fsdp ReduceScatter"


class ReduceScatter(_ReduceScatterBase):
    """A reduce-scatter for ``FSDPModule.set_custom_reduce_scatter`` that moves each
    rank's compressed gradient instead of the dense one.

    ``method``, ``density`` and ``**options`` are those of
    :class:`gradcomp.torch.Compressor` (checked here). ``bytes_sent`` counts the bytes
    this rank has put into the collectives, ``collectives`` the collectives.
    ``state_dict()`` / ``load_state_dict()`` keep the compressor's memory.
    """

    def __init__(self, method: str = "topk_ef", density: Optional[float] = None,
                 **options: Union[bool, int, float, str, dict]) -> None:
        self.method = check.text(_WHO, "method", method)
        self.options = dict(options)
        if density is not None:
            self.options["density"] = check.real(_WHO, "density", density)
        Compressor(1 << 10, self.method, **self.options)  # refuses bad options now
        self.compressor = None
        self._exchange = None
        self._group = None
        self._saved = None
        self._calls = 0
        self._elements = 0

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """FSDP's buffers: plain tensors."""
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup, op: Any,
                 async_op: bool = False) -> None:
        """``output_tensor`` (this rank's shard) = the reduce of the ranks' compressed
        ``input_tensor`` chunks for this rank. Runs to completion: returns None."""
        # FSDP hands every rank tensors of the same kinds, so a refusal here is every rank's.
        check.tensor(_WHO, "output_tensor", output_tensor)
        check.tensor(_WHO, "input_tensor", input_tensor)
        if not isinstance(group, dist.ProcessGroup):
            check.fail(_WHO, f"group must be a torch.distributed ProcessGroup, got {check.kind(group)}")
        world = group.size()
        if op == dist.ReduceOp.AVG:
            scale = 1.0 / world
        elif op == dist.ReduceOp.SUM:
            scale = 1.0
        else:
            check.fail(_WHO, f"reduce op {op} is not supported (AVG or SUM)")
        grad = input_tensor.reshape(-1)
        if grad.dtype != torch.float32:
            grad = grad.float()
        exchange = self._exchange_for(grad.numel(), grad.device, group)
        shard = torch.empty(output_tensor.numel(), dtype=torch.float32, device=output_tensor.device)
        exchange.reduce_scatter(grad.contiguous(), shard, scale)
        output_tensor.copy_(shard.view_as(output_tensor))
        self._calls += 1
        self._elements = grad.numel()
        return None

    def _exchange_for(self, numel, device, group):
        if self.compressor is None or self.compressor.numel != numel:
            c = Compressor(numel, self.method, device=device, **self.options)
            if self._saved is not None:
                c.load_state_dict(self._saved)
                self._saved = None
            self.compressor = c
            self._exchange = None
        if self._exchange is None or self._group is not group:
            self._exchange = _C.SparseAllreduce(self.compressor._impl, group, 0)
            self._group = group
        return self._exchange

    @property
    def bytes_sent(self) -> int:
        """Bytes this rank has put into the collectives."""
        return 0 if self._exchange is None else self._exchange.bytes_sent

    @property
    def collectives(self) -> int:
        """Collectives issued."""
        return 0 if self._exchange is None else self._exchange.collectives

    def stats(self) -> Dict[str, Any]:
        """What this reduce-scatter moved on this rank: ``calls``, ``bytes_sent`` and
        ``bytes_received`` (every call's, summed), ``collectives``, and of the last call
        ``elements`` (the unsharded gradient's), ``entries_sent`` (this rank's message) and
        ``density`` (entries_sent / elements)."""
        x = self._exchange
        entries = 0 if x is None else x.entries
        return {"calls": self._calls, "bytes_sent": self.bytes_sent,
                "bytes_received": 0 if x is None else x.bytes_received, "collectives": self.collectives,
                "elements": self._elements, "entries_sent": entries,
                "density": entries / self._elements if self._elements else 0.0}

    def state_dict(self) -> Optional[Dict[str, Any]]:
        """The compressor's memory (the residual of the unsharded gradient)."""
        if self.compressor is not None:
            return self.compressor.state_dict()
        return self._saved

    def load_state_dict(self, state_dict: Optional[Dict[str, Any]]) -> None:
        """Restores the memory on the next call (when the gradient's size is known)."""
        self._saved = state_dict
        self.compressor = None
        self._exchange = None
