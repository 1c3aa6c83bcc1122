"""gradcomp on torch tensors: compressors, messages and schedules.

A :class:`Compressor` compresses successive gradients of one 1-D float32 tensor of a
fixed size into messages (``torch.uint8`` tensors in gradcomp's wire format) on the
tensor's device; :func:`decode` and :func:`accumulate` read them on any rank. The
methods are the C++ presets (``topk_ef``, ``dgc``, ``adacomp``, ``randomk_ef``,
``threshold_ef``, ``scalecom``) or an explicit composition (``method="compose"``);
options are the C++ policies' fields under the same names. See docs/torch.md.
"""

import torch

from .. import _C
from ..errors import InvalidArgumentError

__all__ = ["Compressor", "decode", "accumulate", "Warmup", "ratio_plan", "METHODS"]

#: The methods a Compressor takes.
METHODS = ("topk_ef", "dgc", "adacomp", "randomk_ef", "threshold_ef", "scalecom", "compose")

_STATE_FORMAT = "gradcomp.torch.Compressor"


def _flatten(options):
    """Keyword options as the C++ layer reads them: ``selector``, ``corrector`` and
    ``encoder`` may be dicts of their policy's fields (``name`` naming the policy);
    a ``seed`` inside one of them is that policy's seed alone."""
    flat = {}

    def put(key, value):
        if key in flat:
            raise InvalidArgumentError(f"gradcomp: option {key} is given twice")
        flat[key] = value

    for key, value in options.items():
        if key in ("selector", "corrector", "encoder") and isinstance(value, dict):
            for field, v in value.items():
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

    def __init__(self, numel, method="topk_ef", *, device="cpu", **options):
        if not isinstance(numel, int) or isinstance(numel, bool):
            raise InvalidArgumentError(f"gradcomp: Compressor: numel must be an int, got {numel!r}")
        self.method = method
        self._options = dict(options)
        self._impl = _C.Compressor(numel, method, _flatten(options), torch.device(device))

    @property
    def numel(self):
        """Elements of the tensor."""
        return self._impl.numel

    @property
    def device(self):
        """Where the compressor's state lives, and its tensors must."""
        return self._impl.device

    @property
    def step(self):
        """Steps completed (seeds the sampled policies)."""
        return self._impl.step

    @property
    def density(self):
        """The selector's density, or None for selectors without one."""
        return self._impl.density

    @property
    def max_message_bytes(self):
        """Size of the largest message compress() can return."""
        return self._impl.max_message_bytes

    @property
    def signature(self):
        """The policies' names, as recorded in checkpoints."""
        return self._impl.signature

    def compress(self, grad):
        """One step: returns the message (1-D ``torch.uint8`` on grad's device).

        ``grad``: 1-D contiguous float32, float16 or bfloat16 tensor of ``numel``
        elements on ``device`` (16-bit values are widened exactly; state stays float32).
        Raises :class:`gradcomp.NonFiniteError` if grad (or the memory updated with it)
        holds a NaN or infinity, :class:`gradcomp.InvalidArgumentError` for a bad
        tensor; the state is unchanged then.
        """
        return self._impl.compress(grad)

    def stage(self, grad):
        """compress(), but the step becomes current only at accept_staged(); a later
        compress() or stage() drops it (collectives that must agree first)."""
        return self._impl.stage(grad)

    def accept_staged(self):
        """Makes the staged step current."""
        self._impl.accept_staged()

    def preview(self, grad):
        """What the next compress(grad) would rank (the corrector's update of the
        committed memory), changing nothing."""
        return self._impl.preview(grad)

    def set_density(self, density):
        """Changes the selector's density from the next step on (warm-up)."""
        self._impl.set_density(float(density))

    def set_indices(self, indices):
        """The ascending indices a ``given_indices`` compressor (scalecom) sends."""
        self._impl.set_indices(torch.as_tensor(indices))

    def corrector_state(self, array=0):
        """A copy of the corrector's memory array ``array`` (the residual, say)."""
        return self._impl.corrector_state(array)

    def state_dict(self):
        """The step, density and memory, for ``torch.save``."""
        record = self._impl.save_state()
        return {
            "format": _STATE_FORMAT,
            "method": self.method,
            "numel": self.numel,
            "options": dict(self._options),
            "state": torch.frombuffer(bytearray(record), dtype=torch.uint8),
        }

    def load_state_dict(self, state_dict):
        """Restores a state_dict() of a compressor of the same method, options and size.

        Raises :class:`gradcomp.InvalidArgumentError` for another method or size and
        :class:`gradcomp.CorruptMessageError` for a damaged record; nothing changes then.
        """
        if not isinstance(state_dict, dict) or state_dict.get("format") != _STATE_FORMAT:
            raise InvalidArgumentError("gradcomp: load_state_dict: not a gradcomp.torch.Compressor state_dict")
        if state_dict["method"] != self.method:
            raise InvalidArgumentError(
                f"gradcomp: load_state_dict: the state is of method {state_dict['method']!r}, "
                f"this compressor's is {self.method!r}")
        if state_dict["numel"] != self.numel:
            raise InvalidArgumentError(
                f"gradcomp: load_state_dict: the state is for numel = {state_dict['numel']}, "
                f"this compressor has {self.numel}")
        record = state_dict["state"]
        if not isinstance(record, torch.Tensor) or record.dtype != torch.uint8:
            raise InvalidArgumentError("gradcomp: load_state_dict: 'state' must be a torch.uint8 tensor")
        self._impl.load_state(record.cpu().contiguous().numpy().tobytes())

    def __repr__(self):
        return f"Compressor(numel={self.numel}, method={self.method!r}, device={str(self.device)!r}, step={self.step})"


def decode(message):
    """Reads a message: ``(indices int64, values float32, n)`` on the message's device.

    Raises :class:`gradcomp.CorruptMessageError` if anything in it is inconsistent.
    """
    return _C.decode(message)


def accumulate(message, dense, scale=1.0):
    """``dense += scale * decode(message)``, in place. The whole message is checked
    first; on any error ``dense`` is unchanged."""
    _C.accumulate(message, dense, float(scale))


class Warmup:
    """DGC's density warm-up: ``max(start * factor**epoch, final_density)`` (25%,
    6.25%, 1.5625%, 0.39%, then 0.1% with the defaults). Feed it to set_density."""

    def __init__(self, start=0.25, factor=0.25, final_density=0.001):
        self.start, self.factor, self.final_density = float(start), float(factor), float(final_density)
        self.by_epoch(0)  # validates

    def by_epoch(self, epoch):
        """Density for a whole epoch (from 0)."""
        return _C.warmup_by_epoch(self.start, self.factor, self.final_density, int(epoch))

    def by_step(self, step, steps_per_epoch):
        """Density at a step, decaying smoothly within epochs."""
        return _C.warmup_by_step(self.start, self.factor, self.final_density, int(step), int(steps_per_epoch))


def ratio_plan(volumes, mean_density, min_density):
    """DAGC's per-worker densities for data volumes under a traffic budget."""
    return _C.ratio_plan([float(v) for v in volumes], float(mean_density), float(min_density))
