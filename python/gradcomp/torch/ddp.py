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
from .. import _arguments as check
from ..errors import Error
from . import Compressor

__all__ = ["State", "hook"]

_WHO = "ddp hook"


class State:
    """What the hook keeps between steps: the iteration, one compressor per bucket.

    ``method`` and ``**options`` are those of :class:`gradcomp.torch.Compressor`;
    ``density`` (the method's default when None) applies to methods that have one.
    ``start_iter``: iterations of dense all-reduce first. With ``dgc``, the momentum
    correction lives in the hook: run the optimizer without momentum
    (``torch.optim.SGD(momentum=0)``), and step the warm-up per epoch with
    ``state.set_density(gradcomp.torch.Warmup(final_density=d).by_epoch(epoch))``.

    ``bytes_sent`` counts the bytes this rank has put into the hook's collectives (the
    agreement's reports, the messages or ScaleCom's indices and values, the dense
    warm-up's buckets).

    ``torch.save(state)`` keeps the iteration, the options and every bucket's memory
    (not the process group, as PowerSGDState does); a loaded State restores each
    bucket's compressor on its first use, at the State's density (a ``set_density``
    after loading wins over the checkpoint's).

    Raises :class:`gradcomp.InvalidArgumentError` for a bad method, option or
    ``start_iter`` here, not in backward.
    """

    def __init__(self, process_group=None, method="topk_ef", density=None, start_iter=10, **options):
        self.process_group = process_group
        self.method = check.text("State", "method", method)
        self.start_iter = check.integer("State", "start_iter", start_iter, 0)
        self.options = dict(options)
        if density is not None:
            self.options["density"] = check.real("State", "density", density)
        self.iter = 0
        self.bytes_sent = 0
        self.compressors = {}
        self._saved = {}
        self._exchanges = {}
        self._probe()  # refuses bad options now, not in backward

    def _probe(self, **changes):
        """A small compressor of this State's method and options (with ``changes``)."""
        return Compressor(1 << 10, self.method, **{**self.options, **changes})

    def set_density(self, density):
        """The density of every bucket's compressor from the next step on (and of those
        made or restored later). Checked now: a density outside (0, 1], or a method
        without one, raises :class:`gradcomp.InvalidArgumentError` and changes nothing."""
        density = check.real("State.set_density", "density", density)
        self._probe().set_density(density)
        for c in self.compressors.values():
            c.set_density(density)
        self.options["density"] = density

    def maybe_increase_iter(self, bucket):
        """Counts one iteration per backward pass (at the last bucket)."""
        if bucket.is_last():
            self.iter += 1

    def compressor(self, index, numel, device):
        """The compressor of bucket ``index``, made (or restored) on first use. A record
        that fails to restore leaves no compressor and keeps the record."""
        c = self.compressors.get(index)
        if c is None:
            c = Compressor(numel, self.method, device=device, **self.options)
            saved = self._saved.get(index)
            if saved is not None:
                c.load_state_dict(saved)
                density = self.options.get("density")
                if density is not None and c.density is not None and c.density != density:
                    c.set_density(density)
                del self._saved[index]
            self.compressors[index] = c
        return c

    def _exchange(self, index, c, group):
        """ScaleCom's cyclic exchange of bucket ``index`` over ``group``."""
        x = self._exchanges.get(index)
        if x is None:
            x = _C.CyclicExchange(c._impl, group, c.density)
            self._exchanges[index] = x
        return x

    def _group(self):
        return self.process_group if self.process_group is not None else dist.distributed_c10d._get_default_group()

    def _settings(self, index, buffer):
        """What every rank must hold alike in this step, as (name, value) texts."""
        settings = [("the method", self.method), ("start_iter", str(self.start_iter)),
                    ("the iteration", str(self.iter)), ("the bucket index", str(index)),
                    ("the bucket's elements", str(buffer.numel())), ("the bucket's dtype", str(buffer.dtype))]
        return settings + [(f"option {k}", repr(v)) for k, v in sorted(self.options.items())]

    def __getstate__(self):
        state = {k: v for k, v in self.__dict__.items() if k not in ("process_group", "compressors", "_exchanges")}
        saved = dict(self._saved)
        saved.update({i: c.state_dict() for i, c in self.compressors.items()})
        state["_saved"] = saved
        return state

    def __setstate__(self, state):
        self.bytes_sent = 0
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


def _reported(e):
    """An exception as the agreement carries it: the gradcomp.Error code and the text."""
    if isinstance(e, Error):
        return (e.code, str(e))
    return ("invalid_argument", f"{type(e).__name__}: {e}")


def hook(state, bucket):
    """The communication hook: ``model.register_comm_hook(state, hook)``.

    Every step of every bucket starts with the ranks' agreement (one all-gather of a
    fixed-size report): each rank's verdict on its own step (a NaN, a bucket of another
    size, a checkpoint that does not restore), and what all must share (the method,
    every option, the density, ``start_iter``, the iteration, the bucket's index, size
    and dtype). Any of those on any rank makes every rank raise the same
    :class:`gradcomp.Error`, naming the rank where it started, and changes no rank's
    memory; no rank is left waiting in a collective.
    """
    if not isinstance(state, State):
        check.fail(_WHO, f"state must be a gradcomp.torch.ddp.State, got {check.kind(state)}")
    group = state._group()
    world = dist.get_world_size(group)
    buffer = bucket.buffer()
    index = bucket.index()
    settings = state._settings(index, buffer)
    if state.iter < state.start_iter:
        state.bytes_sent += _C.agree(group, _WHO, settings, None) + buffer.numel() * buffer.element_size()
        state.maybe_increase_iter(bucket)
        return _allreduce_mean(group, buffer)

    problem, c, exchange, flat, mean = None, None, None, buffer, None
    try:
        # gradcomp compresses float32, float16 and bfloat16 buckets as they are (widened
        # exactly inside); ScaleCom's exchange, and any other dtype, go through a float32 copy.
        native = buffer.dtype in (torch.float32, torch.float16, torch.bfloat16) and state.method != "scalecom"
        flat = buffer if native or buffer.dtype == torch.float32 else buffer.float()
        c = state.compressor(index, flat.numel(), flat.device)
        if state.method == "scalecom":
            exchange = state._exchange(index, c, group)
        mean = torch.zeros(flat.numel(), dtype=torch.float32, device=flat.device)
    except Exception as e:  # every rank hears of it in the agreement instead of waiting for this one
        problem = _reported(e)
    if problem is not None or exchange is not None:
        state.bytes_sent += _C.agree(group, _WHO, settings, problem)
    if exchange is not None:
        before = exchange.bytes_sent
        exchange.step(flat, mean, 1.0 / world)
        state.bytes_sent += exchange.bytes_sent - before
    else:
        state.bytes_sent += c._impl.exchange(group, flat, mean, 1.0 / world, _WHO, settings, None)
    state.maybe_increase_iter(bucket)
    result = mean if buffer.dtype == torch.float32 else mean.to(buffer.dtype)
    future = torch.futures.Future()
    future.set_result(result)
    return future
