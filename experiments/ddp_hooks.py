"""Data-parallel CNN training on Fashion-MNIST with DistributedDataParallel on gloo ranks
of this machine, once per communication hook: dense all-reduce, torch's fp16 and
PowerSGD hooks, and gradcomp's topk_ef, dgc and scalecom hooks, and ok_topk (topk_ef with
Ok-Topk's global top-k, aggregation="sparse_allreduce"). Prints, for each, the
test accuracy after the same epochs, the bytes each rank puts into collectives per step
(after the hooks' dense warm-up), the ratio to dense, and the hook's own time per step
(median: from the hook's call to its future's completion, summed over buckets).

    python3 -m experiments.ddp_hooks [--ranks 4] [--epochs 4] [--methods ...]

experiments/ddp_hooks.sh runs it as docs/results.md reports it.
"""
import argparse
import json
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import gradcomp.torch
from examples.fashion_mnist import cnn, load
from experiments.baselines import TORCH_HOOKS, Traffic, torch_hook
from gradcomp.torch import ddp as gddp

METHODS = TORCH_HOOKS + ["topk_ef", "dgc", "scalecom", "ok_topk"]


def timed(hook, times):
    """The hook, recording its own time per call until its future completes."""

    def wrapper(state, bucket):
        start = time.perf_counter()
        future = hook(state, bucket)

        def done(f):
            times.append(time.perf_counter() - start)
            return f.value()

        return future.then(done)

    return wrapper


def scalecom_options(method, args):
    return {"beta": args.scalecom_beta} if method == "scalecom" else {}


def train(rank, world, init, method, args, results):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    traffic = Traffic()
    torch.manual_seed(args.seed)
    net = torch.nn.parallel.DistributedDataParallel(cnn())
    start_iter = args.start_iter
    momentum, lr = 0.9, args.lr
    if method in TORCH_HOOKS:
        state, hook = torch_hook(method, start_iter)
    elif method == "dgc":
        # DGC's momentum correction lives in the hook: the optimizer runs without it.
        state = gddp.State(method="dgc", density=0.25, start_iter=start_iter, max_norm=args.max_norm, workers=world)
        hook, momentum = gddp.hook, 0.0
    elif method == "ok_topk":  # top-k with error feedback, the global top-k of the summed gradient
        state = gddp.State(method="topk_ef", density=args.density, start_iter=start_iter,
                           aggregation="sparse_allreduce")
        hook, momentum = gddp.hook, args.ef_momentum
    else:
        # Error feedback already remembers what was not sent; momentum in the optimizer on
        # top of it amplifies the residuals it releases (at density 0.001 that diverged:
        # docs/results.md). So these run plain SGD unless --ef-momentum says otherwise.
        state = gddp.State(method=method, density=args.density, start_iter=start_iter, **scalecom_options(method, args))
        hook, momentum = gddp.hook, args.ef_momentum
    steps_times = []
    net.register_comm_hook(state, timed(hook, steps_times))
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)

    x, y = load("train")
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(args.seed + 1))
    shard = order[rank::world]
    steps_per_epoch = len(shard) // args.batch
    if args.steps_per_epoch:
        steps_per_epoch = min(steps_per_epoch, args.steps_per_epoch)
    warmup = gradcomp.torch.Warmup(final_density=args.density)
    per_step_time, per_step_bytes, step = [], [], 0
    started = time.perf_counter()
    for epoch in range(args.epochs):
        perm = shard[torch.randperm(len(shard),
                                    generator=torch.Generator().manual_seed(1000 * args.seed + 100 * epoch + rank))]
        for b in range(steps_per_epoch):
            if method == "dgc":  # DGC's warm-up, here over the first epoch in four stages
                state.set_density(warmup.by_step(step, max(1, steps_per_epoch // 4)))
            idx = perm[b * args.batch:(b + 1) * args.batch]
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(net(x[idx]), y[idx])
            traffic.bytes, traffic.counting = 0, True
            sent_before = state.bytes_sent if isinstance(state, gddp.State) else 0
            steps_times.clear()
            loss.backward()
            traffic.counting = False
            if isinstance(state, gddp.State):  # gradcomp's collectives run in C++: the hook counts them
                traffic.bytes += state.bytes_sent - sent_before
            optimizer.step()
            if step >= start_iter and (method != "dgc" or step >= steps_per_epoch):
                per_step_time.append(sum(steps_times))
                per_step_bytes.append(traffic.bytes)
            step += 1
    elapsed = time.perf_counter() - started
    accuracy = None
    if rank == 0:
        tx, ty = load("test")
        with torch.no_grad():
            accuracy = (net.module(tx).argmax(dim=1) == ty).float().mean().item()
    gathered = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(gathered, torch.tensor([statistics.median(per_step_time)], dtype=torch.float64))
    if rank == 0:
        results[method] = {
            "accuracy": accuracy,
            "bytes_per_step": statistics.mean(per_step_bytes),
            "hook_ms_median": 1e3 * statistics.median([t.item() for t in gathered]),
            "train_seconds": elapsed,
            "parameters": sum(p.numel() for p in net.parameters()),
            "steps": step,
        }
    dist.barrier()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--max-norm", type=float, default=5.0, help="DGC's local gradient clipping")
    parser.add_argument("--start-iter", type=int, default=10, help="dense iterations before any hook compresses")
    parser.add_argument("--ef-momentum", type=float, default=0.0,
                        help="the optimizer's momentum for topk_ef and scalecom (0: plain SGD)")
    parser.add_argument("--scalecom-beta", type=float, default=1.0, help="ScaleCom's low-pass filter weight")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--steps-per-epoch", type=int, default=0, help="cut epochs short (a smoke test)")
    parser.add_argument("--seed", type=int, default=0,
                        help="the initialisation (and, shifted, the data order); 0 is docs/results.md's runs")
    parser.add_argument("--out", default=None, help="write the results as JSON")
    args = parser.parse_args()
    results = mp.Manager().dict()
    for method in args.methods.split(","):
        if method not in METHODS:
            parser.error(f"unknown method {method!r} (one of {', '.join(METHODS)})")
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(train, args=(args.ranks, os.path.join(tmp, "init"), method, args, results), nprocs=args.ranks)
        r = results[method]
        print(f"{method}: accuracy {100 * r['accuracy']:.2f}%, {r['bytes_per_step']:.0f} B/step, "
              f"hook {r['hook_ms_median']:.3f} ms/step, {r['train_seconds']:.0f} s", flush=True)
    results = dict(results)
    dense = results.get("dense", {}).get("bytes_per_step")
    print(f"\n{args.ranks} gloo ranks, {args.epochs} epochs, batch {args.batch} per rank, "
          f"{results[next(iter(results))]['parameters']} parameters, density {args.density}\n")
    print("| hook | test accuracy | bytes sent per worker per step | ratio to dense | hook time per step (median) |")
    print("|---|---:|---:|---:|---:|")
    for method, r in results.items():
        ratio = f"{dense / r['bytes_per_step']:.0f}x" if dense else "-"
        print(f"| {method} | {100 * r['accuracy']:.2f}% | {r['bytes_per_step']:.0f} | {ratio} | "
              f"{r['hook_ms_median']:.3f} ms |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
