"""One rank of the wire-traffic measurement (docs/results.md, "Bytes on the wire"): DDP
with gradcomp's hook over gloo on one bucket of --params float32 parameters, counted on
the rank's link of the emulated cluster (experiments/cluster.sh, which sets RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT and GLOO_SOCKET_IFNAME) and by the hook itself.

    python3 -m experiments.wire_traffic --params 930000 --aggregation sparse_allreduce --out r.json

The link's counters (/sys/class/net/IF/statistics: what the switch delivered to the rank
and what it took from it, frames with their headers, TCP's acknowledgements included)
are read after a barrier before and after --steps steps; the bytes of one barrier,
measured the same way, are taken off. Rank 0 writes every rank's figures per step.
"""
import argparse
import json
import math
import os

import torch
import torch.distributed as dist

from gradcomp.torch import ddp as gddp


class Linear(torch.nn.Module):
    """One parameter vector: the loss (w . x) makes the gradient x, a fresh random vector
    per rank and step, so the ranks' selections differ as data-parallel ranks' do."""

    def __init__(self, n):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(n))

    def forward(self, x):
        return (self.w * x).sum()


def link_bytes():
    """(received, sent) bytes of this rank's link so far."""
    interface = os.environ.get("GLOO_SOCKET_IFNAME", "eth0")
    read = lambda what: int(open(f"/sys/class/net/{interface}/statistics/{what}_bytes").read())  # noqa: E731
    return read("rx"), read("tx")


def counted(run):
    """The link's (received, sent) bytes of `run()`, all ranks' work finished (a barrier after)."""
    dist.barrier()
    before = link_bytes()
    run()
    dist.barrier()
    after = link_bytes()
    return after[0] - before[0], after[1] - before[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=int, default=930_000)
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--aggregation", default="allgather", choices=["allgather", "sparse_allreduce"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3, help="steps first, not counted (connections, buffers)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = Linear(args.params)
    bucket_mb = math.ceil(args.params * 4 / 2**20) + 1  # the whole model in one bucket
    net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
    state = gddp.State(method="topk_ef", density=args.density, start_iter=0, aggregation=args.aggregation)
    net.register_comm_hook(state, gddp.hook)
    generator = torch.Generator().manual_seed(1000 + rank)

    def steps(count):
        for _ in range(count):
            net.zero_grad()
            net(torch.randn(args.params, generator=generator)).backward()

    steps(args.warmup)
    barrier_bytes = counted(lambda: None)  # one barrier's traffic, taken off below
    before = state.stats(total=True)
    wire = counted(lambda: steps(args.steps))
    after = state.stats(total=True)
    per_step = lambda x: x / args.steps  # noqa: E731
    mine = {
        "rank": rank,
        "wire_received": per_step(wire[0] - barrier_bytes[0]),
        "wire_sent": per_step(wire[1] - barrier_bytes[1]),
        "barrier_received": barrier_bytes[0],
        "barrier_sent": barrier_bytes[1],
        "hook_received": per_step(after["bytes_received"] - before["bytes_received"]),
        "hook_sent": per_step(after["bytes_sent"] - before["bytes_sent"]),
        "collectives": per_step(after["collectives"] - before["collectives"]),
        "compressed_buckets": per_step(after["compressed_buckets"] - before["compressed_buckets"]),
        "entries_sent": per_step(after["entries_sent"] - before["entries_sent"]),
    }
    every = [None] * world
    dist.all_gather_object(every, mine)
    if rank == 0:
        result = {"ranks": world, "params": args.params, "density": args.density, "aggregation": args.aggregation,
                  "steps": args.steps, "torch": torch.__version__, "per_rank": every}
        text = json.dumps(result, indent=1)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)
        mean = lambda key: sum(r[key] for r in every) / world  # noqa: E731
        print(f"W={world} n={args.params} {args.aggregation}: per rank per step, wire received "
              f"{mean('wire_received'):.0f} B, sent {mean('wire_sent'):.0f} B; the hook reports received "
              f"{mean('hook_received'):.0f} B, sent {mean('hook_sent'):.0f} B, {mean('collectives'):.1f} collectives")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
