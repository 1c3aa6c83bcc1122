"""examples/torch_ddp_fashion_mnist.py runs every hook (briefly), so it cannot rot."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.skipif(not os.path.isdir("/usr/share/datasets/fashion-mnist"),
                    reason="dataset-fashion-mnist not installed")
def test_the_comparison_runs_every_hook(tmp_path):
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "torch_ddp_fashion_mnist.py"), "--ranks", "2", "--epochs", "2",
         "--steps-per-epoch", "12", "--start-iter", "2", "--out", str(tmp_path / "r.json")],
        capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    for method in ("dense", "fp16", "powersgd1", "powersgd4", "topk_ef", "dgc", "scalecom"):
        assert f"| {method} |" in out.stdout
