"""One rank of the Leader SGD measurement on the emulated cluster (docs/results.md,
"Leader SGD against averaging and elastic averaging"): docs/results.md's Fashion-MNIST
CNN trained by W ranks, the same initial parameters and data order for every method:

- dense: DDP, dense all-reduce (DDP's own), SGD with momentum;
- dgc: DDP with gradcomp's dgc hook (density 0.01, its momentum in the hook);
- local_sgd: every rank trains its own copy; every --period steps the parameters are
  averaged (one all-reduce);
- easgd: elastic averaging SGD (Zhang, Choromanska and LeCun, "Deep learning with
  Elastic Averaging SGD", NeurIPS 2015), synchronous: every --period steps each rank
  moves alpha of the way toward the center and the center moves alpha of each rank's
  distance toward the ranks (alpha = 0.9 / W, the paper's beta = 0.9; every rank holds
  the same center, updated from one all-reduce of the distances);
- lsgd: gradcomp.torch.lsgd.LeaderSGD, the leaders' parameters whole;
- lsgd_compressed: the same, the leaders' changes by top-k (--leader-density) with
  float16 values.

W = 8 runs two groups of 4 for LSGD (the global pull every --global-every rounds).
Every rank's link is counted where the traffic travels (/sys/class/net/IF/statistics of
the rank's interface on experiments/cluster.sh's bridge, frames with headers, the few
barriers and gathers around the evaluations included); the library's own count beside
it where it has one. Every --eval-every steps each rank's
test accuracy on --test-images images (not counted in the training time); for easgd
also the center's.

    python3 -m experiments.lsgd_cluster --method lsgd --out r.json  (inside cluster.sh)
"""
import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from examples.fashion_mnist import cnn, load
from experiments.wire_traffic import link_bytes

METHODS = ["dense", "dgc", "local_sgd", "easgd", "lsgd", "lsgd_compressed"]


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def assign(model, values):
    with torch.no_grad():
        offset = 0
        for p in model.parameters():
            p.copy_(values[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


class LocalSgd:
    """Every `period` steps the ranks' parameters are replaced by their mean."""

    def __init__(self, model, period):
        self.model, self.period, self.steps, self.bytes_sent = model, period, 0, 0

    def step(self, loss):
        self.steps += 1
        if self.steps % self.period:
            return
        x = flat(self.model)
        dist.all_reduce(x)
        self.bytes_sent += 4 * x.numel()
        assign(self.model, x / dist.get_world_size())


class Easgd:
    """Synchronous EASGD: every `period` steps, with d_r = x_r - center, x_r <- x_r - alpha
    d_r and center <- center + alpha sum_r d_r (every rank the same center)."""

    def __init__(self, model, period, alpha):
        self.model, self.period, self.alpha = model, period, alpha
        self.center = flat(model).clone()
        self.steps, self.bytes_sent = 0, 0

    def step(self, loss):
        self.steps += 1
        if self.steps % self.period:
            return
        x = flat(self.model)
        d = x - self.center
        total = d.clone()
        dist.all_reduce(total)
        self.bytes_sent += 4 * total.numel()
        assign(self.model, x - self.alpha * d)
        self.center += self.alpha * total


def accuracy(model, tx, ty):
    with torch.no_grad():
        return (model(tx).argmax(dim=1) == ty).float().mean().item()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", required=True, choices=METHODS)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--batch", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--period", type=int, default=4, help="local steps between exchanges (LSGD's l_comm)")
    parser.add_argument("--global-every", type=int, default=4, help="LSGD: rounds between global pulls")
    parser.add_argument("--pull", type=float, default=0.1, help="LSGD: local and global pull")
    parser.add_argument("--leader-density", type=float, default=0.02)
    parser.add_argument("--eval-every", type=int, default=40)
    parser.add_argument("--test-images", type=int, default=2000)
    parser.add_argument("--label", default=None, help="the run's name in the report (default: the method)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = cnn()
    x, y = load("train")
    tx, ty = load("test")
    tx, ty = tx[:args.test_images], ty[:args.test_images]
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(1))[rank::world]
    steps = int(args.epochs * len(order) / args.batch)
    exchange, net, momentum = None, model, 0.9
    if args.method in ("dense", "dgc"):
        net = torch.nn.parallel.DistributedDataParallel(model)
        if args.method == "dgc":
            from gradcomp.torch import ddp as gddp
            exchange = gddp.State(method="dgc", density=0.01, start_iter=10, workers=world)
            net.register_comm_hook(exchange, gddp.hook)
            momentum = 0.0  # DGC's momentum correction is in the hook
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=momentum)
    if args.method == "local_sgd":
        exchange = LocalSgd(model, args.period)
    elif args.method == "easgd":
        exchange = Easgd(model, args.period, 0.9 / world)
    elif args.method.startswith("lsgd"):
        from gradcomp.torch.lsgd import LeaderSGD
        exchange = LeaderSGD(model, period=args.period, global_every=args.global_every, local_pull=args.pull,
                             global_pull=args.pull, group_size=4 if world == 8 else 0,
                             compressed={"density": args.leader_density, "value": "f16"}
                             if args.method == "lsgd_compressed" else None)
    # The clock runs from a barrier to a barrier around the training between evaluations:
    # the job's wall time, its slowest rank's, with no barrier inside it.
    dist.barrier()
    wire_start = link_bytes()
    curve, clock, start = [], 0.0, time.perf_counter()
    for step in range(steps):
        idx = order[step * args.batch:(step + 1) * args.batch]
        optimizer.zero_grad()
        loss = F.cross_entropy(net(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        if args.method not in ("dense", "dgc"):
            exchange.step(loss.item())
        if (step + 1) % args.eval_every == 0 or step + 1 == steps:
            dist.barrier()
            clock += time.perf_counter() - start
            mine = [accuracy(model, tx, ty), accuracy_center(exchange, model, tx, ty)]
            wire = link_bytes()
            report = torch.tensor(mine + [wire[0] - wire_start[0], wire[1] - wire_start[1]], dtype=torch.float64)
            every = [torch.zeros_like(report) for _ in range(world)]
            dist.all_gather(every, report)  # after the wire was read: not counted in this point
            curve.append({"step": step + 1, "seconds": clock, "accuracy": [float(r[0]) for r in every],
                          "center_accuracy": float(every[0][1]) if args.method == "easgd" else None,
                          "received": [int(r[2]) for r in every], "sent": [int(r[3]) for r in every]})
            if rank == 0:
                print(f"{args.method} W={world} step {step + 1}/{steps}: {clock:.1f} s, accuracy mean "
                      f"{sum(curve[-1]['accuracy']) / world:.4f}, sent per rank "
                      f"{sum(curve[-1]['sent']) / world / 1e6:.2f} MB", flush=True)
            dist.barrier()
            start = time.perf_counter()
    library = int(getattr(exchange, "bytes_sent", 0) or 0)
    libraries = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(libraries, torch.tensor([float(library)], dtype=torch.float64))
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"method": args.method, "label": args.label or args.method, "world": world, "steps": steps,
                       "batch": args.batch, "lr": args.lr, "period": args.period, "global_every": args.global_every,
                       "pull": args.pull, "leader_density": args.leader_density,
                       "parameters": flat(model).numel(), "torch": torch.__version__, "curve": curve,
                       "library_bytes_sent": [int(v) for v in libraries]}, f, indent=1)
    dist.destroy_process_group()


def accuracy_center(exchange, model, tx, ty):
    """EASGD's center's accuracy (every rank holds the same), else 0."""
    if not isinstance(exchange, Easgd):
        return 0.0
    kept = flat(model).clone()
    assign(model, exchange.center)
    result = accuracy(model, tx, ty)
    assign(model, kept)
    return result


if __name__ == "__main__":
    main()
