"""The Lightning and Accelerate examples (examples/lightning_fashion_mnist.py,
examples/accelerate_fashion_mnist.py) train docs/results.md's CNN on 2 CPU processes with
gradcomp's hook, under a timeout. Lightning and Accelerate come from PyPI into the torch
2.x environment (scripts/torch2_env.sh); elsewhere these tests skip."""
import os
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
ARGS = ["--train", "4096", "--start-iter", "5", "--density", "0.01"]


def run(command, what):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=EXAMPLES)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=400, env=env,
                              start_new_session=True)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{what} did not finish in 400 s:\n{e.stdout}\n{e.stderr}")
    assert done.returncode == 0, done.stdout + done.stderr
    line = next((x for x in done.stdout.splitlines() if x.startswith(what)), None)
    assert line is not None, done.stdout + done.stderr
    accuracy = float(line.split("test accuracy ")[1].split("%")[0])
    assert accuracy > 50, line  # one pass over 4096 images: far above chance (10%)
    assert "'compressed_buckets': " in line and "'compressed_buckets': 0," not in line, line


def test_lightning_example():
    pytest.importorskip("lightning", reason="Lightning is installed in the torch 2.x environment")
    run([sys.executable, os.path.join(EXAMPLES, "lightning_fashion_mnist.py"), "--devices", "2"] + ARGS, "lightning")


def test_accelerate_example():
    pytest.importorskip("accelerate", reason="Accelerate is installed in the torch 2.x environment")
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         os.path.join(EXAMPLES, "accelerate_fashion_mnist.py")] + ARGS, "accelerate")
