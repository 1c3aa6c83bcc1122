"""Running a test's scenarios on W gloo ranks of this machine (spawned processes), with
a timeout that fails the test if a rank hangs. Shared by test_ddp.py and test_fsdp.py."""
import multiprocessing
import os
import tempfile
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run_scenarios(rank, world, init_file, module, names, env):
    """One rank: joins the group and runs ``module.SCENARIOS[name](rank, world)`` for each
    name, with the variables ``env`` set."""
    torch.set_num_threads(1)
    os.environ.update(env, OMP_NUM_THREADS="1")
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    scenarios = __import__(module).SCENARIOS
    for name in names:
        scenarios[name](rank, world)
        dist.barrier()
    dist.destroy_process_group()


def spawn(module, world, names, tmp_path, timeout=240, env=None):
    """Runs the scenarios ``names`` of the worker module ``module`` on ``world`` ranks
    (each run rendezvouses in a file of its own: torch 2's FileStore keeps its keys), with
    the environment variables ``env`` set in each (the ranks inherit the environment of the
    fork server, not the test's)."""
    init = tempfile.mktemp(prefix="init-", dir=tmp_path)
    # Ranks are forked from a server that imported torch once (importing it takes seconds
    # per rank), not from pytest's process, whose threads a fork would copy mid-flight.
    multiprocessing.set_forkserver_preload(["torch", "torch.distributed", "gradcomp.torch", "ranks", module])
    context = mp.start_processes(run_scenarios, args=(world, init, module, names, env or {}), nprocs=world,
                                 join=False, start_method="forkserver")
    deadline = time.monotonic() + timeout
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for p in context.processes:
                p.kill()
            pytest.fail(f"{names} on {world} ranks did not finish in {timeout} s (a rank hangs)")
