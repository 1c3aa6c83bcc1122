"""FSDP2 (``fully_shard``) training on Fashion-MNIST with 4 gloo ranks of this machine,
once with a dense reduce-scatter and once with gradcomp's (gradcomp.torch.fsdp): the
test accuracy after the same epochs and the bytes each rank puts into the reduce-scatter
per step. Needs torch 2.x with gradcomp installed (experiments/fsdp.sh).

gloo has no reduce-scatter, so FSDP's own cannot run here; the dense baseline is the
same reduce-scatter built on ``all_to_all_single`` (each rank sends every other rank the
chunk it owns: (W - 1)/W of the unsharded gradient, what NCCL's ring reduce-scatter
sends too), summed in rank order.

    python3 -m experiments.fsdp_fashion_mnist [--ranks 4] [--epochs 2] [--density 0.01] [--out results.json]
"""
import argparse
import json
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

import gradcomp.torch.fsdp  # noqa: E402
from examples.fashion_mnist import load


class DenseReduceScatter(ReduceScatter):
    """FSDP's reduce-scatter over all_to_all_single: rank j receives every rank's chunk j."""

    def __init__(self):
        self.bytes_sent = 0

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        world = group.size()
        chunks = input_tensor.reshape(world, -1)
        received = torch.empty_like(chunks)
        dist.all_to_all_single(received, chunks, group=group)
        total = received[0].clone()
        for r in range(1, world):
            total += received[r]
        if op == dist.ReduceOp.AVG:
            total /= world
        output_tensor.copy_(total.view_as(output_tensor))
        self.bytes_sent += chunks[0].numel() * chunks.element_size() * (world - 1)
        return None


def model():
    """784-512-256-10 ReLU MLP: 535 k parameters in three FSDP groups."""
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


def train(rank, world, init, method, args, results):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    torch.manual_seed(0)
    net = model()
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(net)
    scatters = []
    for module in net.modules():
        if isinstance(module, FSDPModule):
            if method == "dense":
                scatters.append(DenseReduceScatter())
            else:
                scatters.append(gradcomp.torch.fsdp.ReduceScatter(method="topk_ef", density=args.density))
            module.set_custom_reduce_scatter(scatters[-1])
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr)
    x, y = load("train")
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(1))
    shard = order[rank::world]
    steps_per_epoch = len(shard) // args.batch
    steps = 0
    started = time.perf_counter()
    for epoch in range(args.epochs):
        perm = shard[torch.randperm(len(shard), generator=torch.Generator().manual_seed(100 * epoch + rank))]
        for b in range(steps_per_epoch):
            idx = perm[b * args.batch:(b + 1) * args.batch]
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(net(x[idx]), y[idx]).backward()
            optimizer.step()
            steps += 1
    elapsed = time.perf_counter() - started
    tx, ty = load("test")
    with torch.no_grad():
        accuracy = (net(tx).argmax(dim=1) == ty).float().mean().item()
    sent = sum(s.bytes_sent for s in scatters)
    if rank == 0:
        results[method] = {"accuracy": accuracy, "reduce_scatter_bytes_per_step": sent / steps, "steps": steps,
                           "train_seconds": elapsed, "parameters": sum(p.numel() for p in net.parameters())}
    dist.barrier()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = mp.Manager().dict()
    for method in ("dense", "gradcomp"):
        with tempfile.TemporaryDirectory() as tmp:
            mp.start_processes(train, args=(args.ranks, os.path.join(tmp, "init"), method, args, results),
                               nprocs=args.ranks, start_method="spawn")
    print(f"FSDP2, {args.ranks} gloo ranks, {args.epochs} epochs, batch {args.batch} per rank, lr {args.lr}, "
          f"topk_ef density {args.density}, torch {torch.__version__}")
    print("| reduce-scatter | test accuracy | bytes sent per rank per step | vs dense | train s |")
    print("|---|---:|---:|---:|---:|")
    dense = results["dense"]["reduce_scatter_bytes_per_step"]
    for method in ("dense", "gradcomp"):
        r = results[method]
        print(f"| {method} | {100 * r['accuracy']:.2f}% | {r['reduce_scatter_bytes_per_step']:,.0f} | "
              f"{dense / r['reduce_scatter_bytes_per_step']:.0f}x | {r['train_seconds']:.0f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(results), f, indent=2)


if __name__ == "__main__":
    main()
