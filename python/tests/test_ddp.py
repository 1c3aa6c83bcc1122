"""gradcomp.torch.ddp on 2 and 4 gloo ranks (torch.multiprocessing), against reference
aggregations written in ddp_workers.py. A hang fails the test (timeout)."""
import time

import pytest
import torch.multiprocessing as mp

import ddp_workers


def spawn(world, names, tmp_path, timeout=240):
    context = mp.start_processes(ddp_workers.worker, args=(world, str(tmp_path / "init"), names), nprocs=world,
                                 join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for p in context.processes:
                p.kill()
            pytest.fail(f"{names} on {world} ranks did not finish in {timeout} s (a rank hangs)")


@pytest.mark.parametrize("world", [2, 4])
def test_hook_against_reference(world, tmp_path):
    spawn(world, ["topk", "allreduce", "nan", "scalecom", "checkpoint", "16-bit", "methods", "schedules"], tmp_path)


@pytest.mark.parametrize("world", [2, 4])
def test_buckets_in_flight_overlap_and_agree(world, tmp_path):
    spawn(world, ["in-flight", "scalecom-in-flight"], tmp_path)


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_that_disagree_or_fail_early_raise_alike_and_nobody_waits(world, tmp_path):
    spawn(world, ["disagree"], tmp_path)


def test_real_ddp_training(tmp_path):
    spawn(2, ["training"], tmp_path)
