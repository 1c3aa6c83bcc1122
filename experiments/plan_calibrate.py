"""One rank of the measurements the step-time model (gradcomp.plan) takes, on the emulated
cluster (experiments/cluster.sh), for the MLP of experiments/ddp_cluster.py; every rank
measures at once, so the ranks share the machine's cores as they do in training:

- the step without communication: forward, optimizer, and when backward makes each DDP
  bucket ready (a hook that communicates nothing records the time of each call), with
  each bucket's floats and matrix shapes;
- what each method computes per bucket, timed on random gradients of the buckets' sizes:
  gradcomp's compression of a bucket and its decoding of W messages (per entry);
  fp16's casts; torch's PowerSGD hook (ranks 1 and 4, one bucket) and gradcomp's DDP
  hooks, as what each adds to the step of DDP over a group of this rank alone (the way
  experiments/gpu_step_cost.py measures them on a GPU);
- the computation in experiments/ddp_cluster.py's "communication alone" step;
- single collectives over the rate-limited links, a few sizes each: all_reduce (float32
  and float16), all_gather, broadcast, all_to_all_single (the seconds of the slowest
  rank, median of the repeats), to which experiments/plan_report.py fits each
  collective's latency and efficiency, and the processor seconds a rank spends in each
  (gloo computes on the cores backward needs).

    bash experiments/cluster.sh --ranks 4 --rate 1gbit -- \\
        build/venv/bin/python -m experiments.plan_calibrate --out calibration-1gbit.json
"""
import argparse
import json
import math
import os
import statistics
import time

import torch
import torch.distributed as dist

from experiments.ddp_cluster import mlp
from gradcomp.plan import MESSAGE_HEADER_BYTES

GRADCOMP_METHODS = ("topk_ef", "dgc", "scalecom")


def median_seconds(action, repeats):
    """Median seconds of action() over repeats calls, after one untimed call."""
    action()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def timeline(args):
    """Forward, backward, optimizer seconds and each bucket's readiness (median over steps)."""
    torch.manual_seed(0)
    net = torch.nn.parallel.DistributedDataParallel(mlp(), bucket_cap_mb=args.bucket_mb)
    calls, buckets = [], {}

    def no_communication(state, bucket):
        calls.append(time.perf_counter())
        buckets[bucket.index()] = [list(p.shape) for p in bucket.parameters()]
        future = torch.futures.Future()
        future.set_result(bucket.buffer())
        return future

    net.register_comm_hook(None, no_communication)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    x, y = torch.randn(args.batch, 1, 28, 28), torch.randint(0, 10, (args.batch,))
    rows = []
    for step in range(args.steps):
        calls.clear()
        dist.barrier()
        start = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        optimizer.zero_grad()
        backward_start = time.perf_counter()
        loss.backward()
        backward_end = time.perf_counter()
        optimizer.step()
        end = time.perf_counter()
        if step >= 2:
            rows.append((backward_start - start, backward_end - backward_start, end - backward_end,
                         [t - backward_start for t in calls]))
    column = lambda i: statistics.median(r[i] for r in rows)  # noqa: E731
    ready = [statistics.median(r[3][i] for r in rows) for i in range(len(rows[0][3]))]
    return {"forward": column(0), "backward": column(1), "optimizer": column(2), "ready": ready,
            "buckets": [buckets[i] for i in sorted(buckets)]}


def numel(shapes):
    return sum(math.prod(s) for s in shapes)


def bucket_costs(method, n, world, density, repeats):
    """(compression seconds, decoding seconds per entry, bytes per entry) of one bucket."""
    import gradcomp.torch as gt
    grad = torch.randn(n, generator=torch.Generator().manual_seed(n))
    c = gt.Compressor(n, method, density=density)
    leader = gt.Compressor(n, "compose", selector="exact_topk", corrector="none", density=density)

    def step():
        if method == "scalecom":  # every rank previews, the leader selects, every rank sends its values there
            c.set_indices(gt.decode(leader.compress(c.preview(grad)))[0])
        return c.compress(grad)

    compress = median_seconds(step, repeats)
    message = step()
    entries = gt.decode(message)[0].numel()
    dense = torch.zeros(n)

    def decode_all():
        for _ in range(world):
            gt.accumulate(message, dense, 1.0 / world)

    return (compress, median_seconds(decode_all, repeats) / (world * entries),
            (message.numel() - MESSAGE_HEADER_BYTES) / entries)


def gradcomp_costs(method, bucket_shapes, world, density, repeats):
    """Per bucket: compression seconds; decoding seconds per entry; bytes per entry."""
    compress, per_entry, entry_bytes = zip(*(bucket_costs(method, numel(s), world, density, repeats)
                                             for s in bucket_shapes))
    return {"compress": list(compress), "decode_per_entry": statistics.median(per_entry),
            "entry_bytes": statistics.median(entry_bytes)}


def fp16_costs(bucket_shapes, world, repeats):
    """Per bucket: torch's fp16 hook's casts, to float16 (divided by W) and back."""
    def casts_of(n):
        buffer = torch.randn(n)

        def casts():
            buffer.copy_(buffer.to(torch.float16).div_(world))

        return median_seconds(casts, repeats)

    return {"compress": [casts_of(numel(s)) for s in bucket_shapes]}


def training_step(args, group, state, hook):
    """One step of the MLP's training under DDP over ``group`` with ``hook``: a function
    that runs a step and returns its seconds."""
    torch.manual_seed(0)
    net = torch.nn.parallel.DistributedDataParallel(mlp(), process_group=group, bucket_cap_mb=args.bucket_mb)
    net.register_comm_hook(state, hook)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    x, y = torch.randn(args.batch, 1, 28, 28), torch.randint(0, 10, (args.batch,))

    def step():
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        optimizer.step()
        return time.perf_counter() - start

    return step


def added_in_turns(without, hooked, steps):
    """Per hook, the median over ``steps`` of its step less the step ``without`` it taken
    right after (always in that order), past the first 4 (the hooks start compressing at
    their third step; their first compressed one has no bounds yet). Taken in turns, so
    that what the shared machine does meanwhile falls on both (a difference of two
    medians taken apart moved by half between calibrations)."""
    added = {name: [] for name in hooked}
    for step in range(steps):
        for name, hooked_step in hooked.items():
            took, without_it = hooked_step(), without()
            if step >= 4:
                added[name].append(took - without_it)
    return {name: max(0.0, statistics.median(a)) for name, a in added.items()}


def powersgd_costs(args, own_group):
    """What torch's PowerSGD hook adds to the step, in one bucket (how it runs on gloo),
    measured on a group of this rank alone (its collectives cost nothing there)."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    one_bucket, first_bucket = args.bucket_mb, dist._DEFAULT_FIRST_BUCKET_BYTES
    args.bucket_mb = 1024.0
    dist._DEFAULT_FIRST_BUCKET_BYTES = int(args.bucket_mb * 2**20)
    none = training_step(args, own_group, None, no_communication)
    hooked = {}
    for r in (1, 4):
        state = powerSGD_hook.PowerSGDState(process_group=own_group, matrix_approximation_rank=r,
                                            start_powerSGD_iter=2, min_compression_rate=1.0,
                                            use_error_feedback=True, warm_start=True)
        hooked[f"powersgd{r}-onebucket"] = training_step(args, own_group, state, powerSGD_hook.powerSGD_hook)
    added = added_in_turns(none, hooked, args.hook_steps)
    args.bucket_mb, dist._DEFAULT_FIRST_BUCKET_BYTES = one_bucket, first_bucket
    return {name: {"compress": [seconds]} for name, seconds in added.items()}


def gradcomp_hook_costs(args, own_group, world, costs, shapes):
    """What gradcomp's DDP hooks add to the step on a group of this rank alone, as
    experiments/gpu_step_cost.py measures them on one GPU for the GPU predictions:
    spread over the buckets by their floats, less the decoding of the k entries a rank
    alone adds (the model adds what the method decodes among W ranks). Its decoding per
    entry is the compressor's own."""
    from gradcomp.torch import ddp as gddp

    none = training_step(args, own_group, None, no_communication)
    made = {"topk_ef": dict(method="topk_ef"), "dgc": dict(method="dgc", max_norm=5.0, workers=world),
            "scalecom": dict(method="scalecom"), "ok_topk": dict(method="topk_ef", aggregation="sparse_allreduce")}
    hooked = {name: training_step(args, own_group, gddp.State(own_group, density=args.density, start_iter=2, **kw),
                                  gddp.hook)
              for name, kw in made.items()}
    added = added_in_turns(none, hooked, args.hook_steps)
    sizes = [numel(s) for s in shapes]
    result = {}
    for name, seconds in added.items():
        own = costs["topk_ef" if name == "ok_topk" else name]
        per_bucket = [max(0.0, seconds * n / sum(sizes) - own["decode_per_entry"] * math.ceil(args.density * n))
                      for n in sizes]
        result[f"{name}-hook"] = {"compress": per_bucket, "decode_per_entry": own["decode_per_entry"],
                                  "entry_bytes": own["entry_bytes"]}
    return result


def no_communication(state, bucket):
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def probe_seconds(args):
    """experiments/ddp_cluster.py's "communication alone" step with a hook that
    communicates nothing: the computation that measurement still holds."""
    torch.manual_seed(0)
    model = mlp()
    net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    net.register_comm_hook(None, no_communication)
    fixed = [torch.randn(p.shape) for p in model.parameters()]
    seconds = []
    for step in range(args.steps):
        dist.barrier()
        start = time.perf_counter()
        net(torch.zeros(1, 1, 28, 28))
        sum((p * r).sum() for p, r in zip(net.parameters(), fixed)).backward()
        net.zero_grad()
        if step >= 3:
            seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def collectives(repeats):
    """Seconds of single collectives (the slowest rank's, median over repeats), and the
    processor seconds a rank spent in them (its process's, every thread: gloo's copies,
    sums and socket calls; the mean over ranks, median over repeats)."""
    world, rank = dist.get_world_size(), dist.get_rank()
    rows = []

    def measure(name, nbytes, action):
        action()
        seconds, busy = [], []
        for _ in range(repeats):
            dist.barrier()
            start, start_cpu = time.perf_counter(), time.process_time()
            action()
            took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            cpu = torch.tensor([time.process_time() - start_cpu], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            dist.all_reduce(cpu)
            seconds.append(took.item())
            busy.append(cpu.item() / world)
        rows.append({"collective": name, "bytes": nbytes, "seconds": statistics.median(seconds),
                     "cpu_seconds": statistics.median(busy)})

    # Gradient-like values, not zeros: gloo's float16 sums take 1.7x longer on them (16 MB
    # on 4 ranks at 1 Gbit/s: 0.49 s against 0.29 s of zeros). Small enough that the
    # repeated sums stay far from float16's overflow.
    g = torch.Generator().manual_seed(rank)
    for nbytes in (4096, 262144, 4194304, 16777216):
        t = torch.randn(nbytes // 4, generator=g) * 1e-3
        measure("all_reduce", nbytes, lambda t=t: dist.all_reduce(t))
        t = (torch.randn(nbytes // 2, generator=g) * 1e-3).to(torch.float16)  # gloo sums float16 on the CPU
        measure("all_reduce_fp16", nbytes, lambda t=t: dist.all_reduce(t))
    for nbytes in (1024, 65536, 1048576, 4194304):
        part = torch.zeros(nbytes, dtype=torch.uint8)
        parts = [torch.zeros(nbytes, dtype=torch.uint8) for _ in range(world)]
        measure("all_gather", nbytes, lambda p=parts, m=part: dist.all_gather(p, m))
        t = torch.zeros(nbytes, dtype=torch.uint8)
        measure("broadcast", nbytes, lambda t=t: dist.broadcast(t, 0))
        mine, theirs = torch.full((world * nbytes,), rank, dtype=torch.uint8), torch.zeros(world * nbytes,
                                                                                        dtype=torch.uint8)
        measure("all_to_all", nbytes, lambda m=mine, t=theirs: dist.all_to_all_single(t, m))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8, help="per rank, as in experiments/ddp_cluster.py")
    parser.add_argument("--bucket-mb", type=float, default=4.0)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--hook-steps", type=int, default=30, help="steps timing the hooks on one rank")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    result = {"world": world, "cores": len(os.sched_getaffinity(0)), "torch": torch.__version__,
              "density": args.density, **timeline(args)}
    shapes = result["buckets"]
    costs = {name: gradcomp_costs(name, shapes, world, args.density, args.repeats) for name in GRADCOMP_METHODS}
    costs["fp16"] = fp16_costs(shapes, world, args.repeats)
    own_group = [dist.new_group([r]) for r in range(world)][dist.get_rank()]
    costs.update(powersgd_costs(args, own_group))
    costs.update(gradcomp_hook_costs(args, own_group, world, costs, shapes))
    result["probe"] = probe_seconds(args)
    # Every rank's costs, the median over ranks: they shared the cores.
    every = [None] * world
    dist.all_gather_object(every, costs)
    for name, mine in costs.items():
        for key, value in mine.items():
            if isinstance(value, list):
                mine[key] = [statistics.median(e[name][key][i] for e in every) for i in range(len(value))]
            else:
                mine[key] = statistics.median(e[name][key] for e in every)
    result["costs"] = costs
    result["collectives"] = collectives(args.repeats)
    if dist.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
