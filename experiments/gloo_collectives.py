"""One rank of the measurement of what single gloo collectives cost on the wire
(docs/results.md, "Bytes on the wire"): each collective of a few sizes, repeated, counted
on the rank's link of the emulated cluster (experiments/cluster.sh) as in
experiments/wire_traffic.py, one barrier's bytes taken off. Rank 0 prints the mean and
largest bytes a rank received and sent per call.

    bash experiments/cluster.sh --ranks 16 --rate 10gbit -- python3 -m experiments.gloo_collectives
"""
import torch
import torch.distributed as dist

from experiments.wire_traffic import link_bytes


def measure(name, collective, repeats=10):
    rank, world = dist.get_rank(), dist.get_world_size()
    collective()  # connections and buffers first
    dist.barrier()
    before = link_bytes()
    dist.barrier()
    after = link_bytes()
    barrier = (after[0] - before[0], after[1] - before[1])
    dist.barrier()
    start = link_bytes()
    for _ in range(repeats):
        collective()
    dist.barrier()
    end = link_bytes()
    mine = torch.tensor([(end[0] - start[0] - barrier[0]) / repeats, (end[1] - start[1] - barrier[1]) / repeats])
    every = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(every, mine)
    if rank == 0:
        received = [e[0].item() for e in every]
        sent = [e[1].item() for e in every]
        print(f"| {world} | {name} | {sum(received) / world:,.0f} | {max(received):,.0f} | {sum(sent) / world:,.0f} | "
              f"{max(sent):,.0f} |", flush=True)


def main():
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    for count in (4, 256):
        counts = torch.zeros(count, dtype=torch.int32)
        measure(f"all_reduce of {4 * count} B", lambda c=counts: dist.all_reduce(c))
    for size in (64, 4800):
        part = torch.zeros(size, dtype=torch.uint8)
        parts = [torch.zeros(size, dtype=torch.uint8) for _ in range(world)]
        measure(f"all_gather of {size} B parts", lambda p=parts, m=part: dist.all_gather(p, m))
        copies, gathered = part.repeat(world), torch.zeros(world * size, dtype=torch.uint8)
        measure(f"all_to_all_single of {size} B to each rank",
                lambda g=gathered, c=copies, s=size: dist.all_to_all_single(g, c, [s] * world, [s] * world))
    counts, theirs = torch.zeros(world, dtype=torch.int64), torch.zeros(world, dtype=torch.int64)
    measure("all_to_all_single of 8 B to each rank", lambda t=theirs, c=counts: dist.all_to_all_single(t, c))
    value = torch.zeros(16)
    measure("broadcast of 64 B", lambda: dist.broadcast(value, 0))
    measure("barrier", dist.barrier)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
