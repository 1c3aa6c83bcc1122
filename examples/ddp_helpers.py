"""What the Fashion-MNIST examples (plain DDP, Lightning, Accelerate) and
bench/ddp_cluster.py share, and nothing of gradcomp's, so that the benchmark's torch-only
runs work under any torch: Fashion-MNIST from Debian's dataset package, the CNN of
docs/results.md, a counter of the bytes a rank puts into collectives, and torch's own
communication hooks by name."""
import gzip
import os

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

DATA = "/usr/share/datasets/fashion-mnist"
TORCH_HOOKS = ["dense", "fp16", "powersgd1", "powersgd4"]


def read_idx(name):
    with gzip.open(os.path.join(DATA, name), "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(split):
    prefix = "train" if split == "train" else "t10k"
    x = torch.from_numpy(read_idx(f"{prefix}-images-idx3-ubyte.gz").astype(np.float32) / 255.0)
    y = torch.from_numpy(read_idx(f"{prefix}-labels-idx1-ubyte.gz").astype(np.int64))
    return ((x - 0.2860) / 0.3530).unsqueeze(1), y


def training_arguments(parser):
    """The options the Lightning and Accelerate examples share: the hook's method, density
    and dense warm-up, and the training's length and step size."""
    parser.add_argument("--method", default="topk_ef")
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--start-iter", type=int, default=10, help="dense iterations first")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--train", type=int, default=60000, help="training images used")
    parser.add_argument("--lr", type=float, default=0.05)
    return parser


def cnn():
    """docs/results.md's model: two convolutions and two dense layers, 114 k parameters."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 7 * 7, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


class Traffic:
    """Counts the bytes this rank puts into collectives (the input tensors)."""

    def __init__(self):
        self.bytes = 0
        self.counting = False
        for name in ("all_reduce", "all_gather", "broadcast", "reduce"):
            original = getattr(dist, name)

            def counted(*args, _original=original, _name=name, **kwargs):
                if self.counting:
                    tensor = args[1] if _name == "all_gather" else args[0]
                    self.bytes += tensor.numel() * tensor.element_size()
                return _original(*args, **kwargs)

            setattr(dist, name, counted)


def torch_hook(name, start_iter):
    """(state, hook) of one of torch's hooks (TORCH_HOOKS): dense all-reduce, fp16, or
    PowerSGD of rank N with error feedback and warm start, compressing from start_iter."""
    if name == "dense":
        return None, default_hooks.allreduce_hook
    if name == "fp16":
        return None, default_hooks.fp16_compress_hook
    if name.startswith("powersgd"):
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=int(name[len("powersgd"):]),
                                            start_powerSGD_iter=start_iter, min_compression_rate=1.0,
                                            use_error_feedback=True, warm_start=True)
        return state, powerSGD_hook.powerSGD_hook
    raise ValueError(f"torch_hook: unknown hook {name!r} (one of {', '.join(TORCH_HOOKS)})")
