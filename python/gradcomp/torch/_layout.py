"""Which parameters each of the DDP hook's compressors keeps the memory of.

DDP groups a model's gradients into buckets and, after the first iteration, regroups
them once in the order backward produced them (``Reducer::rebuild_buckets``; never with
``find_unused_parameters``); the DDP of a resumed run starts again from the first
grouping. The hook's memory belongs to parameters, not to a bucket index: a State names
each parameter by its position in the first buckets it sees in a process (DDP derives
those from the model's parameters and its arguments, so the names are the same in every
process of the same script) and keeps, per compressor, the parameters it holds (a
*unit*). See ``ddp.State`` for what happens when DDP's buckets and the units differ.
"""

import weakref

import torch

from .. import _arguments as check

_WHO = "ddp hook"


class Parameters:
    """The names of one model's parameters, learned from the buckets of the first step
    this State sees in this process, and checked against those its checkpoint learned."""

    def __init__(self, learned=None):
        #: The buckets of the first step seen, as [numel, shape, dtype] per parameter: the
        #: names are positions in it. Saved in checkpoints.
        self.learned = []
        self._checkpoint = learned  # the learned buckets of the run a checkpoint came from
        self._names = {}  # id(parameter) -> (weak reference, name), this process's
        self.learning = True  # until the first step's last bucket
        self._refused = None  # why the checkpoint's names cannot be used here, once found

    @property
    def numel(self):
        """Each name's element count."""
        return [entry[0] for bucket in self.learned for entry in bucket]

    def names_of(self, bucket):
        """The names of ``bucket``'s parameters, in the bucket's order; learned during the
        first step. Raises :class:`gradcomp.InvalidArgumentError` for a bucket that is not
        of this State's model, or buckets out of DDP's order in the first step."""
        if self._refused is not None:
            check.fail(_WHO, self._refused)
        params = list(bucket.parameters())
        index = bucket.index()
        if not self.learning:
            names = []
            for p in params:
                known = self._names.get(id(p))
                if known is None or known[0]() is not p:
                    check.fail(_WHO, f"bucket {index} holds parameters this State has not seen: a State keeps the "
                               "memory of one model's parameters (make one State per model)")
                names.append(known[1])
            return tuple(names)
        if index != len(self.learned):
            check.fail(_WHO, f"bucket {index} came where bucket {len(self.learned)} was expected: DDP runs the hook "
                       "on its buckets in order; a State serves one model (make one State per model) and is "
                       "registered before the model's first backward")
        described = [[p.numel(), list(p.shape), str(p.dtype)] for p in params]
        if sum(d[0] for d in described) != bucket.buffer().numel():
            check.fail(_WHO, f"bucket {index} has {bucket.buffer().numel()} elements, its parameters "
                       f"{sum(d[0] for d in described)}")
        first = sum(len(b) for b in self.learned)
        names = tuple(range(first, first + len(params)))
        self.learned.append(described)
        for p, name in zip(params, names):
            self._names[id(p)] = (weakref.ref(p), name)
        if bucket.is_last():
            self.learning = False
        self._check_against_checkpoint(index, bucket.is_last())
        return names

    def _check_against_checkpoint(self, index, last):
        """The checkpoint's names mean this process's: the same parameters in the same
        first buckets."""
        if self._checkpoint is None:
            return
        mine = self.learned[index]
        theirs = self._checkpoint[index] if index < len(self._checkpoint) else None
        if mine != theirs or (last and len(self._checkpoint) != index + 1):
            self._refused = (f"the State's checkpoint is of another model or bucketing: DDP's first buckets held "
                             f"{_describe(self._checkpoint)} where they hold {_describe(self.learned)} here (load "
                             "a checkpoint into the model it was made with, with the same bucket_cap_mb, and "
                             "register the hook before the first backward)")
            check.fail(_WHO, self._refused)


def _describe(buckets):
    return "[" + ", ".join(f"{len(b)} parameters of {sum(e[0] for e in b)} elements" for b in buckets) + "]"


def pieces_of(buffer, names, numel):
    """Views of ``buffer`` (a flat bucket) holding each name's elements."""
    flat = buffer.view(-1)
    pieces, at = {}, 0
    for name in names:
        pieces[name] = flat.narrow(0, at, numel[name])
        at += numel[name]
    return pieces


def split_memory(compressor, names, numel):
    """Each name's slice of ``compressor``'s memory arrays: {name: [array, ...]}."""
    arrays = [compressor.corrector_state(a).cpu() for a in range(compressor._impl.state_arrays)]
    out, at = {}, 0
    for name in names:
        out[name] = [a.narrow(0, at, numel[name]).clone() for a in arrays]
        at += numel[name]
    return out


def join_memory(compressor, names, numel, moved, step):
    """Loads into ``compressor`` (of ``names``' elements) the memory ``moved`` holds for
    them (zeros for a name without), at ``step``; takes them out of ``moved``."""
    count = compressor._impl.state_arrays
    arrays = []
    for a in range(count):
        parts = [moved[n][a] if n in moved else torch.zeros(numel[n]) for n in names]
        arrays.append(torch.cat(parts).to(compressor.device))
    compressor._impl.load_memory(step, arrays)
    for n in names:
        moved.pop(n, None)
