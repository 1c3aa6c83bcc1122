"""One rank of the sharded-training measurement on the emulated cluster (docs/results.md,
"FSDP2: a transformer on a slow link"): a byte-level transformer language model of 10.8 M
parameters trained under ``fully_shard`` (bfloat16 parameters and compute, float32
reduce, FSDP2's MixedPrecisionPolicy) on the GNU Collaborative International Dictionary
of English (Debian's dict-gcide), with one reduce-scatter per run:

- ``dense``: FSDP's reduce-scatter of the float32 gradient (gloo has none, so it is built
  on all_to_all_single, as experiments/fsdp_fashion_mnist.py's: each rank sends every
  other rank the chunk it owns, (W - 1)/W of the gradient, what a ring sends too);
- ``topk_ef``: gradcomp.torch.fsdp.ReduceScatter, top-k with error feedback, its memory
  in float32;
- ``topk_ef_m8`` / ``topk_ef_m4``: the same with the error memory stored in 8 or 4 bits
  (``memory_bits``, docs/algorithms.md "Compressed memory");
- ``int4``: the published baseline, ZeRO++'s quantized reduce-scatter (qgZ, one hop):
  every entry of every chunk quantized in blocks of 128 with gradcomp's ``int4`` value
  coding (a float32 scale per block, 4 bits an entry), no error feedback
  (:class:`Int4ReduceScatter`).

With ``--replicas R`` (R dividing the world) the model is sharded hybridly (HSDP): over
each replica's W/R ranks, the replicas' shards then all-reduced. ``dense`` and ``int4``
leave that all-reduce to FSDP (native HSDP: ``fully_shard`` over the 2-D mesh, float32
over gloo); the gradcomp methods shard over each replica's ranks and compress the
replicas' all-reduce too (``gradcomp.torch.fsdp.AllReduce``, Ok-Topk's global top-k with
error feedback, at the same density, settled as ``--settle`` says);
``across_topk_ef_m8`` reduce-scatters densely within each replica and compresses only the
replicas' all-reduce (the usual HSDP layout: a fast link within a node, a slow one
across).

``--density-warmup S`` starts gradcomp's methods with DGC's warm-up of the density (25% of
the entries, then a quarter of that every S steps, smoothly, down to ``--density``).

experiments/fsdp_lm_cluster.sh runs it on the ranks of experiments/cluster.sh (which sets
RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and GLOO_SOCKET_IFNAME). The same
initialisation and the same batches for every method. Per step (a barrier before each):
the time, the bytes the rank's link sent and received (its counters in
/sys/class/net, what the switch saw, TCP/IP headers and acknowledgements included);
every --eval-every steps the validation loss (not counted in the training time); at the
end the peak resident memory of each rank from the model's making on (VmHWM, reset
after the corpus is read) and what it held before the model was made.

    python3 -m experiments.fsdp_lm --method dense|topk_ef|topk_ef_m8|topk_ef_m4|int4 --steps 200 --out r.json
"""
import argparse
import datetime
import gzip
import json
import math
import os
import re
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

import gradcomp.torch.fsdp
from experiments.fsdp_fashion_mnist import DenseReduceScatter

CORPUS = "/usr/share/dictd/gcide.dict.dz"  # dict-gcide; dictzip is gzip with an index
METHODS = {"dense": None, "topk_ef": {}, "topk_ef_m8": {"memory_bits": 8}, "topk_ef_m4": {"memory_bits": 4},
           "int4": None, "across_topk_ef_m8": {"memory_bits": 8}}


def corpus_bytes(limit):
    """The dictionary's text as bytes (the tokens: a vocabulary of 256), runs of white space
    made one space, at most ``limit`` bytes."""
    with gzip.open(CORPUS) as f:
        text = f.read()
    text = re.sub(rb"\s+", b" ", text)[:limit]
    return torch.frombuffer(bytearray(text), dtype=torch.uint8)


class Int4ReduceScatter(ReduceScatter):
    """ZeRO++'s qgZ (Wang et al., 2023) in one hop, from its description: rank i quantizes
    every chunk j of its gradient in blocks (gradcomp's ``int4`` value coding: each block
    of 128 entries a float32 scale = its max|v| / 7 and 4-bit round(v / scale); no error
    feedback, so the rounding is lost) and sends it to rank j (``all_to_all_single``: the
    messages' sizes, then the messages), which adds the W decoded chunks in rank order.
    The message's index section costs a byte per 128 entries (every index is sent)."""

    def __init__(self):
        self.compressor = None

    def allocate(self, size, *, dtype, device):
        return torch.empty(*size, dtype=dtype, device=device)

    def memory_bytes(self):
        """What its compressor holds (workspace only: no error feedback, no state)."""
        return self.compressor.memory_bytes() if self.compressor is not None else {"total": 0}

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        world = group.size()
        chunks = input_tensor.reshape(world, -1)
        if self.compressor is None:
            self.compressor = gradcomp.torch.Compressor(chunks.shape[1], "compose", selector="exact_topk",
                                                        density=1.0, corrector="none", value="int4")
        messages = [self.compressor.compress(chunk) for chunk in chunks]
        sizes = [m.numel() for m in messages]
        theirs = torch.empty(world, dtype=torch.int64)
        dist.all_to_all_single(theirs, torch.tensor(sizes, dtype=torch.int64), group=group)
        received = torch.empty(int(theirs.sum()), dtype=torch.uint8)
        dist.all_to_all_single(received, torch.cat(messages), output_split_sizes=theirs.tolist(),
                               input_split_sizes=sizes, group=group)
        total = torch.zeros(chunks.shape[1], dtype=torch.float32)
        factor = 1.0 / world if op == dist.ReduceOp.AVG else 1.0
        for message in received.split(theirs.tolist()):
            gradcomp.torch.accumulate(message, total, factor)
        output_tensor.copy_(total.view_as(output_tensor))
        return None


class Block(torch.nn.Module):
    """Pre-norm transformer block: causal self-attention, then a 4x GELU MLP."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.norm2 = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class LanguageModel(torch.nn.Module):
    """Byte-level GPT: token and position embeddings, ``layers`` blocks, a final norm and an
    output layer of its own (untied, so that each FSDP group owns its parameters)."""

    def __init__(self, context, width, layers, heads):
        super().__init__()
        self.tokens = torch.nn.Embedding(256, width)
        self.positions = torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = torch.nn.LayerNorm(width)
        self.out = torch.nn.Linear(width, 256)

    def forward(self, idx):
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.out(self.norm(x))


def windows(data, count, context, generator):
    """``count`` random windows of context + 1 tokens: inputs and next-token targets."""
    starts = torch.randint(0, len(data) - context - 1, (count,), generator=generator)
    rows = torch.stack([data[s:s + context + 1] for s in starts.tolist()]).long()
    return rows[:, :-1], rows[:, 1:]


def link_bytes():
    """(sent, received) by this rank's link, as the kernel counts its frames; (0, 0) off
    the cluster."""
    link = os.environ.get("GLOO_SOCKET_IFNAME")
    if not link:
        return 0, 0
    read = lambda what: int(open(f"/sys/class/net/{link}/statistics/{what}_bytes").read())  # noqa: E731
    return read("tx"), read("rx")


def resident_mib(field):
    """This process's resident memory now (VmRSS) or at its peak (VmHWM), in MiB."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def forget_peak():
    """Starts VmHWM again from what is resident now (Linux's clear_refs 5), so that the peak
    is the training's, not the corpus's reading."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def validation_loss(net, inputs, targets, world):
    """The mean next-token loss over the validation windows, each rank taking its share."""
    with torch.no_grad():
        loss = F.cross_entropy(net(inputs).float().flatten(0, 1), targets.flatten(), reduction="sum")
    total = torch.tensor([loss.item(), targets.numel()], dtype=torch.float64)
    dist.all_reduce(total)
    return (total[0] / total[1]).item()


def train(args, rank, world):
    data = corpus_bytes(args.corpus_bytes)
    split = len(data) - len(data) // 100  # the last 1% is the validation text
    train_data, val_data = data[:split], data[split:]
    vx, vy = windows(val_data, args.val_windows, args.context, torch.Generator().manual_seed(7))
    share = args.val_windows // world
    vx, vy = vx[rank * share:(rank + 1) * share], vy[rank * share:(rank + 1) * share]
    forget_peak()
    before_model_mib = resident_mib("VmRSS")

    torch.manual_seed(0)
    net = LanguageModel(args.context, args.width, args.layers, args.heads)
    parameters = sum(p.numel() for p in net.parameters())
    precision = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    options = METHODS[args.method]
    mesh, replicas = None, None
    if args.method.startswith("across_") and args.replicas < 2:
        raise ValueError(f"--method {args.method} compresses the replicas' all-reduce: give --replicas 2 or more")
    if args.replicas > 1:
        from torch.distributed.device_mesh import init_device_mesh
        if world % args.replicas != 0:
            raise ValueError(f"--replicas {args.replicas} does not divide the world, {world}")
        hybrid = init_device_mesh("cpu", (args.replicas, world // args.replicas),
                                  mesh_dim_names=("replicate", "shard"))
        # Native HSDP over the 2-D mesh; gradcomp's over each replica's ranks, its own all-reduce.
        mesh = hybrid if options is None else hybrid["shard"]
        replicas = hybrid["replicate"].get_group()
    for block in net.blocks:
        fully_shard(block, mesh=mesh, mp_policy=precision)
    fully_shard(net, mesh=mesh, mp_policy=precision)
    scatters = []
    for module in net.modules():
        if isinstance(module, FSDPModule):
            if args.method in ("dense", "across_topk_ef_m8"):
                scatter = DenseReduceScatter()
            elif args.method == "int4":
                scatter = Int4ReduceScatter()
            else:
                scatter = gradcomp.torch.fsdp.ReduceScatter(method="topk_ef", density=args.density,
                                                            keep_workspace=args.keep_workspace, settle=args.settle,
                                                            **options)
            module.set_custom_reduce_scatter(scatter)
            scatters.append(scatter)
            if replicas is not None and options is not None:
                across = gradcomp.torch.fsdp.AllReduce(replicas, method="topk_ef", density=args.density,
                                                       keep_workspace=args.keep_workspace, settle=args.settle,
                                                       **options)
                module.set_all_reduce_hook(across)
                scatters.append(across)
    optimizer = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=0.0)
    batches = torch.Generator().manual_seed(1000 + rank)  # each rank its own data, the same for every method
    ours = (gradcomp.torch.fsdp.ReduceScatter, gradcomp.torch.fsdp.AllReduce)
    compressing = [s for s in scatters if isinstance(s, ours)]
    warmup = gradcomp.torch.Warmup(final_density=args.density) if args.density_warmup else None

    step_seconds, step_sent, step_received, curve, clock = [], [], [], [], 0.0
    for step in range(args.steps):
        x, y = windows(train_data, args.batch, args.context, batches)
        lr = args.lr * min(1.0, (step + 1) / args.warmup)
        for group in optimizer.param_groups:
            group["lr"] = lr
        if warmup is not None:  # DGC's warm-up, an "epoch" of --density-warmup steps
            for s in compressing:
                s.set_density(warmup.by_step(step, args.density_warmup))
        dist.barrier()
        sent, received = link_bytes()
        start = time.perf_counter()
        optimizer.zero_grad()
        F.cross_entropy(net(x).float().flatten(0, 1), y.flatten()).backward()
        optimizer.step()
        seconds = time.perf_counter() - start
        after_sent, after_received = link_bytes()
        clock += seconds
        step_seconds.append(seconds)
        step_sent.append(after_sent - sent)
        step_received.append(after_received - received)
        if step == 0 or (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            loss = validation_loss(net, vx, vy, world)
            curve.append((step + 1, clock, loss))
            if rank == 0:
                print(f"{args.method} step {step + 1} train {clock:.1f} s validation loss {loss:.4f}", flush=True)
            if not math.isfinite(loss):
                raise RuntimeError(f"{args.method}: the validation loss is {loss} at step {step + 1}")
    held = [s.memory_bytes()["total"] for s in scatters if hasattr(s, "memory_bytes")]
    groups = sum(not isinstance(s, gradcomp.torch.fsdp.AllReduce) for s in scatters)
    return {"parameters": parameters, "step_seconds": step_seconds, "link_sent_bytes": step_sent,
            "link_received_bytes": step_received, "curve": curve,
            "peak_resident_mib": resident_mib("VmHWM"),
            "before_model_resident_mib": before_model_mib, "gradcomp_held_bytes": sum(held),
            "fsdp_groups": groups}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", choices=sorted(METHODS), required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=1, help="windows per rank and step")
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--warmup", type=int, default=20, help="steps of linear learning-rate warmup")
    parser.add_argument("--density", type=float, default=0.05)
    parser.add_argument("--density-warmup", type=int, default=0,
                        help="DGC's density warm-up (gradcomp.torch.Warmup: 25%%, then a quarter per 'epoch' of "
                             "this many steps, down to --density); 0: --density from the first step")
    parser.add_argument("--keep-workspace", action="store_true",
                        help="gradcomp's reduce-scatters keep their workspace between calls (default: given back)")
    parser.add_argument("--settle", choices=["call", "step"], default=None,
                        help="gradcomp's reduce-scatters settle per call or once per backward pass (default: by "
                             "device, per call on the CPU)")
    parser.add_argument("--replicas", type=int, default=1,
                        help="hybrid sharding: replicas of the model, each sharded over world / replicas ranks")
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--val-windows", type=int, default=64)
    parser.add_argument("--corpus-bytes", type=int, default=32 << 20)
    parser.add_argument("--threads", type=int, default=1, help="torch's threads per rank")
    parser.add_argument("--collective-timeout", type=float, default=300.0, help="seconds before gloo gives up")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.collective_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    result = train(args, rank, world)
    every = [None] * world
    dist.all_gather_object(every, {k: result.pop(k) for k in (
        "link_sent_bytes", "link_received_bytes", "peak_resident_mib", "before_model_resident_mib",
        "gradcomp_held_bytes")})
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"method": args.method, "world": world, "args": vars(args), "torch": torch.__version__,
                       "ranks": every, **result}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
