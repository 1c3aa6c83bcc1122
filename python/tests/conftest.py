import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # reference.py


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device (the CUDA tests run on a machine with a GPU)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device and a CUDA build of gradcomp")
