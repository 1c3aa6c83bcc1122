"""The exceptions of gradcomp, one per ``gradcomp::errc`` of the C++ library.

Each carries the library's message, which names the parameter and its value. Every
call that raises one leaves its outputs and the compressor's state as they were.
"""


class Error(RuntimeError):
    """Any error gradcomp reports. ``code`` is the C++ ``gradcomp::errc`` name."""

    code = "error"


class InvalidArgumentError(Error, ValueError):
    """A parameter or tensor is outside its documented domain (dtype, size, device, range)."""

    code = "invalid_argument"


class BufferTooSmallError(Error, ValueError):
    """An output buffer cannot hold the result."""

    code = "buffer_too_small"


class NonFiniteError(Error, ValueError):
    """A gradient, or the corrector's memory updated with it, holds a NaN or infinity."""

    code = "non_finite"


class CorruptMessageError(Error, ValueError):
    """A message or saved state failed validation."""

    code = "corrupt_message"


class StateIOError(Error, OSError):
    """A state record could not be read or written."""

    code = "io"


class DeviceError(Error):
    """The GPU runtime reported an error."""

    code = "device"
