"""gradcomp as a DistributedDataParallel communication hook.

::

    state = gradcomp.torch.ddp.State(method="dgc", density=0.001, start_iter=10)
    model.register_comm_hook(state, gradcomp.torch.ddp.hook)

For the first ``start_iter`` iterations the hook all-reduces the mean densely (DDP
rebuilds its buckets after the first iteration, so per-bucket memory starts once they
are final), as torch's PowerSGD hook does. Then each bucket has its own compressor:

- ``scalecom``: ScaleCom's cyclic local top-k (the C++ ``comm::cyclic_topk``): the
  step's leader broadcasts its indices, every rank sends its values there, one
  all-reduce of k values; O(k) per rank whatever the world size.
- every other method: each rank compresses its bucket; the ranks agree (one
  all-gather of a fixed-size report that also carries the message sizes), the
  messages are all-gathered padded to the largest (gloo's all_gather needs equal
  sizes), and every rank returns the mean of the decoded messages.

A NaN or infinity in a bucket on any rank, a bucket of another size, or ranks
configured differently make every rank raise the same :class:`gradcomp.Error` in that
step, and no rank's memory changes. See docs/torch.md.
"""

import torch
import torch.distributed as dist

from .. import _C
from . import Compressor, accumulate
from ..errors import InvalidArgumentError

__all__ = ["State", "hook"]


class _Transport:
    """The collectives the C++ exchanges call back, on a process group."""

    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self._device = torch.device("cuda", torch.cuda.current_device()) \
            if dist.get_backend(group) == "nccl" else torch.device("cpu")

    def _on(self, tensor):
        return tensor if tensor.device == self._device else tensor.to(self._device)

    def all_gather(self, mine):
        mine = self._on(mine)
        parts = [torch.empty_like(mine) for _ in range(self.size)]
        dist.all_gather(parts, mine, group=self.group)
        return torch.cat(parts).cpu()

    def broadcast(self, tensor, root):
        moved = self._on(tensor)
        dist.broadcast(moved, src=self._global(root), group=self.group)
        if moved is not tensor:
            tensor.copy_(moved)

    def reduce_broadcast(self, tensor, root):
        # Summed at the root, then broadcast: every rank holds the same bits.
        moved = self._on(tensor)
        src = self._global(root)
        dist.reduce(moved, dst=src, group=self.group)
        dist.broadcast(moved, src=src, group=self.group)
        if moved is not tensor:
            tensor.copy_(moved)

    def _global(self, rank):
        if self.group is None or self.group is dist.group.WORLD:
            return rank
        return dist.distributed_c10d._get_global_rank(self.group, rank)


class State:
    """What the hook keeps between steps: the iteration, one compressor per bucket.

    ``method`` and ``**options`` are those of :class:`gradcomp.torch.Compressor`
    (``density`` included). ``start_iter``: iterations of dense all-reduce first. With
    ``dgc``, the momentum correction lives in the hook: run the optimizer without
    momentum (``torch.optim.SGD(momentum=0)``), and step the warm-up per epoch with
    ``state.set_density(gradcomp.torch.Warmup(final_density=d).by_epoch(epoch))``.

    ``torch.save(state)`` keeps the iteration and every bucket's memory (not the
    process group, as PowerSGDState does); a loaded State restores each bucket's
    compressor on its first use.
    """

    def __init__(self, process_group=None, method="topk_ef", density=0.001, start_iter=10, **options):
        if not isinstance(start_iter, int) or start_iter < 0:
            raise InvalidArgumentError(f"gradcomp: State: start_iter must be an int >= 0, got {start_iter!r}")
        self.process_group = process_group
        self.method = method
        self.options = dict(options)
        self.options["density"] = density
        self.start_iter = start_iter
        self.iter = 0
        self.compressors = {}
        self._saved = {}
        self._exchanges = {}
        Compressor(1 << 10, method, **self.options)  # refuses bad options now, not in backward

    def set_density(self, density):
        """The density of every bucket's compressor from the next step on."""
        for c in self.compressors.values():
            c.set_density(density)
        self.options["density"] = density

    def maybe_increase_iter(self, bucket):
        """Counts one iteration per backward pass (at the last bucket)."""
        if bucket.is_last():
            self.iter += 1

    def compressor(self, index, numel, device):
        """The compressor of bucket ``index``, made (or restored) on first use."""
        c = self.compressors.get(index)
        if c is None:
            c = Compressor(numel, self.method, device=device, **self.options)
            saved = self._saved.pop(index, None)
            if saved is not None:
                c.load_state_dict(saved)
            self.compressors[index] = c
        return c

    def __getstate__(self):
        state = {k: v for k, v in self.__dict__.items() if k not in ("process_group", "compressors", "_exchanges")}
        saved = dict(self._saved)
        saved.update({i: c.state_dict() for i, c in self.compressors.items()})
        state["_saved"] = saved
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.process_group = None
        self.compressors = {}
        self._exchanges = {}


# torch.load's weights-only unpickler (the default from torch 2.6) may rebuild a State:
# it holds only numbers, strings, dicts and tensors.
if hasattr(torch.serialization, "add_safe_globals"):
    torch.serialization.add_safe_globals([State])


def _allreduce_mean(group, tensor):
    tensor.div_(dist.get_world_size(group))
    return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(lambda f: f.value()[0])


def hook(state, bucket):
    """The communication hook: ``model.register_comm_hook(state, hook)``."""
    group = state.process_group if state.process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    if state.iter < state.start_iter:
        state.maybe_increase_iter(bucket)
        return _allreduce_mean(group, buffer)

    transport = _Transport(group)
    index = bucket.index()
    # gradcomp compresses float32, float16 and bfloat16 buckets as they are (widened
    # exactly inside); ScaleCom's exchange, and any other dtype, go through a float32 copy.
    native = buffer.dtype in (torch.float32, torch.float16, torch.bfloat16) and state.method != "scalecom"
    flat = buffer if native or buffer.dtype == torch.float32 else buffer.float()
    c = state.compressor(index, flat.numel(), flat.device)
    mean = torch.zeros(flat.numel(), dtype=torch.float32, device=flat.device)
    if state.method == "scalecom":
        exchange = state._exchanges.get(index)
        if exchange is None:
            exchange = _C.CyclicExchange(c._impl, transport, float(state.options["density"]))
            state._exchanges[index] = exchange
        exchange.step(flat, mean, 1.0 / transport.size)
    else:
        message, sizes = c._impl.stage_agreed(transport, flat, "ddp hook", [("the bucket index", index)])
        longest = max(sizes)
        padded = torch.zeros(longest, dtype=torch.uint8, device=message.device)
        padded[: message.numel()] = message
        padded = transport._on(padded)  # gloo moves CUDA buckets' bytes through host memory
        gathered = [torch.empty_like(padded) for _ in range(transport.size)]
        dist.all_gather(gathered, padded, group=group)
        # Every rank checks every message (the same bytes everywhere, so the same
        # outcome): a corrupt one raises on all ranks before any accepts its step.
        for r, size in enumerate(sizes):
            accumulate(gathered[r][:size].to(mean.device), mean, 1.0 / transport.size)
        c.accept_staged()
    state.maybe_increase_iter(bucket)
    result = mean if buffer.dtype == torch.float32 else mean.to(buffer.dtype)
    future = torch.futures.Future()
    future.set_result(result)
    return future
