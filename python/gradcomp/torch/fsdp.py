"""gradcomp in FSDP2 (``fully_shard``, torch 2.x): the reduce-scatter of each parameter
group's gradient compressed, with error feedback, and HSDP's all-reduce across replicas
compressed too.

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
(in blocks of a room the ranks agreed, each headed by its sender's count, in one
all-to-all), and the owner writes the sum of what
it received, times the factor FSDP's reduce op names (``AVG``: 1/W; ``SUM``: 1;
``PREMUL_SUM(f)``, which ``set_gradient_divide_factor`` makes: f), into the shard FSDP
expects; entries nobody sent are 0. This is the C++
``comm::sparse_allreduce::reduce_scatter`` (docs/algorithms.md, "Global top-k", steps
1-3), over the process group FSDP passes. float32, float16 and bfloat16 gradients
(``MixedPrecisionPolicy(reduce_dtype=...)``) are handed to the compressor as they are.

Hybrid sharding: torch runs native HSDP's all-reduce across replicas itself, densely,
before any hook sees the gradient. To compress it, shard over each replica's ranks only
(``fully_shard(module, mesh=mesh["shard"])``) and give each FSDPModule an
:class:`AllReduce` over the replicate group (``set_all_reduce_hook``): it replaces the
dense all-reduce with Ok-Topk's sparse all-reduce of the shards, with error feedback.

Memory: one compressor per parameter group (one instance per FSDPModule; an instance
refuses a group of another size), whose residual is the size of the group's *unsharded*
gradient, on every rank: with error feedback that is one float per parameter of the
group, W times the shard FSDP keeps; ``memory_bits=8`` stores it in about 1 byte per
parameter, ``memory_bits=4`` in about half of one. On the CPU the workspace of a call
(the selection's lists, the messages, the step's float32 arrays) is given back when the
call ends and allocated again by the next: FSDP reduces its groups one at a time, so a
rank holds every group's residual and one group's workspace. On CUDA each instance keeps
its workspace between calls by default (a device allocation from torch's caching
allocator waits for the current stream, and what that costs per call is not yet
measured on a GPU). ``keep_workspace=True`` or ``False`` chooses either way.

A NaN or infinity on any rank, a bad shape, or ranks configured differently (another
method or error memory, another group size) make every rank raise the same
:class:`gradcomp.Error` (nothing changes, no rank waits); the density may differ by rank
(each rank sends its own k entries). On CUDA tensors the local work runs on the device
(each shard's entries located in the selection, packed, and the owner's checks and
sums), and over NCCL the entries travel as device tensors. Tested on CPU tensors over
gloo; the CUDA tests (CUDA against CPU tensors bit for bit) are written and not yet run
on a GPU. FSDP2's custom reduce-scatter needs a torch that has
``FSDPModule.set_custom_reduce_scatter`` (checked when an instance is made).

Settled once a step (``settle="step"``, the default for CUDA tensors): a call in a
backward pass reads nothing from the device. Its shard is written where the memory is,
predicated on the ranks' verdicts reduced there (the sums where every rank's step
passed, zeros where the ranks refuse it, so that FSDP adds nothing to the gradient),
and the compressor's step stays staged. At the backward pass's end (an autograd final
callback, after FSDP's own) one read brings every call's outcome to the host: each
call's step is committed, or every rank raises the same error from ``backward()``,
before the optimizer can step, the refused calls' memories unchanged. Where a rank has
more entries for a shard than the blocks the ranks agreed hold, the blocks carry the
first of them and only those are committed: the rest stay in that rank's error feedback
for the next step, and the blocks grow (the ranks agree on it then). The first call of
an instance, and any call outside a backward pass, settles before it returns
(``settle="call"``, the default for CPU tensors, where a read costs nothing and each
call's workspace is given back at once; settled by step, a rank holds every queued
call's workspace until the end of the backward pass). :class:`AllReduce` settles the
same way, in the same read: its output is the replicas' mean as queued (zeros where the
ranks refuse the step), and where a rank's entries for a region, or a region's part of
the global selection, outgrow the room the ranks agreed, they carry the lowest indices
that fit and the rest stays in the error feedback.
"""

import math
import weakref
from typing import Any, Dict, Optional, Sequence, Union

import torch
import torch.distributed as dist

from .. import _C, Error
from .. import _arguments as check
from . import Compressor, _held_by

__all__ = ["ReduceScatter", "AllReduce"]

try:  # torch 2.x with FSDP2's pluggable collectives
    from torch.distributed.fsdp import FSDPModule as _FSDPModule
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _ReduceScatterBase
except Exception:  # torch 1.x: no FSDP2 (1.13's FSDP raises ValueError on import under Python 3.11)
    _FSDPModule = None
    _ReduceScatterBase = object

# FSDP leaves a parameter that got no gradient out of its reduce-scatter, which then has
# another size; the torches that can keep it in say how.
_UNUSED_PARAMETERS_HINT = (
    " (and where some of a module's parameters get no gradient in a step, which FSDP then leaves out, call "
    "set_reduce_scatter_unused_params(True) on it)"
    if hasattr(_FSDPModule, "set_reduce_scatter_unused_params") else "")

_FORMAT = "gradcomp.torch.fsdp/1"


def _require(who: str, hook: str) -> None:
    """Refuses a torch whose FSDP2 lacks ``FSDPModule.<hook>``, naming the version."""
    if _FSDPModule is None or not hasattr(_FSDPModule, hook):
        check.fail(who, f"needs FSDP2 with FSDPModule.{hook} (torch 2.x); this is torch {torch.__version__}")


def _factor_of(who: str, op: Any, world: int) -> float:
    """The factor on the sum that FSDP's reduce op asks for."""
    if op == dist.ReduceOp.AVG:
        return 1.0 / world
    if op == dist.ReduceOp.SUM:
        return 1.0
    if op == dist.ReduceOp.PREMUL_SUM:  # set_gradient_divide_factor: the sum of factor * x
        factor = getattr(op, "factor", None)
        if isinstance(factor, torch.Tensor) and factor.numel() == 1:
            factor = float(factor.item())
        if isinstance(factor, float) and math.isfinite(factor):
            return factor
        check.fail(who, f"PREMUL_SUM's factor must be a finite float or a one-element tensor, got {factor!r}")
    check.fail(who, f"reduce op {op} is not supported (AVG, SUM or PREMUL_SUM)")


def _graph_task() -> int:
    """The backward pass the calling thread runs (autograd's graph task), -1 outside one."""
    current = getattr(torch._C, "_current_graph_task_id", None)
    return -1 if current is None else current()


class _BackwardSettlement:
    """The calls (reduce-scatters, all-reduces) queued in one backward pass (autograd
    graph task), settled at its end, after every other hook (an autograd final callback
    queued at its first call), by one read of all their outcomes (one per device): every
    rank raises alike there, before the optimizer can step."""

    def __init__(self, task: int) -> None:
        self.task = task
        self.queued = []  # (instance, exchange, outcome, event), in the order the ranks queued them
        at_end = _AtBackwardEnd(self)
        # Autograd holds the callback until the pass ends: once it is gone, a settlement
        # still queued belongs to a pass that raised before its end.
        self._at_end = weakref.ref(at_end)
        torch.autograd.Variable._execution_engine.queue_callback(at_end)

    def holds(self, exchange) -> bool:
        return any(x is exchange for _, x, _, _ in self.queued)

    def running(self) -> bool:
        """Whether its backward pass has not ended yet (it may be running a nested one)."""
        return self._at_end() is not None

    def _forget(self) -> None:
        if _settlements.get(self.task) is self:
            del _settlements[self.task]

    def drop(self) -> None:
        """Drops every queued step: a backward pass that ended before its end (it raised),
        whose gradients are thrown away; what the steps would have committed stays in
        the memories."""
        self._forget()
        queued, self.queued = self.queued, []
        for instance, exchange, outcome, _ in queued:
            exchange.drop()
            instance._release(exchange, outcome.device)

    def settle(self) -> None:
        self._forget()
        if not self.queued:
            return
        try:
            reads = {}  # device: its outcomes, read in one copy
            for device in dict.fromkeys(outcome.device for _, _, outcome, _ in self.queued):
                outcomes = []
                for _, _, outcome, event in self.queued:
                    if outcome.device == device:
                        if event is not None:  # written on the stream current at its call
                            torch.cuda.current_stream(device).wait_event(event)
                        outcomes.append(outcome)
                reads[device] = [torch.cat(outcomes).cpu(), 0]  # the backward pass's one read of the device
        except BaseException:
            self.drop()
            raise
        queued, self.queued = self.queued, []
        first_error = None
        for instance, exchange, outcome, _ in queued:
            read = reads[outcome.device]
            part = read[0][read[1]:read[1] + outcome.numel()]
            read[1] += outcome.numel()
            try:
                if first_error is None or isinstance(first_error, Error):
                    exchange.settle(part)  # commits, or raises alike on every rank
                else:
                    exchange.drop()  # after a failure the ranks may not share, nothing more is settled
            except BaseException as error:
                first_error = first_error or error
            instance._release(exchange, outcome.device)
        if first_error is not None:
            raise first_error


class _AtBackwardEnd:
    """A backward pass's final callback: settles what the pass queued."""

    def __init__(self, settlement: _BackwardSettlement) -> None:
        self.settlement = settlement

    def __call__(self) -> None:
        self.settlement.settle()


# The settlements of the backward passes running (one per graph task: a reentrant
# checkpoint's backward nests one in another), and of those that raised before their
# end, until one of their exchanges is called again.
_settlements: Dict[int, _BackwardSettlement] = {}


def _clear_for(exchange, task: int) -> None:
    """Settles or drops a step of `exchange` that waits for a backward pass's end,
    before `exchange` stages another: where that pass is still running (this call is a
    second one in it, or in a pass nested in it) it settles now, as every rank does;
    where it raised before its end its steps are dropped (no collective: a pass may
    raise on one rank alone)."""
    for settlement in list(_settlements.values()):
        if settlement.holds(exchange):
            if settlement.task == task or settlement.running():
                settlement.settle()
            else:
                settlement.drop()


def _settle_at_backward_end(instance, exchange, outcome: torch.Tensor) -> None:
    """Queues `exchange`'s outcome for the settlement of the running backward pass."""
    task = _graph_task()
    settlement = _settlements.get(task)
    if settlement is None:
        settlement = _settlements[task] = _BackwardSettlement(task)
    event = None
    if outcome.is_cuda:
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(outcome.device))
    settlement.queued.append((instance, exchange, outcome, event))


def _completed_work() -> "dist.Work":
    """A Work already done: what an ``async_op`` call returns once its result is written."""
    from torch._C._distributed_c10d import _create_work_from_future

    done = torch.futures.Future()
    done.set_result(None)
    return _create_work_from_future(done)


class _GroupCompressor:
    """What both collectives share: one compressor for one parameter group, made at the
    first call (when the group's size is known), and its state_dict."""

    _WHO = "fsdp"

    def __init__(self, method: str, density: Optional[float], keep_workspace: Optional[bool], settle: Optional[str],
                 options: Dict[str, Any]) -> None:
        if settle is not None and check.text(self._WHO, "settle", settle) not in ("step", "call"):
            check.fail(self._WHO, f"settle must be 'step', 'call' or None, got {settle!r}")
        self.settle = settle
        self.method = check.text(self._WHO, "method", method)
        self.keep_workspace = None if keep_workspace is None else check.boolean(self._WHO, "keep_workspace",
                                                                                keep_workspace)
        self.options = dict(options)
        if density is not None:
            self.options["density"] = check.real(self._WHO, "density", density)
        Compressor(1 << 10, self.method, **self.options)  # refuses bad options now
        self.compressor = None
        self._exchange = None
        self._group = None
        self._saved = None
        self._calls = 0
        self._elements = 0

    def _exchange_for(self, grad: torch.Tensor, group: dist.ProcessGroup):
        numel = grad.numel()
        if self.compressor is not None and self.compressor.numel != numel:
            check.fail(self._WHO, f"this instance compresses a parameter group of {self.compressor.numel} elements "
                                  f"and was called with {numel}: give each FSDPModule an instance of its own"
                                  + _UNUSED_PARAMETERS_HINT)
        if self.compressor is None:
            c = Compressor(numel, self.method, device=grad.device, **self.options)
            if self._saved is not None:
                c.load_state_dict(self._saved)
                if "density" in self.options:  # a set_density after loading wins over the checkpoint's
                    c.set_density(self.options["density"])
            self._saved = None
            self.compressor = c
        if self._exchange is None or self._group is not group:
            self._exchange = _C.SparseAllreduce(self.compressor._impl, group, 0)
            self._group = group
        return self._exchange

    def _settles_at_backward_end(self, exchange, device: torch.device) -> bool:
        """Whether this call's step is queued for the end of the backward pass: where it
        settles by step, runs in a backward pass, and the ranks agreed the sizes their
        collectives move (the first call agrees them, reading as it goes)."""
        task = _graph_task()
        _clear_for(exchange, task)  # before anything of this call is staged
        by_step = self.settle == "step" or (self.settle is None and device.type == "cuda")
        return by_step and task != -1 and exchange.sizes_agreed

    def _release(self, exchange, device: torch.device) -> None:
        """Gives the call's workspace back unless this instance keeps it (by default on
        CUDA)."""
        keep = self.keep_workspace if self.keep_workspace is not None else device.type == "cuda"
        if not keep:
            exchange.release_workspace()

    def set_density(self, density: float) -> None:
        """The density of this instance's compressor from its next call on (DGC's warm-up:
        ``gradcomp.torch.Warmup(final_density=d).by_step(step, steps_per_epoch)``); before
        the first call, the density the compressor is made with. Checked now: a density
        outside (0, 1], or a method without one, raises
        :class:`gradcomp.InvalidArgumentError` and changes nothing."""
        density = check.real(f"{self._WHO} set_density", "density", density)
        Compressor(1 << 10, self.method, **{**self.options, "density": density})  # refuses what the method does
        if self.compressor is not None:
            self.compressor.set_density(density)
        self.options["density"] = density

    @property
    def bytes_sent(self) -> int:
        """Bytes this rank has put into the collectives."""
        return 0 if self._exchange is None else self._exchange.bytes_sent

    @property
    def collectives(self) -> int:
        """Collectives issued."""
        return 0 if self._exchange is None else self._exchange.collectives

    def stats(self) -> Dict[str, Any]:
        """What this instance moved on this rank: ``calls``, ``bytes_sent`` and
        ``bytes_received`` (every call's, summed), ``collectives``, and of the last call
        ``elements`` (the gradient's), ``entries_sent`` (this rank's message) and
        ``density`` (entries_sent / elements)."""
        x = self._exchange
        entries = 0 if x is None else x.entries
        return {"calls": self._calls, "bytes_sent": self.bytes_sent,
                "bytes_received": 0 if x is None else x.bytes_received, "collectives": self.collectives,
                "elements": self._elements, "entries_sent": entries,
                "density": entries / self._elements if self._elements else 0.0}

    def memory_bytes(self) -> Dict[str, int]:
        """The bytes this instance holds on this rank between calls (0 before the first
        call makes its compressor): ``state`` (the error memory of the unsharded group: 4
        bytes per parameter in float32, about 1 with ``memory_bits=8``), ``workspace`` (the
        compressor's steps and the exchange: a few per-tile bytes once a call gave it
        back, the default) and ``total``."""
        return _held_by([self.compressor] if self.compressor is not None else [],
                        [self._exchange] if self._exchange is not None else [])

    def state_dict(self) -> Dict[str, Any]:
        """The method, options, calls made and the compressor's memory (``compressor``:
        its state_dict, or None before the first call made it): what
        :meth:`load_state_dict` restores, before or after a first call."""
        memory = self.compressor.state_dict() if self.compressor is not None else self._saved
        return {"format": _FORMAT, "method": self.method, "options": dict(self.options), "calls": self._calls,
                "compressor": memory}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restores a :meth:`state_dict` of an instance of the same method and options (the
        density aside: the state's is restored, and a :meth:`set_density` after loading
        wins): at once if this instance has its compressor, else at the first call (where
        a compressor of another size raises). Raises
        :class:`gradcomp.InvalidArgumentError` (nothing changes) for anything else."""
        if not isinstance(state_dict, dict) or state_dict.get("format") != _FORMAT:
            check.fail(self._WHO,
                       f"load_state_dict: not a state_dict of gradcomp.torch.fsdp, got {check.kind(state_dict)}")
        saved = state_dict.get("options")
        without_density = lambda options: {k: v for k, v in options.items() if k != "density"}  # noqa: E731
        for key, theirs, mine in (("method", state_dict.get("method"), self.method),
                                  ("options", without_density(saved) if isinstance(saved, dict) else saved,
                                   without_density(self.options))):
            if theirs != mine:
                check.fail(self._WHO, f"load_state_dict: the state's {key} is {theirs!r}, this instance's {mine!r}")
        memory = state_dict.get("compressor")
        if self.compressor is not None:
            if memory is None:
                check.fail(self._WHO, "load_state_dict: the state holds no compressor (it was saved before the first "
                                      "call) and this instance has one")
        calls = check.integer(self._WHO, "calls", state_dict.get("calls", 0), 0)
        if self.compressor is not None:
            self.compressor.load_state_dict(memory)
        else:
            self._saved = memory
        if "density" in saved:
            self.options["density"] = saved["density"]
        self._calls = calls


class ReduceScatter(_GroupCompressor, _ReduceScatterBase):
    """A reduce-scatter for ``FSDPModule.set_custom_reduce_scatter`` that moves each
    rank's compressed gradient instead of the dense one; one instance per FSDPModule.

    ``method``, ``density`` and ``**options`` are those of
    :class:`gradcomp.torch.Compressor` (checked here). ``keep_workspace``: whether each
    call keeps its workspace for the next (None: given back on the CPU, kept on CUDA;
    module docstring, "Memory"). ``settle``: ``"step"`` settles the calls of a backward
    pass together at its end, by one read of the device; ``"call"`` settles each call
    before it returns; None (the default): ``"step"`` for CUDA tensors, ``"call"`` for CPU
    ones (module docstring, "Settled once a step"); every rank must settle alike.
    ``bytes_sent`` counts the bytes
    this rank has put into the collectives, ``collectives`` the collectives.
    ``state_dict()`` / ``load_state_dict()`` keep the compressor's memory.

    Raises :class:`gradcomp.InvalidArgumentError` where torch has no
    ``FSDPModule.set_custom_reduce_scatter``.
    """

    _WHO = "fsdp ReduceScatter"

    def __init__(self, method: str = "topk_ef", density: Optional[float] = None, *,
                 keep_workspace: Optional[bool] = None, settle: Optional[str] = None,
                 **options: Union[bool, int, float, str, dict]) -> None:
        _require(self._WHO, "set_custom_reduce_scatter")
        super().__init__(method, density, keep_workspace, settle, options)

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """FSDP's buffers: plain tensors."""
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: dist.ProcessGroup, op: Any,
                 async_op: bool = False) -> Optional["dist.Work"]:
        """``output_tensor`` (this rank's shard) = the reduce of the ranks' compressed
        ``input_tensor`` chunks for this rank. Queues its work or runs it to completion on
        the calling thread (``settle``); with ``async_op`` returns a Work that is already
        complete, else None."""
        # FSDP hands every rank tensors of the same kinds, so a refusal here is every rank's.
        check.tensor(self._WHO, "output_tensor", output_tensor)
        check.tensor(self._WHO, "input_tensor", input_tensor)
        if not isinstance(group, dist.ProcessGroup):
            check.fail(self._WHO, f"group must be a torch.distributed ProcessGroup, got {check.kind(group)}")
        scale = _factor_of(self._WHO, op, group.size())
        grad = input_tensor.reshape(-1)  # float32, float16 or bfloat16: the compressor reads it where it is
        exchange = self._exchange_for(grad, group)
        widened = output_tensor.dtype != torch.float32 or not output_tensor.is_contiguous()
        shard = torch.empty(output_tensor.numel(), dtype=torch.float32, device=output_tensor.device) \
            if widened else output_tensor.view(-1)
        if self._settles_at_backward_end(exchange, grad.device):
            # The shard written where the memory is, zeros where the ranks refuse the step
            # (FSDP adds nothing then): the backward pass's end settles, and raises.
            _settle_at_backward_end(self, exchange, exchange.queue_reduce_scatter(grad, shard, scale))
        else:
            exchange.reduce_scatter(grad, shard, scale)  # writes the shard only once every rank's step passed
            self._release(exchange, grad.device)
        if widened:
            output_tensor.copy_(shard.view_as(output_tensor))
        self._calls += 1
        self._elements = grad.numel()
        return _completed_work() if async_op else None


class AllReduce(_GroupCompressor):
    """HSDP's all-reduce across replicas, compressed: a hook for
    ``FSDPModule.set_all_reduce_hook`` on modules sharded over each replica's ranks
    (``fully_shard(module, mesh=mesh["shard"])``), which replaces the reduce-scatter's
    output on every rank of ``group`` (the replicate group) by the mean over the replicas
    of the global top-k of their compressed sums (Ok-Topk: ``comm::sparse_allreduce``,
    docs/algorithms.md, "Global top-k"), each replica keeping what it did not send in its
    error feedback. One instance per FSDPModule; ``method``, ``density``,
    ``keep_workspace``, ``settle`` and ``**options`` as for :class:`ReduceScatter`.
    Settled by step, a call in a backward pass adds to the output as queued, nothing
    where the ranks refuse the step (the output is then zeros, and every rank raises
    from ``backward()``), and reads nothing; where a rank's entries for a region, or a
    region's part of the selection, outgrow the room the ranks agreed, they carry what
    fits (the lowest indices) and the rest stays in the ranks' error feedback
    (docs/algorithms.md, "Carrying what fits").

    Raises :class:`gradcomp.InvalidArgumentError` where torch has no
    ``FSDPModule.set_all_reduce_hook``.
    """

    _WHO = "fsdp AllReduce"

    def __init__(self, group: dist.ProcessGroup, method: str = "topk_ef", density: Optional[float] = None, *,
                 keep_workspace: Optional[bool] = None, settle: Optional[str] = None,
                 **options: Union[bool, int, float, str, dict]) -> None:
        _require(self._WHO, "set_all_reduce_hook")
        if not isinstance(group, dist.ProcessGroup):
            check.fail(self._WHO, f"group must be a torch.distributed ProcessGroup, got {check.kind(group)}")
        super().__init__(method, density, keep_workspace, settle, options)
        self.group = group

    def __call__(self, reduce_output: torch.Tensor) -> None:
        """``reduce_output`` (this rank's shard) = the mean over the replicas of the
        global top-k of their sums, the same on every replica."""
        check.tensor(self._WHO, "reduce_output", reduce_output)
        grad = reduce_output.reshape(-1)
        exchange = self._exchange_for(grad, self.group)
        mean = torch.zeros(grad.numel(), dtype=torch.float32, device=grad.device)
        scale = 1.0 / self.group.size()
        if self._settles_at_backward_end(exchange, grad.device):
            # Added to as queued, nothing where the ranks refuse the step (zeros then):
            # the backward pass's end settles, and raises.
            _settle_at_backward_end(self, exchange, exchange.queue_step(grad, mean, scale))
        else:
            exchange.step(grad, mean, scale)
            self._release(exchange, grad.device)
        reduce_output.copy_(mean.view_as(reduce_output))
        self._calls += 1
        self._elements = grad.numel()
