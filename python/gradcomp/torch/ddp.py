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
- ``aggregation="sparse_allreduce"`` (any method but scalecom): Ok-Topk's
  global top-k (the C++ ``comm::sparse_allreduce``): each rank sends each index region's
  entries to the region's rank, which sums them; the k largest sums over all regions are
  all-gathered. About 2k entries per rank whatever the world size; each rank keeps in
  its memory what it sent and the global selection dropped.
- every other method: each rank compresses its bucket and all-gathers, in one
  collective in the steady state, its verdict (the agreement) and its message padded to
  a bound the ranks agreed on in the previous step; every rank returns the mean of the
  decoded messages.

The hook returns a Future at once: the exchange runs on a thread of the process group's
own, bucket after bucket in the order DDP calls the hook, while backward goes on. A NaN
or infinity in a bucket on any rank, a bucket of another size, or ranks configured
differently make every rank's Future raise the same :class:`gradcomp.Error` in that
step, and no bucket's memory changes. See docs/torch.md.
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
    ``start_iter``: iterations of dense all-reduce first. ``aggregation``: ``"allgather"``
    (every rank receives every rank's message) or ``"sparse_allreduce"`` (Ok-Topk's
    global top-k of the summed gradient, k the density's count; not with scalecom,
    whose exchange is its own). With ``dgc``, the momentum
    correction lives in the hook: run the optimizer without momentum
    (``torch.optim.SGD(momentum=0)``), and step the warm-up per epoch with
    ``state.set_density(gradcomp.torch.Warmup(final_density=d).by_epoch(epoch))``.

    ``bytes_sent`` counts the bytes this rank has put into the hook's collectives (the
    verdicts and reports, the messages or ScaleCom's indices and values, the dense
    warm-up's buckets); ``collectives`` counts the collectives. Both are final once
    backward has returned.

    ``torch.save(state)`` keeps the iteration, the options and every bucket's memory
    (not the process group, as PowerSGDState does); a loaded State restores each
    bucket's compressor on its first use, at the State's density (a ``set_density``
    after loading wins over the checkpoint's).

    Raises :class:`gradcomp.InvalidArgumentError` for a bad method, option or
    ``start_iter`` here, not in backward.
    """

    def __init__(self, process_group=None, method="topk_ef", density=None, start_iter=10, aggregation="allgather",
                 **options):
        self.process_group = process_group
        self.method = check.text("State", "method", method)
        self.start_iter = check.integer("State", "start_iter", start_iter, 0)
        self.aggregation = check.text("State", "aggregation", aggregation)
        if self.aggregation not in ("allgather", "sparse_allreduce"):
            check.fail("State", f"aggregation must be 'allgather' or 'sparse_allreduce', got {aggregation!r}")
        if self.aggregation == "sparse_allreduce" and self.method == "scalecom":
            check.fail("State", "aggregation 'sparse_allreduce' does not apply to method 'scalecom' (its cyclic "
                       "exchange is its aggregation)")
        self.options = dict(options)
        if density is not None:
            self.options["density"] = check.real("State", "density", density)
        self.iter = 0
        self.compressors = {}
        self._saved = {}
        self._exchanges = {}
        self._sparse = {}
        self._steps = None
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

    def _sparse_allreduce(self, index, c, group):
        """Ok-Topk's global top-k of bucket ``index`` over ``group``."""
        x = self._sparse.get(index)
        if x is None:
            x = _C.SparseAllreduce(c._impl, group, 0)
            self._sparse[index] = x
        return x

    @property
    def bytes_sent(self):
        """Bytes this rank has put into the hook's collectives (complete once backward is)."""
        return 0 if self._steps is None else self._steps.bytes_sent

    @property
    def collectives(self):
        """Collectives the hook has issued on this rank: in the steady state one per bucket
        (two and more for ScaleCom, two for a dense warm-up step)."""
        return 0 if self._steps is None else self._steps.collectives

    def _steps_over(self, group):
        """The hook's steps over ``group`` (made on first use)."""
        if self._steps is None:
            self._steps = _C.HookSteps(group)
        return self._steps

    def _group(self):
        return self.process_group if self.process_group is not None else dist.distributed_c10d._get_default_group()

    def _settings(self, index, buffer):
        """What every rank must hold alike in this step, as (name, value) texts."""
        settings = [("the method", self.method), ("the aggregation", self.aggregation),
                    ("start_iter", str(self.start_iter)),
                    ("the iteration", str(self.iter)), ("the bucket index", str(index)),
                    ("the bucket's elements", str(buffer.numel())), ("the bucket's dtype", str(buffer.dtype))]
        return settings + [(f"option {k}", repr(v)) for k, v in sorted(self.options.items())]

    def __getstate__(self):
        state = {k: v for k, v in self.__dict__.items()
                 if k not in ("process_group", "compressors", "_exchanges", "_sparse", "_steps")}
        saved = dict(self._saved)
        saved.update({i: c.state_dict() for i, c in self.compressors.items()})
        state["_saved"] = saved
        return state

    def __setstate__(self, state):
        state.pop("bytes_sent", None)  # kept by the States of gradcomp <= 0.1
        state.setdefault("aggregation", "allgather")  # States saved before it existed
        self.__dict__.update(state)
        self.process_group = None
        self.compressors = {}
        self._exchanges = {}
        self._sparse = {}
        self._steps = None


# torch.load's weights-only unpickler (the default from torch 2.6) may rebuild a State:
# it holds only numbers, strings, dicts and tensors.
if hasattr(torch.serialization, "add_safe_globals"):
    torch.serialization.add_safe_globals([State])


def _reported(e):
    """An exception as the agreement carries it: the gradcomp.Error code and the text."""
    if isinstance(e, Error):
        return (e.code, str(e))
    return ("invalid_argument", f"{type(e).__name__}: {e}")


def hook(state, bucket):
    """The communication hook: ``model.register_comm_hook(state, hook)``.

    Returns at once a Future that completes when the bucket's exchange has: the bucket
    goes to a job that runs, one after another in the order DDP calls the hook (the same
    on every rank), on a thread of the process group's own, so that backward computes the
    next buckets while this one's bytes travel and every rank issues its collectives in
    the same order.

    Every step of every bucket carries the ranks' agreement: each rank's verdict on its
    own step (a NaN, a bucket of another size, a checkpoint that does not restore), and a
    digest of what all must share (the method, every option, the density, ``start_iter``,
    the iteration, the bucket's index, size and dtype). Any of those on any rank makes
    every rank's Future raise the same :class:`gradcomp.Error`, naming the rank where it
    started; no rank is left waiting. The step's memory changes only at its last bucket,
    and only if every bucket succeeded on every rank.
    """
    if not isinstance(state, State):
        check.fail(_WHO, f"state must be a gradcomp.torch.ddp.State, got {check.kind(state)}")
    group = state._group()
    buffer = bucket.buffer()
    index = bucket.index()
    last = bucket.is_last()
    settings = state._settings(index, buffer)
    steps = state._steps_over(group)
    if state.iter < state.start_iter:
        future = steps.dense(buffer, settings, last)
    else:
        problem, c, exchange, sparse = None, None, None, None
        is_sparse = state.aggregation == "sparse_allreduce"
        try:
            c = state.compressor(index, buffer.numel(), buffer.device)
            if state.method == "scalecom":
                exchange = state._exchange(index, c, group)
            elif is_sparse:
                sparse = state._sparse_allreduce(index, c, group)
        except Exception as e:  # every rank hears of it in the exchange instead of waiting for this one
            problem = _reported(e)
        future = steps.compressed(index, None if c is None else c._impl, exchange, state.method == "scalecom", buffer,
                                  settings, problem, last, sparse, is_sparse)
    state.maybe_increase_iter(bucket)
    return future
