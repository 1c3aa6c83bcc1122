"""gradcomp: gradient compression for distributed training.

The compressors live in :mod:`gradcomp.torch` (tensors) and :mod:`gradcomp.torch.ddp`
(a DistributedDataParallel communication hook); every error they raise is a
:class:`gradcomp.Error` (see :mod:`gradcomp.errors`).
"""

from .errors import (
    BufferTooSmallError,
    CorruptMessageError,
    DeviceError,
    Error,
    InvalidArgumentError,
    NonFiniteError,
    StateIOError,
)

__version__ = "0.1.0"

__all__ = [
    "Error",
    "InvalidArgumentError",
    "BufferTooSmallError",
    "NonFiniteError",
    "CorruptMessageError",
    "StateIOError",
    "DeviceError",
    "__version__",
]
