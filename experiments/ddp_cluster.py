"""One rank of the time-to-accuracy measurement on the emulated cluster (docs/results.md,
"Time, not bytes"): a wide MLP of 12.1 M parameters on Fashion-MNIST, trained with
DistributedDataParallel (gloo, several buckets) under one communication hook, the same
initialisation and data order for every hook. experiments/ddp_cluster_hooks.sh runs it on 4
ranks through experiments/cluster.sh (which sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

    python3 -m experiments.ddp_cluster --hook dense|fp16|powersgd1|powersgd4|topk_ef|dgc|scalecom|ok_topk|none
                                 --steps 200 --out result.json

Three phases, each timed on every rank with a barrier before it (rank 0 writes the JSON):
- training: --steps steps (forward, backward with the hook, SGD step), the test accuracy
  on --test-images images every --eval-every steps (not counted in the training time);
- communication only: --probe-steps steps of a model with the same parameters whose
  gradient costs almost nothing (a fixed random tensor per parameter), under a fresh
  state of the same hook: what the hook's exchange costs when nothing hides it;
- computation only ("none"): the training step with a hook that communicates nothing.
"""
import argparse
import datetime
import hashlib
import json
import statistics
import time

import torch
import torch.distributed as dist

from examples.fashion_mnist import load
from experiments.baselines import TORCH_HOOKS, Traffic, torch_hook

GRADCOMP_HOOKS = ["topk_ef", "dgc", "scalecom", "ok_topk"]
HOOKS = ["none"] + TORCH_HOOKS + GRADCOMP_HOOKS


def mlp():
    """784 -> 2048 -> 2048 -> 2048 -> 1024 -> 10 with ReLUs: 12.1 M parameters, which DDP
    (4 MB buckets) puts in 4 buckets."""
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 2048), torch.nn.ReLU(),
                               torch.nn.Linear(2048, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 2048),
                               torch.nn.ReLU(), torch.nn.Linear(2048, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))


def no_communication(state, bucket):
    """Every rank keeps its own gradient: the step's computation alone."""
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def counting_calls(hook, calls):
    """The hook, counting its calls: DDP calls it once per bucket."""

    def counted(state, bucket):
        calls[0] += 1
        return hook(state, bucket)

    return counted


def hook_for(name, args, world):
    """(state, hook, the optimizer's momentum) of a hook by name. gradcomp is imported only
    for its own hooks: torch's run under any torch, its 2.x environment included."""
    if name == "none":
        return None, no_communication, 0.9
    if name in TORCH_HOOKS:
        return (*torch_hook(name, args.start_iter), 0.9)
    from gradcomp.torch import ddp as gddp
    if name == "dgc":  # DGC's momentum correction is in the hook: plain SGD outside
        return gddp.State(method="dgc", density=args.density, start_iter=args.start_iter, max_norm=args.max_norm,
                          workers=world), gddp.hook, 0.0
    # Error feedback remembers what was not sent; SGD momentum on top of it amplifies the
    # residuals it releases (docs/results.md), so plain SGD. ok_topk: topk_ef with
    # Ok-Topk's global top-k instead of the all-gather.
    if name == "ok_topk":
        return gddp.State(method="topk_ef", density=args.density, start_iter=args.start_iter,
                          aggregation="sparse_allreduce"), gddp.hook, 0.0
    return gddp.State(method=name, density=args.density, start_iter=args.start_iter), gddp.hook, 0.0


def digest(tensors):
    """What every run must share, whatever its torch: a hash of the tensors' bytes."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def synced_seconds():
    dist.barrier()
    return time.perf_counter()


def evaluate(net, tx, ty):
    with torch.no_grad():
        return (net.module(tx).argmax(dim=1) == ty).float().mean().item()


def bytes_sent(state, traffic):
    """What this rank put into collectives: torch's through torch.distributed (counted by
    Traffic), gradcomp's in C++ (counted by its State)."""
    return traffic.bytes + getattr(state, "bytes_sent", 0)


def train(args, rank, world):
    torch.manual_seed(0)
    model = mlp()
    init_digest = digest(model.parameters())
    net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    state, hook, momentum = hook_for(args.hook, args, world)
    calls = [0]
    net.register_comm_hook(state, counting_calls(hook, calls))
    optimizer = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=momentum)
    traffic = Traffic()
    x, y = load("train")
    tx, ty = load("test")
    tx, ty = tx[:args.test_images], ty[:args.test_images]
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(1))[rank::world]
    step_seconds, step_bytes, curve, clock = [], [], [], 0.0
    for step in range(args.steps):
        idx = order[(step * args.batch) % len(order):][:args.batch]
        start = synced_seconds()
        traffic.counting, traffic.bytes = True, 0
        before = bytes_sent(state, traffic)
        optimizer.zero_grad()
        calls[0] = 0
        torch.nn.functional.cross_entropy(net(x[idx]), y[idx]).backward()
        optimizer.step()
        seconds = time.perf_counter() - start
        traffic.counting = False
        clock += seconds
        if step >= args.start_iter:
            step_seconds.append(seconds)
            step_bytes.append(bytes_sent(state, traffic) - before)
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            curve.append((step + 1, clock, evaluate(net, tx, ty) if rank == 0 else None))
    return {"step_seconds": step_seconds, "step_bytes": step_bytes, "curve": curve, "buckets": calls[0],
            "parameters": sum(p.numel() for p in net.parameters()), "torch": torch.__version__,
            "init_digest": init_digest, "order_digest": digest([order])}


def communication_only(args, rank, world):
    """The hook's exchange with next to no computation: the gradient of sum(p * r) is r."""
    torch.manual_seed(0)
    model = mlp()
    net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    state, hook, _ = hook_for(args.hook, args, world)
    if args.hook in GRADCOMP_HOOKS:
        state.start_iter = 1
    elif state is not None:
        state.start_powerSGD_iter = 1
    net.register_comm_hook(state, hook)
    g = torch.Generator().manual_seed(rank)
    fixed = [torch.randn(p.shape, generator=g) for p in model.parameters()]
    seconds = []
    for step in range(args.probe_steps):
        start = synced_seconds()
        net(torch.zeros(1, 1, 28, 28))  # DDP's forward prepares the reducer for backward
        sum((p * r).sum() for p, r in zip(net.parameters(), fixed)).backward()
        net.zero_grad()
        if step >= 3:  # past the dense first step and the first compressed (bound-less) one
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hook", choices=HOOKS, required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--max-norm", type=float, default=5.0, help="DGC's local gradient clipping")
    parser.add_argument("--start-iter", type=int, default=10, help="dense steps before a hook compresses")
    parser.add_argument("--bucket-mb", type=float, default=4.0, help="DDP's bucket_cap_mb")
    parser.add_argument("--one-bucket", action="store_true",
                        help="every gradient in one DDP bucket, DDP's small first bucket included: how torch's "
                             "PowerSGD hook runs on gloo, whose chained collectives interleave with several buckets")
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--test-images", type=int, default=2000)
    parser.add_argument("--probe-steps", type=int, default=12)
    parser.add_argument("--collective-timeout", type=float, default=120.0, help="seconds before gloo gives up")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.one_bucket:
        args.bucket_mb = 1024.0
        dist._DEFAULT_FIRST_BUCKET_BYTES = int(args.bucket_mb * 2**20)  # DDP's documented knob (torch < 2.1 uses it)
    # A hook whose collectives mismatch across ranks may hang instead of aborting: bounded.
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.collective_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    result = train(args, rank, world)
    result["communication_only_seconds"] = None if args.hook == "none" else communication_only(args, rank, world)
    dist.barrier()
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"hook": args.hook, "world": world, "args": vars(args), **result}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
