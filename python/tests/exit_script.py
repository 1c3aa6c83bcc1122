"""A DDP training script that uses gradcomp's hook and then exits, as a user writes one:
run by test_exit.py many times to show that it never hangs at exit.

    python exit_script.py --launch spawn|processes --world W --method M --teardown T

--launch spawn: torch.multiprocessing.spawn starts the ranks; processes: the caller
starts one process per rank with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, as
torchrun does. --teardown destroy: del the model, then dist.destroy_process_group();
group-first: destroy the group, then del the model; none: neither (leave as is).
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gradcomp.torch import ddp

OPTIONS = {"topk_ef": {"density": 0.5}, "dgc": {"density": 0.5, "max_norm": 5.0}, "scalecom": {"density": 0.5},
           "adacomp": {}, "threshold_ef": {"tau": 0.1}, "randomk_ef": {"density": 0.5},
           "topk_ef+sparse_allreduce": {"density": 0.5, "aggregation": "sparse_allreduce"},
           "dgc+sparse_allreduce": {"density": 0.5, "max_norm": 5.0, "aggregation": "sparse_allreduce"}}


def train(rank, world, method, teardown, init_method):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    net = torch.nn.parallel.DistributedDataParallel(model)
    state = ddp.State(method=method.split("+")[0], start_iter=2, **OPTIONS[method])  # "+": the aggregation
    net.register_comm_hook(state, ddp.hook)
    del state  # DDP holds it, as in a script that registers ddp.State(...) in place
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(rank))
    for _ in range(6):
        net(x).sum().backward()
    if teardown == "destroy":
        del net, model
        dist.destroy_process_group()
    elif teardown == "group-first":
        dist.destroy_process_group()
        del net, model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--launch", choices=["spawn", "processes"], required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--method", choices=sorted(OPTIONS), required=True)
    parser.add_argument("--teardown", choices=["destroy", "group-first", "none"], required=True)
    parser.add_argument("--init", required=True, help="file:// or tcp:// init method")
    a = parser.parse_args()
    if a.launch == "spawn":
        mp.spawn(train, args=(a.world, a.method, a.teardown, a.init), nprocs=a.world)
    else:
        train(int(os.environ["RANK"]), a.world, a.method, a.teardown, a.init)


if __name__ == "__main__":
    main()
