"""The process group of the DDP hook's own collectives.

DDP issues collectives of its own on the group it was given, from the autograd thread:
the all-reduce of the used-parameter map with ``find_unused_parameters``, the delayed
all-reduce of ``static_graph``'s first iteration; ``SyncBatchNorm`` all-reduces there in
backward too. The hook's exchanges run on a thread of their own while backward goes on
(``python/csrc/ddp_steps.hpp``), so on DDP's group the two sequences of collectives could
be matched against each other differently on two ranks: gloo aborts, or waits until its
timeout. The hook therefore runs every collective on a group of its own made of the same
ranks, with the same backend and timeout: one per DDP group, made the first time a hook
runs over it, shared by every State on it (their exchanges then keep one order too).
"""

import inspect
import weakref

import torch
import torch.distributed as dist

from .. import _arguments as check

_OWN = weakref.WeakKeyDictionary()  # DDP's group -> the hook's
_MADE = {}  # (backend, ranks) -> groups made over the default store (torch 1.13): names the next


def own_group(group):
    """The hook's group for DDP's ``group`` (made on first use, by every rank of it)."""
    hook_group = _OWN.get(group)
    if hook_group is None:
        hook_group = _make(group)
        _OWN[group] = hook_group
    return hook_group


def _ranks(group):
    """The global ranks of ``group``, in its own rank order."""
    if hasattr(dist, "get_process_group_ranks"):
        return list(dist.get_process_group_ranks(group))
    ranks = dist.distributed_c10d._pg_group_ranks[group]  # torch 1.13: global rank -> group rank
    return sorted(ranks, key=ranks.get)


def _timeout(group, backend):
    """``group``'s collective timeout (torch's default where it does not say)."""
    try:
        if hasattr(group, "_get_backend"):  # torch 2: the backend holds the options
            device = torch.device("cuda" if backend == "nccl" else "cpu")
            return group._get_backend(device).options._timeout
        return group.options._timeout
    except (AttributeError, RuntimeError):
        return dist.default_pg_timeout


def _make(group):
    backend = str(dist.get_backend(group))
    ranks = _ranks(group)
    timeout = _timeout(group, backend)
    if "use_local_synchronization" in inspect.signature(dist.new_group).parameters:
        # torch >= 2.1: only the group's ranks take part (a DDP on a subgroup runs the hook
        # on those alone).
        return dist.new_group(ranks, timeout=timeout, backend=backend, use_local_synchronization=True)
    # torch 1.13's new_group needs every rank of the world: the group is made over the
    # default store under a name of its own, the same on each of its ranks (they make their
    # groups in the same order, as their first backward runs the hook).
    key = (backend, tuple(ranks))
    count = _MADE.get(key, 0)
    _MADE[key] = count + 1
    name = f"gradcomp/ddp-hook/{backend}/{'_'.join(map(str, ranks))}/{count}"
    store = dist.PrefixStore(name, dist.distributed_c10d._get_default_store())
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, group.rank(), group.size(), timeout)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, group.rank(), group.size(), options)
    check.fail("ddp hook", f"the process group's backend is {backend!r}: the hook runs its collectives on a group "
               "of its own, which gradcomp makes for gloo and nccl (use torch >= 2.1 for other backends)")
