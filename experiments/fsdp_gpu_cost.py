"""What gradcomp's FSDP2 reduce-scatter costs on one GPU (#40, items 2 and 4), and what
giving its workspace back between calls costs there. FSDP2 skips the reduce-scatter at
a world of one, so the calls are made as FSDP makes them, one per parameter group in
backward's order, over the groups of a GPT-2-small-shaped transformer under
``fully_shard`` (each block, then the root's embeddings; float32 gradients, FSDP's
``reduce_dtype``), inside a backward pass as FSDP makes them (so that gradcomp's calls
settle once at its end, their default on CUDA), world 1 over NCCL (the exchange runs,
the wire is empty). Per
reduce-scatter, per step (every group's call once):

- the step's time (median of the timed steps; the calls queued, then the device waited
  for) and what it adds over ``dense``;
- the peak of GPU memory allocated during the timed steps, and what gradcomp's
  instances hold between steps (``memory_bytes``);
- in one step traced by torch.profiler: the host synchronizations and where they ran,
  and the GPU time of gradcomp's kernels (experiments/gpu_step_cost.py's ``profiled``).

The reduce-scatters: ``dense`` (``reduce_scatter_tensor``, what FSDP runs), ``topk_ef``
(``keep_workspace=True`` and ``settle="step"``, the defaults on CUDA), ``topk_ef-call``
(``settle="call"``: each call reads its outcome before it returns), ``topk_ef-release``
(``keep_workspace=False``: each call gives its workspace back to torch's caching
allocator and takes it again at the next), ``topk_ef_m8`` (the error memory in 8 bits,
workspace kept), ``topk_ef-hsdp`` (``topk_ef``, each call followed by HSDP's compressed
all-reduce of its shard across replicas, ``fsdp.AllReduce``, here a replicate group of
one rank: both settle in the backward pass's one read).

    python3 -m experiments.fsdp_gpu_cost [--out fsdp_cost.json]

On a machine with no GPU, ``--device cpu --small`` runs the same code over gloo with
small groups (a check that the script works, not a measurement).
"""
import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

from experiments.gpu_step_cost import print_sync_sites, profiled, save, world_of_one

SCATTERS = ["dense", "topk_ef", "topk_ef-call", "topk_ef-release", "topk_ef_m8", "topk_ef-hsdp"]


def reduce_scatter_of(name, density):
    """A gradcomp ReduceScatter by name, or None for FSDP's own."""
    if name == "dense":
        return None
    from gradcomp.torch import fsdp
    options = {"memory_bits": 8} if name == "topk_ef_m8" else {}
    if name == "topk_ef-call":
        options["settle"] = "call"
    keep = name != "topk_ef-release"
    return fsdp.ReduceScatter(method="topk_ef", density=density, keep_workspace=keep, **options)


def in_backward(calls):
    """Runs ``calls()`` from a tensor hook inside a backward pass, as FSDP runs its
    reduce-scatters (its post-backward hooks), and returns once the pass ended."""
    def hook(grad):
        calls()  # returns None: the gradient stays as it is

    x = torch.zeros(1, requires_grad=True)
    y = x * 2.0
    y.register_hook(hook)
    y.sum().backward()


def group_sizes(small):
    """The parameter groups of GPT-2 small under fully_shard, in backward's order: 12 blocks
    of 7,087,872 parameters, then the root's embeddings (50,257 and 1,024 rows of 768) and
    final norm."""
    if small:
        return [4096] * 3 + [16384]
    return [7087872] * 12 + [(50257 + 1024) * 768 + 2 * 768]


def run(name, args, device):
    torch.manual_seed(0)
    sizes = group_sizes(args.small)
    g = torch.Generator().manual_seed(0)
    grads = [(torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g))).to(device) for n in sizes]
    shards = [torch.empty(n, device=device) for n in sizes]
    scatters = [reduce_scatter_of(name, args.density) for _ in sizes]
    group = dist.group.WORLD
    replicas = [None] * len(sizes)
    if name == "topk_ef-hsdp":
        from gradcomp.torch import fsdp
        replicas = [fsdp.AllReduce(group, method="topk_ef", density=args.density) for _ in sizes]
    cuda = device.type == "cuda"

    def calls():
        for rs, across, grad, shard in zip(scatters, replicas, grads, shards):
            if rs is None:
                dist.reduce_scatter_tensor(shard, grad, op=dist.ReduceOp.AVG, group=group)
            else:
                rs(shard, grad, group, dist.ReduceOp.AVG)
            if across is not None:
                across(shard)

    def step():
        in_backward(calls)
        if cuda:
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    wall = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        wall.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated(device) if cuda else 0
    syncs, sites, kernels, ours = profiled(step, device)
    held = {"state": 0, "workspace": 0}
    for rs in scatters + replicas:
        for key in held:
            held[key] += 0 if rs is None else rs.memory_bytes()[key]
    return {"reduce_scatter": name, "step_ms": 1e3 * statistics.median(wall), "groups": len(sizes),
            "parameters": sum(sizes), "peak_allocated_bytes": peak, "gradcomp_holds": held, "host_syncs": syncs,
            "sync_sites": sites, "kernel_ms": kernels, "gradcomp_kernel_ms": ours}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--scatters", default=",".join(SCATTERS))
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="a tiny model: a check of the script, not a measurement")
    parser.add_argument("--out", default="fsdp_cost.json")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)
    rows = []
    with world_of_one(device):
        base = None
        for name in args.scatters.split(","):
            row = run(name, args, device)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            base = row["step_ms"] if name == "dense" else base
            row["added"] = None if base is None else row["step_ms"] / base - 1
            rows.append(row)
            added = "" if row["added"] is None else f" ({100 * row['added']:+.1f}% over dense)"
            print(f"{name}: step {row['step_ms']:.2f} ms{added} over {row['groups']} groups, peak "
                  f"{row['peak_allocated_bytes'] / 2**20:.0f} MiB, gradcomp holds {row['gradcomp_holds']}, "
                  f"kernels {row['kernel_ms']:.2f} ms (gradcomp's {row['gradcomp_kernel_ms']:.3f} ms), host "
                  f"syncs {row['host_syncs']}", flush=True)
            print_sync_sites(row)
    save(args, rows, device)

if __name__ == "__main__":
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    main()
