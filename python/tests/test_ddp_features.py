"""The DDP hook under DistributedDataParallel's own features, on 2 and 4 gloo ranks
(ddp_features.py): every step against a reference, no hang (a timeout fails the test).
The test command runs the suite under torch 1.13 and torch 2.x: the 4-rank runs, the
slowest, run under torch 2.x only (what users have); torch 1.13 runs them on 2 ranks."""
import pytest
import ranks
import torch

WORLDS = [2, pytest.param(4, marks=pytest.mark.skipif(
    torch.__version__.startswith("1."),
    reason="4 ranks run under torch 2.x (the test command's other run of the suite)"))]


def spawn(world, names, tmp_path):
    ranks.spawn("ddp_features", world, names, tmp_path, timeout=600, env={"GRADCOMP_TEST_DIR": str(tmp_path)})


@pytest.mark.parametrize("world", WORLDS)
def test_ddp_features_against_reference(world, tmp_path):
    spawn(world, ["features", "16-bit", "subgroups", "density-1", "compile"], tmp_path)


@pytest.mark.parametrize("world", WORLDS)
def test_every_method_under_ddp_features(world, tmp_path):
    spawn(world, ["methods"], tmp_path)


@pytest.mark.parametrize("world", WORLDS)
def test_misuse_and_non_finite_gradients(world, tmp_path):
    spawn(world, ["one-state-per-model", "non-finite"], tmp_path)


@pytest.mark.parametrize("world", WORLDS)
def test_resume_in_new_processes_equals_uninterrupted(world, tmp_path):
    spawn(world, ["uninterrupted"], tmp_path)
    spawn(world, ["resumed"], tmp_path)
