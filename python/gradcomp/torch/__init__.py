"""gradcomp on torch tensors: compressors, messages and schedules.

A :class:`Compressor` compresses successive gradients of one 1-D float32 tensor of a
fixed size into messages (``torch.uint8`` tensors in gradcomp's wire format) on the
tensor's device; :func:`decode` and :func:`accumulate` read them on any rank. The
methods are the C++ presets (``topk_ef``, ``dgc``, ``adacomp``, ``randomk_ef``,
``threshold_ef``, ``scalecom``) or an explicit composition (``method="compose"``);
options are the C++ policies' fields under the same names. See docs/torch.md.
"""

from __future__ import annotations

import numbers
from typing import Any, Iterable, Sequence

import torch

from .. import _arguments as check
from ..errors import InvalidArgumentError

try:
    from .. import _C
except ImportError as e:  # most often: torch changed since gradcomp was built against it
    try:
        from .._build import TORCH as _BUILT_WITH
    except ImportError:
        _BUILT_WITH = "an unknown torch"
    raise ImportError(f"gradcomp's extension does not load ({e}); it was built against torch {_BUILT_WITH}, this is "
                      f"torch {torch.__version__}: reinstall gradcomp (pip install --no-build-isolation .)") from e

__all__ = ["Compressor", "decode", "accumulate", "Warmup", "ratio_plan", "METHODS"]

#: The methods a Compressor takes (the binding's list, python/csrc/names.hpp).
METHODS = tuple(_C.methods())

_STATE_FORMAT = "gradcomp.torch.Compressor"


def _flatten(options):
    """Keyword options as the C++ layer reads them: ``selector``, ``corrector`` and
    ``encoder`` may be dicts of their policy's fields (``name`` naming the policy);
    a ``seed`` inside one of them is that policy's seed alone. Every value is checked
    (a bool, an int that fits 64 bits, a float or a str)."""
    flat = {}

    def put(key, value):
        if key in flat:
            raise InvalidArgumentError(f"gradcomp: option {key} is given twice")
        flat[key] = check.option("Compressor", key, value)

    for key, value in options.items():
        if key in ("selector", "corrector", "encoder") and isinstance(value, dict):
            for field, v in value.items():
                check.text("Compressor", f"a field name of option {key}", field)
                if field == "name":
                    if key == "encoder":
                        raise InvalidArgumentError("gradcomp: the encoder is index_value; give its fields only")
                    put(key, v)
                else:
                    put(f"{key}.seed" if field == "seed" else field, v)
        else:
            put(key, value)
    return flat


class Compressor:
    """Compresses successive gradients of one tensor of ``numel`` elements.

    ``method`` is a preset (``topk_ef``, ``dgc``, ``adacomp``, ``randomk_ef``,
    ``threshold_ef``, ``scalecom``) or ``"compose"`` with ``selector=``,
    ``corrector=`` (``none``, ``error_feedback``, ``momentum``, ``low_pass``,
    ``clip_norm``; behind clipping when ``max_norm`` is given), ``index=`` and
    ``value=`` codings. Other keyword options are the C++ policies' fields (``density``,
    ``beta``, ``max_norm``, ``bin``, ``levels``, ...). All state lives on ``device``.

    Raises :class:`gradcomp.InvalidArgumentError` naming an unknown method or option, or
    an option out of its range.
    """

    def __init__(self, numel: int, method: str = "topk_ef", *, device: str | torch.device = "cpu",
                 **options: bool | int | float | str | dict) -> None:
        numel = check.integer("Compressor", "numel", numel, 1, 2**32 - 1)
        self.method = check.text("Compressor", "method", method)
        self._options = dict(options)
        device = check.device("Compressor", device)
        if device.type == "cuda" and not _C.cuda:
            check.fail("Compressor", f"device {device} needs gradcomp's CUDA backend, which this build lacks: "
                       f"{_no_cuda()}")
        if device.type == "cuda" and torch.cuda.is_available():
            torch.cuda.init()  # torch 2 starts its caching allocator, which holds the state, lazily
        self._impl = _C.Compressor(numel, method, _flatten(options), device)

    @property
    def numel(self) -> int:
        """Elements of the tensor."""
        return self._impl.numel

    @property
    def device(self) -> torch.device:
        """Where the compressor's state lives, and its tensors must."""
        return self._impl.device

    @property
    def step(self) -> int:
        """Steps completed (seeds the sampled policies)."""
        return self._impl.step

    @property
    def density(self) -> float | None:
        """The selector's density, or None for selectors without one."""
        return self._impl.density

    @property
    def max_message_bytes(self) -> int:
        """Size of the largest message compress() can return."""
        return self._impl.max_message_bytes

    @property
    def signature(self) -> str:
        """The policies' names, as recorded in checkpoints."""
        return self._impl.signature

    def memory_bytes(self) -> dict[str, int]:
        """The bytes this compressor holds on its device: ``state`` (the corrector's
        memory: 4 bytes per element and array in float32; with ``memory_bits=8`` or ``4``,
        ``memory_bits / 8 + 1 / memory_block``), ``workspace`` (what its steps use: the
        selection's lists, the second float32 copy of the state, a 16-bit gradient's
        float32 copy where the method widens it: ``adacomp``, a corrector ``none``) and
        ``total``."""
        use = self._impl.memory_bytes()
        return {"state": use["state"], "workspace": use["workspace"], "total": use["state"] + use["workspace"]}

    def release_workspace(self) -> None:
        """Gives the workspace back (``memory_bytes()["workspace"]``, all but a few
        per-tile bytes) until the next step allocates it again; the state stays, so the
        steps that follow are those that would have followed. For compressors that take
        turns (FSDP's parameter groups): together they hold their states and one workspace.
        On CUDA, waits for the compressor's last step first. Raises
        :class:`gradcomp.InvalidArgumentError` while a step is staged (nothing changes)."""
        self._impl.release_workspace()

    def compress(self, grad: torch.Tensor) -> torch.Tensor:
        """One step: returns the message (1-D ``torch.uint8`` on grad's device).

        ``grad``: 1-D contiguous float32, float16 or bfloat16 tensor of ``numel``
        elements on ``device`` (16-bit values are widened exactly as they are read, with
        no float32 copy unless the corrector is none or the selector chunk_local; state
        stays float32).
        Raises :class:`gradcomp.NonFiniteError` if grad (or the memory updated with it)
        holds a NaN or infinity, :class:`gradcomp.InvalidArgumentError` for a bad
        tensor; the state is unchanged then.
        """
        return self._impl.compress(check.tensor("compress", "grad", grad))

    def stage(self, grad: torch.Tensor) -> torch.Tensor:
        """compress(), but the step becomes current only at accept_staged(); a later
        compress() or stage() drops it (collectives that must agree first)."""
        return self._impl.stage(check.tensor("stage", "grad", grad))

    def accept_staged(self) -> None:
        """Makes the staged step current."""
        self._impl.accept_staged()

    def preview(self, grad: torch.Tensor) -> torch.Tensor:
        """What the next compress(grad) would rank (the corrector's update of the
        committed memory), changing nothing."""
        return self._impl.preview(check.tensor("preview", "grad", grad))

    def set_density(self, density: float) -> None:
        """Changes the selector's density from the next step on (warm-up); for scalecom
        the leader's k and the compressor's capacity move together."""
        self._impl.set_density(check.real("set_density", "density", density))

    def set_indices(self, indices: torch.Tensor | Sequence[int]) -> None:
        """The ascending indices a ``given_indices`` compressor (scalecom) sends: a 1-D
        integer tensor, or a sequence of ints."""
        self._impl.set_indices(_index_tensor(indices))

    def corrector_state(self, array: int = 0) -> torch.Tensor:
        """A copy of the corrector's memory array ``array`` (the residual, say)."""
        return self._impl.corrector_state(check.integer("corrector_state", "array", array, 0))

    def state_dict(self) -> dict[str, Any]:
        """The step, density and memory, for ``torch.save``."""
        record = self._impl.save_state()
        return {
            "format": _STATE_FORMAT,
            "method": self.method,
            "numel": self.numel,
            "options": dict(self._options),
            "state": torch.frombuffer(bytearray(record), dtype=torch.uint8),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores a state_dict() of a compressor of the same method, options and size.

        Raises :class:`gradcomp.InvalidArgumentError` for another method or size and
        :class:`gradcomp.CorruptMessageError` for a damaged record; nothing changes then.
        """
        if not isinstance(state_dict, dict) or state_dict.get("format") != _STATE_FORMAT:
            raise InvalidArgumentError("gradcomp: load_state_dict: not a gradcomp.torch.Compressor state_dict")
        for key in ("method", "numel", "state"):
            if key not in state_dict:
                raise InvalidArgumentError(f"gradcomp: load_state_dict: the state_dict has no {key!r}")
        if state_dict["method"] != self.method:
            raise InvalidArgumentError(
                f"gradcomp: load_state_dict: the state is of method {state_dict['method']!r}, "
                f"this compressor's is {self.method!r}")
        if state_dict["numel"] != self.numel:
            raise InvalidArgumentError(
                f"gradcomp: load_state_dict: the state is for numel = {state_dict['numel']}, "
                f"this compressor has {self.numel}")
        record = state_dict["state"]
        if not isinstance(record, torch.Tensor) or record.dtype != torch.uint8 or record.dim() != 1 \
                or record.layout != torch.strided or record.device.type not in ("cpu", "cuda"):
            raise InvalidArgumentError("gradcomp: load_state_dict: 'state' must be a 1-D torch.uint8 tensor on cpu "
                                       f"or cuda, got {check.kind(record)}")
        self._impl.load_state(record.resolve_neg().cpu().contiguous().numpy().tobytes())

    def __repr__(self) -> str:
        return f"Compressor(numel={self.numel}, method={self.method!r}, device={str(self.device)!r}, step={self.step})"


def _held_by(compressors: Iterable["Compressor"], exchanges: Iterable[Any]) -> dict[str, int]:
    """What the hooks report as memory_bytes(): their compressors' and exchanges' bytes."""
    state = workspace = 0
    for c in compressors:
        use = c.memory_bytes()
        state += use["state"]
        workspace += use["workspace"]
    workspace += sum(x.memory_bytes() for x in exchanges)
    return {"state": state, "workspace": workspace, "total": state + workspace}


def _no_cuda():
    """Why this build has no CUDA backend (setup.py's record)."""
    try:
        from .._build import NO_CUDA
    except ImportError:
        return "the build recorded no reason"
    return NO_CUDA


def _index_tensor(indices):
    """Indices as a 1-D integer tensor: a tensor (its dtype and shape checked in C++),
    or a sequence of ints (a float, a bool or a str among them is refused, not cut)."""
    if isinstance(indices, torch.Tensor):
        return indices
    if isinstance(indices, (str, bytes)) or not hasattr(indices, "__len__"):
        check.fail("set_indices",
                   f"indices must be a 1-D integer tensor or a sequence of ints, got {check.kind(indices)}")
    values = list(indices)
    for j, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            check.fail("set_indices", f"indices[{j}] must be an int, got {check.kind(v)}")
        if not 0 <= int(v) <= 2**32 - 1:
            check.fail("set_indices", f"indices[{j}] = {int(v)} is not an index")
    return torch.tensor([int(v) for v in values], dtype=torch.int64)


def decode(message: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Reads a message: ``(indices int64, values float32, n)`` on the message's device.

    Raises :class:`gradcomp.CorruptMessageError` if anything in it is inconsistent.
    """
    return _C.decode(check.tensor("decode", "message", message))


def accumulate(message: torch.Tensor, dense: torch.Tensor, scale: float = 1.0) -> None:
    """``dense += scale * decode(message)``, in place. The whole message is checked
    first, and so is every sum (none may overflow to an infinity); on any error
    ``dense`` is unchanged. ``dense`` is written as an in-place op is: refused while it
    requires grad under grad mode (use ``torch.no_grad()``), and its version counter is
    bumped, so a tensor that backward saved and this changed makes backward raise.
    ``dense`` must not share memory with ``message``."""
    _C.accumulate(check.tensor("accumulate", "message", message), check.tensor("accumulate", "dense", dense),
                  check.real("accumulate", "scale", scale))


class Warmup:
    """DGC's density warm-up: ``max(start * factor**epoch, final_density)`` (25%,
    6.25%, 1.5625%, 0.39%, then 0.1% with the defaults). Feed it to set_density."""

    def __init__(self, start: float = 0.25, factor: float = 0.25, final_density: float = 0.001) -> None:
        self.start = check.real("Warmup", "start", start)
        self.factor = check.real("Warmup", "factor", factor)
        self.final_density = check.real("Warmup", "final_density", final_density)
        self.by_epoch(0)  # validates

    def by_epoch(self, epoch: int) -> float:
        """Density for a whole epoch (from 0)."""
        epoch = check.integer("Warmup.by_epoch", "epoch", epoch, 0, _UINT64_MAX)
        return _C.warmup_by_epoch(self.start, self.factor, self.final_density, epoch)

    def by_step(self, step: int, steps_per_epoch: int) -> float:
        """Density at a step, decaying smoothly within epochs."""
        step = check.integer("Warmup.by_step", "step", step, 0, _UINT64_MAX)
        steps_per_epoch = check.integer("Warmup.by_step", "steps_per_epoch", steps_per_epoch, 0, _UINT64_MAX)
        return _C.warmup_by_step(self.start, self.factor, self.final_density, step, steps_per_epoch)


_UINT64_MAX = 2**64 - 1


def ratio_plan(volumes: Iterable[float], mean_density: float, min_density: float) -> list[float]:
    """DAGC's per-worker densities for data volumes under a traffic budget."""
    if isinstance(volumes, (str, bytes)) or not hasattr(volumes, "__iter__"):
        check.fail("ratio_plan", f"volumes must be a sequence of numbers, got {check.kind(volumes)}")
    volumes = [check.real("ratio_plan", f"volumes[{j}]", v) for j, v in enumerate(volumes)]
    return _C.ratio_plan(volumes, check.real("ratio_plan", "mean_density", mean_density),
                         check.real("ratio_plan", "min_density", min_density))
