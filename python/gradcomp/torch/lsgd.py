"""Leader SGD (docs/algorithms.md, "Leader SGD"): every rank trains its own copy of the
model, no DDP; every ``period`` steps the ranks agree on their recent training losses and
each is pulled toward its group's best performer (and every ``global_every`` rounds
toward the best of all), the leader's parameters sent whole or, with ``compressed=``,
its changes compressed by top-k against a reference every rank holds.

.. code-block:: python

    from gradcomp.torch.lsgd import LeaderSGD

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    leader = LeaderSGD(model, optimizer, period=4, global_every=4, local_pull=0.1)
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        leader.step(loss)  # optimizer.step(), then the pull every period-th step

The exchange runs in C++ (``gradcomp/comm/leader_exchange.hpp``, the library's one
implementation, here over the process group through c10d), on a float32 copy of the
parameters in host memory that this class keeps: at a round the parameters are copied
into it (from the GPU, for a model there), and back after the pull. Between rounds a
step costs no collective and no copy.
"""

from __future__ import annotations

import collections
import inspect
import numbers
from typing import Any, Optional

import torch
import torch.distributed as dist

from .. import _arguments as check
from ..errors import InvalidArgumentError
from . import _C, _flatten
from ._groups import _ranks

__all__ = ["LeaderSGD"]

_STATE_FORMAT = "gradcomp.torch.lsgd.LeaderSGD"


class LeaderSGD:
    """Leader SGD over ``model``'s parameters among the ranks of ``process_group`` (the
    default group when None).

    ``optimizer``: stepped by :meth:`step` before the exchange (None: the caller steps
    it, e.g. through a GradScaler, and then calls :meth:`step`). ``period``: local steps
    between rounds; ``global_every``: rounds between pulls toward the global leader;
    ``local_pull`` and ``global_pull``: how far each pull moves a rank (in [0, 1]);
    ``group_size``: ranks per group, consecutive ranks of the group, dividing its size
    (0: one group); ``loss_window``: how many recent losses a rank's performance
    averages (the authors' code: 10). ``compressed``: None (the leader sends its
    parameters) or a dict of the options of the top-k that compresses the leader's
    change (``density`` or ``count``, ``value``, ``index``, ``levels``, ``seed``,
    ``checksum``; ``{}`` takes exact_topk's defaults).

    Making one is a collective (groups are made), as is every ``period``-th
    :meth:`step`: every rank makes the same calls. Raises
    :class:`gradcomp.InvalidArgumentError` naming a bad argument.
    """

    def __init__(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                 process_group: Optional[dist.ProcessGroup] = None, *, period: int = 4, global_every: int = 4,
                 local_pull: float = 0.1, global_pull: float = 0.1, group_size: int = 0, loss_window: int = 10,
                 compressed: Optional[dict] = None) -> None:
        if not isinstance(model, torch.nn.Module):
            check.fail("LeaderSGD", f"model must be a torch.nn.Module, got {check.kind(model)}")
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            check.fail("LeaderSGD", f"optimizer must be a torch.optim.Optimizer or None, got {check.kind(optimizer)}")
        if process_group is not None and not isinstance(process_group, dist.ProcessGroup):
            check.fail("LeaderSGD", f"process_group must be a torch.distributed ProcessGroup or None, got "
                       f"{check.kind(process_group)}")
        if compressed is not None and not isinstance(compressed, dict):
            check.fail("LeaderSGD", f"compressed must be a dict of options or None, got {check.kind(compressed)}")
        self.model = model
        self.optimizer = optimizer
        self.loss_window = check.integer("LeaderSGD", "loss_window", loss_window, 1)
        self._params = [p for p in model.parameters()]
        if not self._params:
            check.fail("LeaderSGD", "the model has no parameters")
        for name, p in model.named_parameters():
            if not p.is_floating_point():
                check.fail("LeaderSGD", f"parameter {name!r} is {p.dtype}: the exchange moves floating-point "
                           "parameters")
        self._numel = sum(p.numel() for p in self._params)
        self._flat = torch.empty(self._numel, dtype=torch.float32)
        policy = {"period": check.integer("LeaderSGD", "period", period, 1),
                  "global_every": check.integer("LeaderSGD", "global_every", global_every, 1),
                  "local_pull": check.real("LeaderSGD", "local_pull", local_pull),
                  "global_pull": check.real("LeaderSGD", "global_pull", global_pull),
                  "group_size": check.integer("LeaderSGD", "group_size", group_size, 0)}
        self._compressed = None if compressed is None else dict(compressed)
        world = process_group if process_group is not None else dist.group.WORLD
        size = dist.get_world_size(world)
        if policy["group_size"] and (policy["group_size"] > size or size % policy["group_size"]):
            check.fail("LeaderSGD", f"lsgd: group_size must divide the {size} ranks, got {group_size}")
        group = self._own_group(world, policy["group_size"], size)
        self._impl = _C.LeaderExchange(world, group, self._numel, policy,
                                       None if compressed is None else _flatten(self._compressed))
        self._period = policy["period"]
        self._losses = collections.deque(maxlen=self.loss_window)
        self.bytes_sent = 0
        self.bytes_received = 0
        self.last_round: dict[str, Any] = {"held": False, "group_leader": -1, "global_leader": -1}

    @staticmethod
    def _own_group(world, group_size, size):
        """This rank's group when there are several, else None (the world is the one group)."""
        if not group_size or group_size == size:
            return None
        ranks = _ranks(world)
        rank = dist.get_rank(world)
        first = rank // group_size * group_size
        if "use_local_synchronization" in inspect.signature(dist.new_group).parameters:
            return dist.new_group(ranks[first:first + group_size], use_local_synchronization=True)  # torch >= 2.1
        # torch 1.13: every rank of the default group makes every group, in order.
        if size != dist.get_world_size():
            check.fail("LeaderSGD", "groups (group_size) within a process group smaller than the world need "
                       "torch >= 2.1")
        groups = [dist.new_group(ranks[f:f + group_size]) for f in range(0, size, group_size)]
        return groups[first // group_size]

    @property
    def steps(self) -> int:
        """Local steps counted so far."""
        return self._impl.steps

    @property
    def policy(self) -> dict[str, Any]:
        """The exchange's settings (period, global_every, local_pull, global_pull, group_size)."""
        return self._impl.policy

    def step(self, loss: torch.Tensor | float) -> dict[str, Any]:
        """One local step: ``optimizer.step()`` (if this LeaderSGD has the optimizer),
        then ``loss`` (this step's training loss, a number or a 1-element tensor) joins
        the rank's recent losses, and every ``period``-th step the round: the ranks
        agree on their mean recent losses and the parameters are pulled toward the
        leaders'. Returns the round ({held, group_leader, global_leader}: world ranks, or
        -1).

        Raises on every rank alike, changing no parameters and no count, if a rank's
        mean recent loss is not finite (:class:`gradcomp.NonFiniteError`) or the ranks'
        models, step counts or settings differ.
        """
        if isinstance(loss, torch.Tensor):
            if loss.numel() != 1:
                check.fail("LeaderSGD.step", f"loss must be a number or a 1-element tensor, got a tensor of "
                           f"{loss.numel()} elements")
            loss = loss.detach().reshape(())
        elif isinstance(loss, bool) or not isinstance(loss, numbers.Real):
            check.fail("LeaderSGD.step", f"loss must be a number or a 1-element tensor, got {check.kind(loss)}")
        if self.optimizer is not None:
            self.optimizer.step()
        before = list(self._losses)
        self._losses.append(loss)
        if (self._impl.steps + 1) % self._period != 0:
            self._impl.step(self._flat, 0.0)  # counts the step; no collective
            return {"held": False, "group_leader": -1, "global_leader": -1}
        mean = self._mean_loss()
        with torch.no_grad():
            torch.cat([p.detach().reshape(-1).to(torch.float32).cpu() for p in self._params], out=self._flat)
        try:
            round_ = self._impl.step(self._flat, mean)
        except Exception:
            self._losses = collections.deque(before, maxlen=self.loss_window)  # as before: the step is not counted
            raise
        finally:
            traffic = self._impl.last_traffic()
            self.bytes_sent += traffic["bytes_sent"]
            self.bytes_received += traffic["bytes_received"]
        with torch.no_grad():
            offset = 0
            for p in self._params:
                p.copy_(self._flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        self.last_round = round_
        return round_

    def _mean_loss(self):
        """The mean of the recent losses, summed in float64 in the order they came (the
        tensors' values read once, together)."""
        tensors = [x for x in self._losses if isinstance(x, torch.Tensor)]
        read = iter(torch.stack([t.to(torch.float64) for t in tensors]).cpu().tolist() if tensors else [])
        total = 0.0
        for x in self._losses:
            total += next(read) if isinstance(x, torch.Tensor) else float(x)
        return total / len(self._losses)

    def state_dict(self) -> dict[str, Any]:
        """The step count, the recent losses, and the compressed leaders' references and
        compressor (not the model's or the optimizer's state: save those as usual)."""
        state = {"format": _STATE_FORMAT, "numel": self._numel, "policy": self.policy,
                 "compressed": None if self._compressed is None else dict(self._compressed), "steps": self.steps,
                 "losses": [float(x) for x in self._losses], "loss_window": self.loss_window}
        if self._compressed is not None:
            state["references"] = [self._impl.reference(0), self._impl.reference(1)]
            record = self._impl.save_compressor()
            state["compressor"] = torch.frombuffer(bytearray(record), dtype=torch.uint8)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores a state_dict() of a LeaderSGD of the same model size and settings, on
        every rank (each its own). Raises :class:`gradcomp.InvalidArgumentError` for
        another size or settings; nothing changes then."""
        if not isinstance(state_dict, dict) or state_dict.get("format") != _STATE_FORMAT:
            raise InvalidArgumentError("gradcomp: LeaderSGD.load_state_dict: not a LeaderSGD state_dict")
        for key, mine in (("numel", self._numel), ("policy", self.policy), ("compressed", self._compressed),
                          ("loss_window", self.loss_window)):
            if state_dict.get(key) != mine:
                raise InvalidArgumentError(f"gradcomp: LeaderSGD.load_state_dict: the state's {key} is "
                                           f"{state_dict.get(key)!r}, this LeaderSGD's is {mine!r}")
        steps = check.integer("LeaderSGD.load_state_dict", "steps", state_dict.get("steps"), 0)
        losses = [check.real("LeaderSGD.load_state_dict", "losses", x) for x in state_dict.get("losses", [])]
        if self._compressed is not None:
            references = state_dict.get("references")
            if not isinstance(references, (list, tuple)) or len(references) != 2:
                check.fail("LeaderSGD.load_state_dict", "the state's references must be a list of two tensors")
            old = [self._impl.reference(0), self._impl.reference(1)]
            try:
                for kind, r in enumerate(references):
                    self._impl.set_reference(kind, check.tensor("LeaderSGD.load_state_dict", "references", r).cpu())
                self._impl.load_compressor(state_dict["compressor"].cpu().contiguous().numpy().tobytes())
            except Exception:
                for kind, r in enumerate(old):
                    self._impl.set_reference(kind, r)
                raise
        self._impl.steps = steps
        self._losses = collections.deque(losses, maxlen=self.loss_window)
