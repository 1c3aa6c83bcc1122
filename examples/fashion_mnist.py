"""What the Fashion-MNIST examples (Lightning, Accelerate) share, and nothing of
gradcomp's: Fashion-MNIST from Debian's dataset package, the options of the examples and
docs/results.md's CNN. The experiments (experiments/) train the same model on the same
data, importing it from here."""
import gzip
import os

import numpy as np
import torch

DATA = "/usr/share/datasets/fashion-mnist"


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
