"""gradcomp as a DistributedDataParallel communication hook.

::

    state = gradcomp.torch.ddp.State(method="dgc", density=0.001, start_iter=10)
    model.register_comm_hook(state, gradcomp.torch.ddp.hook)

For the first ``start_iter`` iterations the hook all-reduces the mean densely, as torch's
PowerSGD hook does. Then each bucket is compressed:

- ``scalecom``: ScaleCom's cyclic local top-k (the C++ ``comm::cyclic_topk``): the
  step's leader broadcasts its indices, every rank sends its values there, one
  all-reduce of k values; O(k) per rank whatever the world size. Its verdicts, indices
  and sums stay in the bucket's memory, and the step's last bucket reads every bucket's
  outcome at once.
- ``aggregation="sparse_allreduce"`` (any method but scalecom): Ok-Topk's
  global top-k (the C++ ``comm::sparse_allreduce``): each rank sends each index region's
  entries to the region's rank, which sums them; the k largest sums over all regions are
  all-gathered. About 2k entries per rank whatever the world size; each rank keeps in
  its memory what it sent and the global selection dropped. Its entries travel in
  blocks of a room the ranks agreed before the step, and the step's last bucket reads
  every bucket's outcome at once.
- every other method: each rank compresses its bucket and all-gathers, in one
  collective in the steady state, its verdict (the agreement) and its message padded to
  a bound the ranks agreed on in the previous step; every rank returns the mean of the
  decoded messages.

The hook returns a Future at once: the exchange runs on a thread of the process group's
own, bucket after bucket in the order DDP calls the hook, while backward goes on; its
collectives run on a process group of their own made of DDP's ranks, so that they never
meet DDP's own (``find_unused_parameters``, ``static_graph``) or SyncBatchNorm's. A NaN
or infinity in a bucket on any rank, a bucket of another size, or ranks configured
differently make every rank's Future raise the same :class:`gradcomp.Error` in that
step, and no bucket's memory changes. Each compressor's memory belongs to the parameters
of its bucket and follows them when DDP regroups its buckets, and into a resumed run.
See docs/torch.md.
"""

import logging
from typing import Any, Dict, Optional, Union

import torch
import torch.distributed as dist

from .. import _C
from .. import _arguments as check
from ..errors import Error
from . import Compressor, _groups, _held_by, _layout

__all__ = ["State", "hook"]

_WHO = "ddp hook"
_log = logging.getLogger("gradcomp")
_log.addHandler(logging.NullHandler())  # a library's records show where the application configures logging


class State:
    """What the hook keeps between steps: the iteration, and per bucket of parameters a
    compressor.

    ``process_group``: DDP's group (the default group when None); the hook's collectives
    run on a group of its own made of the same ranks. Every other parameter is a keyword:
    ``method`` and ``**options`` are those of :class:`gradcomp.torch.Compressor`;
    ``density`` (the method's default when None) applies to methods that have one.
    ``start_iter``: iterations of dense all-reduce first. ``aggregation``: ``"allgather"``
    (every rank receives every rank's message) or ``"sparse_allreduce"`` (Ok-Topk's
    global top-k of the summed gradient, k the density's count; not with scalecom,
    whose exchange is its own). ``non_finite``: ``"raise"`` (a NaN or infinity in a
    bucket on any rank makes every rank's Future raise :class:`gradcomp.NonFiniteError`)
    or ``"propagate"`` (that bucket comes back NaN on every rank, as a dense all-reduce
    would spread it, so that torch's GradScaler skips the optimizer step; use it with
    mixed precision); either way the step changes no memory.

    With ``dgc``, the momentum correction lives in the hook: run the optimizer without
    momentum (``torch.optim.SGD(momentum=0)``), and step the warm-up per epoch with
    ``state.set_density(gradcomp.torch.Warmup(final_density=d).by_epoch(epoch))``; its
    gradient clipping divides ``max_norm`` by the square root of ``workers``, the group's
    size unless given.

    A State serves one model: a bucket of another model's parameters raises. Register
    the hook before the model's first backward.

    ``torch.save(state)`` keeps the iteration, the options, which parameters each
    compressor holds and every compressor's memory (not the process group, as
    PowerSGDState does); a loaded State restores each compressor on its first use, at
    the State's density (a ``set_density`` after loading wins over the checkpoint's).

    Raises :class:`gradcomp.InvalidArgumentError` for a bad process group, method,
    option or ``start_iter`` here, not in backward.
    """

    def __init__(self, process_group: Optional[dist.ProcessGroup] = None, *, method: str = "topk_ef",
                 density: Optional[float] = None, start_iter: int = 10, aggregation: str = "allgather",
                 non_finite: str = "raise", **options: Union[bool, int, float, str, dict]) -> None:
        if process_group is not None and not isinstance(process_group, dist.ProcessGroup):
            hint = f" (the method is a keyword: State(method={process_group!r}))" if isinstance(process_group, str) \
                else ""
            check.fail("State", f"process_group must be a torch.distributed ProcessGroup or None, got "
                       f"{check.kind(process_group)}{hint}")
        self.process_group = process_group
        self.method = check.text("State", "method", method)
        self.start_iter = check.integer("State", "start_iter", start_iter, 0)
        self.aggregation = check.text("State", "aggregation", aggregation)
        if self.aggregation not in ("allgather", "sparse_allreduce"):
            check.fail("State", f"aggregation must be 'allgather' or 'sparse_allreduce', got {aggregation!r}")
        if self.aggregation == "sparse_allreduce" and self.method == "scalecom":
            check.fail("State", "aggregation 'sparse_allreduce' does not apply to method 'scalecom' (its cyclic "
                       "exchange is its aggregation)")
        self.non_finite = check.text("State", "non_finite", non_finite)
        if self.non_finite not in ("raise", "propagate"):
            check.fail("State", f"non_finite must be 'raise' or 'propagate', got {non_finite!r}")
        self.options = dict(options)
        if density is not None:
            self.options["density"] = check.real("State", "density", density)
        self.iter = 0
        #: Per compressor, the names of the parameters whose memory it keeps (_layout.py).
        self.units = []
        self.compressors = {}
        self._saved = {}
        self._parameters = _layout.Parameters()
        self._transient()
        self._probe()  # refuses bad options now, not in backward

    def _transient(self):
        """What lives in this process only: made empty at construction and loading."""
        self.process_group = getattr(self, "process_group", None)
        self.compressors = {}
        self._exchanges = {}  # unit -> its CyclicExchange or SparseAllreduce
        self._steps = None
        self._group_of_hook = None
        self._step = None  # what the step in progress has decided (_Step)
        self._moved = {}  # memory of parameters whose compressor DDP's regrouping dissolved
        self._moved_step = 0

    def _probe(self, **changes):
        """A small compressor of this State's method and options (with ``changes``)."""
        return Compressor(1 << 10, self.method, **{**self.options, **changes})

    def set_density(self, density: float) -> None:
        """The density of every bucket's compressor from the next step on (and of those
        made or restored later). Checked now: a density outside (0, 1], or a method
        without one, raises :class:`gradcomp.InvalidArgumentError` and changes nothing."""
        density = check.real("State.set_density", "density", density)
        self._probe().set_density(density)
        for c in self.compressors.values():
            c.set_density(density)
        if self.options.get("density") != density:
            _log.info("ddp hook: density %g from the next step (iteration %d)", density, self.iter)
        self.options["density"] = density

    def maybe_increase_iter(self, bucket: dist.GradBucket) -> None:
        """Counts one iteration per backward pass (at the last bucket)."""
        if bucket.is_last():
            self.iter += 1
            if self.iter == self.start_iter:
                _log.info("ddp hook: %d dense iterations done; %s from the next on", self.iter, self.method)

    def _options(self):
        """The compressors' options: DGC's clipping (and any composition's) shares
        ``max_norm`` among the group's ranks unless ``workers`` is given."""
        options = dict(self.options)
        if "workers" not in options and (self.method == "dgc" or "max_norm" in options):
            options["workers"] = self._group().size()
        return options

    def compressor(self, unit: int, numel: int, device: torch.device) -> Compressor:
        """The compressor of unit ``unit``, made (or restored) on first use. A record that
        fails to restore leaves no compressor and keeps the record."""
        c = self.compressors.get(unit)
        if c is None:
            c = Compressor(numel, self.method, device=device, **self._options())
            saved = self._saved.get(unit)
            if saved is not None:
                c.load_state_dict(saved)
                density = self.options.get("density")
                if density is not None and c.density is not None and c.density != density:
                    c.set_density(density)
                del self._saved[unit]
            elif unit < len(self.units) and any(n in self._moved for n in self.units[unit]):
                _layout.join_memory(c, self.units[unit], self._parameters.numel, self._moved, self._moved_step)
            self.compressors[unit] = c
        return c

    def _exchange(self, unit, c):
        """The exchange of unit ``unit`` (compressor ``c``) for the method's aggregation:
        ScaleCom's cyclic exchange, Ok-Topk's global top-k, or None for the all-gather."""
        path = self._aggregation_path()
        if path == "allgather":
            return None
        x = self._exchanges.get(unit)
        if x is None:
            if path == "cyclic":
                x = _C.CyclicExchange(c._impl, self._group_of_hook, c.density)
            else:
                x = _C.SparseAllreduce(c._impl, self._group_of_hook, 0)
            self._exchanges[unit] = x
        return x

    def memory_bytes(self) -> Dict[str, int]:
        """The bytes this rank's compressors and exchanges hold (each bucket's, made so
        far): ``state`` (the compressors' memory), ``workspace`` (their steps' and the
        exchanges') and ``total``; :meth:`Compressor.memory_bytes` says what each holds."""
        return _held_by(self.compressors.values(), self._exchanges.values())

    def _aggregation_path(self):
        """How a compressed bucket is exchanged: "cyclic" (ScaleCom), "sparse_allreduce"
        or "allgather"."""
        return "cyclic" if self.method == "scalecom" else self.aggregation

    def stats(self, total: bool = False) -> Dict[str, Any]:
        """What the hook moved and spent in the last completed step (every step's, summed,
        with ``total=True``), on this rank: a dict of ``steps``, ``buckets``
        (``compressed_buckets`` of them compressed, ``refused_buckets`` failed or
        propagated non-finite values), ``elements``, ``entries_sent`` (a dense bucket's
        every element), ``density`` (entries_sent / elements), ``bytes_sent`` and
        ``bytes_received`` (what this rank's collectives moved: inputs handed over, results
        delivered), ``dense_allreduce_bytes`` (what a ring all-reduce of the same buckets
        sends per rank), ``ratio`` (dense_allreduce_bytes / bytes_sent), ``collectives``,
        ``compress_seconds`` (compression, measured for the all-gather aggregation; ScaleCom
        and the global top-k compress inside their exchange) and ``exchange_seconds``."""
        if self._steps is None:
            counts = _C.HookSteps.no_counts()
        else:
            counts = self._steps.totals() if total else self._steps.last_step()
        counts["density"] = counts["entries_sent"] / counts["elements"] if counts["elements"] else 0.0
        counts["ratio"] = counts["dense_allreduce_bytes"] / counts["bytes_sent"] if counts["bytes_sent"] else 0.0
        return counts

    @property
    def bytes_sent(self) -> int:
        """Bytes this rank has put into the hook's collectives (complete once backward is)."""
        return self.stats(total=True)["bytes_sent"]

    @property
    def collectives(self) -> int:
        """Collectives the hook has issued on this rank: in the steady state one per bucket
        (two and more for ScaleCom, two for a dense warm-up step)."""
        return self.stats(total=True)["collectives"]

    def _steps_over(self):
        """The hook's steps (made on first use, with the hook's group)."""
        if self._steps is None:
            self._group_of_hook = _groups.own_group(self._group())
            self._steps = _C.HookSteps(self._group_of_hook, self._group(), self.non_finite == "propagate")
        return self._steps

    def _group(self):
        return self.process_group if self.process_group is not None else dist.distributed_c10d._get_default_group()

    def _settings(self, index, buffer):
        """What every rank must hold alike in this step, as (name, value) texts."""
        settings = [("the method", self.method), ("the aggregation", self.aggregation),
                    ("start_iter", str(self.start_iter)), ("non_finite", self.non_finite),
                    ("the iteration", str(self.iter)), ("the bucket index", str(index)),
                    ("the bucket's elements", str(buffer.numel())), ("the bucket's dtype", str(buffer.dtype))]
        return settings + [(f"option {k}", repr(v)) for k, v in sorted(self.options.items())]

    # -- one bucket ------------------------------------------------------------------------

    def _hook(self, bucket):
        steps = self._steps_over()
        buffer, index, last = bucket.buffer(), bucket.index(), bucket.is_last()
        if self._step is None:
            self._step = _Step(first=self._parameters.learning, restored=len(self.units) > 0)
        problem, names = None, None
        try:
            names = self._parameters.names_of(bucket)
        except Error as e:
            problem = _reported(e)
        if self.iter < self.start_iter:
            future = steps.dense(buffer, self._settings(index, buffer), problem, last)
        elif self._step.regroup_from is not None:
            future = self._hold(steps, buffer, names, problem, last)
        else:
            unit = index
            if problem is None:
                try:
                    unit = self._unit_for(index, names)
                except Error as e:
                    problem = _reported(e)
            if self._step.regroup_from is not None:
                future = self._hold(steps, buffer, names, problem, last)
            else:
                future = self._compress(steps, unit, buffer, problem, last)
        if last:
            self._step = None
            if self._moved:
                _log.warning("ddp hook: the memory of %d parameters found no bucket and was dropped", len(self._moved))
                self._moved = {}
        self.maybe_increase_iter(bucket)
        return future

    def _unit_for(self, index, names):
        """The unit DDP's bucket ``index`` (of parameters ``names``) is compressed as:
        ``index``, whose unit now holds those parameters; None when the step is regrouped."""
        if index < len(self.units) and self.units[index] == names:
            return index
        placed = {n for unit in self.units for n in unit}
        if index == len(self.units) and not placed.intersection(names):
            self.units.append(names)  # a bucket seen for the first time
            return index
        if index >= len(self.units):
            check.fail(_WHO, f"bucket {index} holds parameters of an earlier bucket")
        if self._step.first and self._step.restored:
            # A resumed run's first step, in DDP's first buckets: compressed in the
            # checkpoint's units, as the uninterrupted run compresses it.
            _log.info("ddp hook: DDP's buckets differ from the checkpoint's from bucket %d on; this step is "
                      "compressed in the checkpoint's buckets", index)
            self._step.regroup_from = index
            return None
        # DDP regrouped its buckets: each parameter's memory moves into its new bucket.
        self._move_memory(index)
        self.units.append(names)
        return index

    def _move_memory(self, first):
        """Dissolves units ``first`` on: their memory, per parameter, waits in
        ``self._moved`` for the units that take those parameters."""
        numel = self._parameters.numel
        moved = 0
        for unit in range(first, len(self.units)):
            c = self.compressors.pop(unit, None)
            saved = self._saved.pop(unit, None)
            if c is None and saved is not None:
                c = Compressor(sum(numel[n] for n in self.units[unit]), self.method, **self._options())
                c.load_state_dict(saved)
            if c is not None:
                self._moved.update(_layout.split_memory(c, self.units[unit], numel))
                self._moved_step = max(self._moved_step, c.step)
                moved += len(self.units[unit])
            self._exchanges.pop(unit, None)
        del self.units[first:]
        _log.info("ddp hook: DDP regrouped its buckets from bucket %d on; the memory of %d parameters moves with "
                  "them", first, moved)

    def _compress(self, steps, unit, buffer, problem, last):
        """Submits the compressed step of unit ``unit`` over ``buffer`` (its gradient)."""
        c, exchange = None, None
        if problem is None:
            try:
                c = self.compressor(unit, buffer.numel(), buffer.device)
                exchange = self._exchange(unit, c)
            except Exception as e:  # every rank hears of it in the exchange instead of waiting for this one
                problem = _reported(e)
        return steps.compressed(unit, None if c is None else c._impl, self._aggregation_path(), exchange, buffer,
                                self._settings(unit, buffer), problem, last)

    def _hold(self, steps, buffer, names, problem, last):
        """A bucket of a regrouped step: kept until the step's last, whose hook compresses
        the checkpoint's units from the held buckets and completes every held Future."""
        step = self._step
        # Each on the bucket's device: completing it records the events DDP's wait orders
        # its reads after (collect_all's Future, which holds no devices, would record none).
        step.held.append((buffer, names, torch.futures.Future(
            devices=[buffer.device] if buffer.device.type == "cuda" else None)))
        if problem is not None and step.problem is None:
            step.problem = problem
        if last:
            self._regroup(steps, step)
        return step.held[-1][2]

    def _regroup(self, steps, step):
        numel = self._parameters.numel
        pieces = {}
        for buffer, names, _ in step.held:
            if names is not None:
                pieces.update(_layout.pieces_of(buffer, names, numel))
        problem = step.problem
        units = range(step.regroup_from, len(self.units))
        held_names = set(pieces)
        wanted = {n for u in units for n in self.units[u]}
        if problem is None and held_names != wanted:
            problem = ("invalid_argument", f"gradcomp: {_WHO}: DDP's buckets from {step.regroup_from} on hold other "
                       "parameters than the checkpoint's")
        futures = []
        for u in units:
            names = self.units[u]
            if problem is None:
                flat = torch.cat([pieces[n] for n in names])
            else:  # every rank hears of the problem in this unit's exchange
                flat = torch.zeros(sum(numel[n] for n in names), dtype=step.held[0][0].dtype,
                                   device=step.held[0][0].device)
            futures.append(self._compress(steps, u, flat, problem, u == units[-1]))

        def finish(done):
            try:
                # wait(), not value(): the current stream waits for each unit's work
                results = [f.wait() for f in done.value()]
                with torch.no_grad():
                    for u, result in zip(units, results):
                        at = 0
                        for n in self.units[u]:
                            pieces[n].copy_(result.narrow(0, at, numel[n]))
                            at += numel[n]
            except Exception as e:
                for _, _, f in step.held:
                    f.set_exception(e)
                return
            for buffer, _, f in step.held:
                f.set_result(buffer)

        torch.futures.collect_all(futures).then(finish)

    # -- checkpoints -----------------------------------------------------------------------

    def __getstate__(self):
        state = {k: v for k, v in self.__dict__.items()
                 if k in ("method", "start_iter", "aggregation", "non_finite", "options", "iter", "units")}
        saved = dict(self._saved)
        saved.update({i: c.state_dict() for i, c in self.compressors.items()})
        state["_saved"] = saved
        state["_learned"] = self._parameters.learned
        return state

    def __setstate__(self, state):
        state.pop("bytes_sent", None)  # kept by the States of gradcomp <= 0.1
        state.setdefault("aggregation", "allgather")  # States saved before it existed
        state.setdefault("non_finite", "raise")
        state.setdefault("units", [])  # before units: compressors by bucket index, taken as DDP's buckets come
        learned = state.pop("_learned", None)
        self.__dict__.update(state)
        self.units = [tuple(u) for u in self.units]
        self._parameters = _layout.Parameters(learned if learned else None)
        self._transient()


class _Step:
    """What the hook decided in the step in progress."""

    def __init__(self, first, restored):
        self.first = first  # the State's first step in this process
        self.restored = restored  # it holds units from a checkpoint
        self.regroup_from = None  # the bucket from which the step is compressed in the checkpoint's units
        self.held = []  # (buffer, names, Future) of the buckets held for the regrouping
        self.problem = None


# torch.load's weights-only unpickler (the default from torch 2.6) may rebuild a State:
# it holds only numbers, strings, lists, tuples, dicts and tensors.
if hasattr(torch.serialization, "add_safe_globals"):
    torch.serialization.add_safe_globals([State])


def _reported(e):
    """An exception as the agreement carries it: the gradcomp.Error code and the text."""
    if isinstance(e, Error):
        return (e.code, str(e))
    return ("invalid_argument", f"{type(e).__name__}: {e}")


# Real annotations, not strings: DDP's register_comm_hook compares them with GradBucket
# and Future[Tensor].
def hook(state: "State", bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The communication hook: ``model.register_comm_hook(state, hook)``.

    Returns at once a Future that completes when the step's last bucket's exchange has
    (with the all-gather aggregation, ScaleCom's and Ok-Topk's: the step reads its
    buckets' outcomes together; a dense bucket's when its own has): the bucket goes to
    a job that runs, one after another in the order DDP calls the hook (the same on
    every rank), on a thread of the process group's own, so that backward computes the
    next buckets while this one's bytes travel and every rank issues its collectives in
    the same order. Called by hand, call it for
    every bucket of a step (the last with ``is_last()`` true) before waiting.

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
    return state._hook(bucket)
