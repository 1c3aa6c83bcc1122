"""experiments/ddp_hooks.py runs every hook (briefly), so it cannot rot."""
import os
import signal
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DATA = "/usr/share/datasets/fashion-mnist"
# The experiments are run under torch 2.x, the first target; the test command's run of the
# suite under torch 1.13 (the oldest supported) covers the package, not the experiments.
pytestmark = pytest.mark.skipif(torch.__version__.startswith("1."),
                                reason="the experiments run under torch 2.x (that run of the suite covers them)")


def run_example(methods, tmp_path, timeout):
    """The experiment on 2 ranks, run as the README of experiments/ says (a module, from the
    repository's root); on a timeout, its spawned ranks are killed with it."""
    with subprocess.Popen(
            [sys.executable, "-m", "experiments.ddp_hooks", "--ranks", "2", "--epochs", "2", "--steps-per-epoch", "12",
             "--start-iter", "2", "--methods", ",".join(methods), "--out", str(tmp_path / "r.json")],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


@pytest.mark.skipif(not os.path.isdir(DATA), reason="dataset-fashion-mnist not installed")
def test_the_comparison_runs_every_hook(tmp_path):
    methods = ("dense", "fp16", "topk_ef", "dgc", "scalecom", "ok_topk")
    out = run_example(methods, tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    for method in methods:
        assert f"| {method} |" in out.stdout


@pytest.mark.skipif(not os.path.isdir(DATA), reason="dataset-fashion-mnist not installed")
def test_the_comparison_runs_torchs_powersgd(tmp_path):
    """torch 1.13's PowerSGD hook on gloo hangs now and then, even in this model's single
    bucket (seen in 1 of 3 runs on 2026-11-26: its callbacks block a gloo thread on the
    next all-reduce), which is torch's, not the example's: one retry after a hang."""
    methods = ("powersgd1", "powersgd4")
    for attempt in (1, 2):
        try:
            out = run_example(methods, tmp_path, timeout=180)
            break
        except subprocess.TimeoutExpired:
            if attempt == 2:
                raise
    assert out.returncode == 0, out.stderr[-3000:]
    for method in methods:
        assert f"| {method} |" in out.stdout
