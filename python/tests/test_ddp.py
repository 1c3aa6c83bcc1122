"""gradcomp.torch.ddp on 2 and 4 gloo ranks (torch.multiprocessing), against reference
aggregations written in ddp_workers.py. A hang fails the test (timeout)."""
import pytest
import ranks


def spawn(world, names, tmp_path):
    ranks.spawn("ddp_workers", world, names, tmp_path, timeout=240)


@pytest.mark.parametrize("world", [2, 4])
def test_hook_against_reference(world, tmp_path):
    spawn(world, ["topk", "allreduce", "nan", "scalecom", "checkpoint", "16-bit", "methods", "schedules", "stats"],
          tmp_path)


@pytest.mark.parametrize("world", [2, 4])
def test_buckets_in_flight_overlap_and_agree(world, tmp_path):
    spawn(world, ["in-flight", "scalecom-in-flight"], tmp_path)


@pytest.mark.parametrize("world", [2, 4])
def test_sparse_allreduce_hook_against_reference(world, tmp_path):
    spawn(world, ["sparse"], tmp_path)


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_that_disagree_or_fail_early_raise_alike_and_nobody_waits(world, tmp_path):
    spawn(world, ["disagree"], tmp_path)


def test_real_ddp_training(tmp_path):
    spawn(2, ["training"], tmp_path)
