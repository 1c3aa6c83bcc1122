"""Argument checks shared by gradcomp's Python entry points: each refuses a value of the
wrong kind with :class:`gradcomp.InvalidArgumentError` naming the call, the argument and
what it got, before anything is read or changed."""

import numbers

import torch

from .errors import InvalidArgumentError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def kind(value):
    """What a value is, for an error message: ``None``, ``a list``, ``a numpy.ndarray``."""
    if value is None:
        return "None"
    t = type(value)
    name = t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__name__}"
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def fail(who, text):
    raise InvalidArgumentError(f"gradcomp: {who}: {text}")


def tensor(who, name, value):
    """``value`` if it is a torch.Tensor."""
    if not isinstance(value, torch.Tensor):
        hint = " (wrap bytes with torch.frombuffer(bytearray(b), dtype=torch.uint8))" \
            if isinstance(value, (bytes, bytearray)) else ""
        fail(who, f"{name} must be a torch.Tensor, got {kind(value)}{hint}")
    return value


def real(who, name, value):
    """``value`` as a float, if it is a real number (a bool is not)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        fail(who, f"{name} must be a real number, got {kind(value)}")
    return float(value)


def integer(who, name, value, low=INT64_MIN, high=INT64_MAX):
    """``value`` as an int, if it is an integer (a bool is not) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        fail(who, f"{name} must be an int, got {kind(value)}")
    value = int(value)
    if not low <= value <= high:
        fail(who, f"{name} must be in [{low}, {high}], got {value}")
    return value


def boolean(who, name, value):
    """``value`` if it is a bool."""
    if not isinstance(value, bool):
        fail(who, f"{name} must be a bool, got {kind(value)}")
    return value


def text(who, name, value):
    """``value`` if it is a str."""
    if not isinstance(value, str):
        fail(who, f"{name} must be a str, got {kind(value)}")
    return value


def device(who, value):
    """``value`` as the torch.device of a compressor: cpu (any index: cpu tensors have
    none) or cuda."""
    if not isinstance(value, (str, torch.device)):
        fail(who, f"device must be a str or torch.device, got {kind(value)}")
    try:
        d = torch.device(value)
    except (RuntimeError, ValueError) as e:
        fail(who, f"device {value!r} is not a device ({e})")
    if d.type == "cpu":
        return torch.device("cpu")
    if d.type != "cuda":
        fail(who, f"device must be cpu or cuda, got {str(d)!r}")
    return d


def option(who, name, value):
    """A keyword option of a policy: a bool, an int that fits 64 bits, a float or a str."""
    if isinstance(value, bool) or isinstance(value, (float, str)):
        return value
    if isinstance(value, numbers.Integral):
        return integer(who, f"option {name}", value)
    if isinstance(value, numbers.Real):
        return float(value)
    fail(who, f"option {name} must be a bool, int, float or str, got {kind(value)}")
