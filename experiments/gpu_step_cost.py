"""What a communication hook costs inside a training step on one GPU (#40, item 4):
DDP over NCCL with a world of one (the exchange runs, the wire is empty), bf16 autocast,
synthetic data, a ResNet-50 and a GPT-2-small-shaped transformer. Per hook, per step:

- the step's time (median of the timed steps; forward, backward with the hook, SGD),
  and what the hook adds over DDP with no hook;
- the GPU time of the work the hook queues on torch's current stream (CUDA events
  around each hook call, summed over the step's buckets), and the host time spent in
  the hook's calls;
- in one step traced by torch.profiler: the host synchronizations, the CUDA runtime calls
  that wait for the device (cudaStreamSynchronize, cudaEventSynchronize,
  cudaDeviceSynchronize, blocking cudaMemcpy) on every thread, less the step's own
  closing one, and where each ran (its thread and the ops around it); the GPU time of
  all the step's kernels, whichever thread launched them, and of gradcomp's among them
  (the kernels whose names carry gradcomp's types: its own and the CUB kernels it
  instantiates).

The hook's own GPU time by CUDA events covers only what the hook queues on torch's
current stream during its call: torch's hooks, not gradcomp's, which queue their work
from a thread of their own.

    python3 -m experiments.gpu_step_cost [--models resnet50,gpt2] [--out step_cost.json]

On a machine with no GPU, `--device cpu --small` runs the same code over gloo with tiny
models (a check that the script works, not a measurement).
"""
import argparse
import contextlib
import json
import math
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from experiments.baselines import torch_hook

HOOKS = ["none", "dense", "fp16", "powersgd4", "topk_ef", "topk_ef_m8", "dgc", "scalecom", "sparse_allreduce"]
SYNC_CALLS = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaMemcpy")


class Block(nn.Module):
    """One pre-norm GPT-2 block: causal self-attention and a 4x GELU MLP."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        if hasattr(F, "scaled_dot_product_attention"):
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch 1.13
            s = (q @ k.transpose(-1, -2)) / math.sqrt(w // self.heads)
            s = s.masked_fill(torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
            a = s.softmax(-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, w))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class GPT(nn.Module):
    """GPT-2 small's shape (12 layers, width 768, 12 heads, 50,257 tokens, tied head)."""

    def __init__(self, layers=12, width=768, heads=12, vocab=50257, context=1024):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)

    def forward(self, idx):
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.tokens.weight.t()


def workload(name, small, device):
    """(model, inputs, loss of outputs) of a model by name, on synthetic data."""
    g = torch.Generator(device="cpu").manual_seed(0)
    if name == "resnet50":
        import torchvision
        model = torchvision.models.resnet50(num_classes=1000)
        batch, side = (4, 64) if small else (64, 224)
        x = torch.randn(batch, 3, side, side, generator=g).to(device)
        y = torch.randint(0, 1000, (batch,), generator=g).to(device)
        return model, x, lambda out: F.cross_entropy(out.float(), y)
    if name == "gpt2":
        model = GPT(layers=2, width=64, heads=4, vocab=1000, context=64) if small else GPT()
        batch, length, vocab = (2, 64, 1000) if small else (8, 1024, 50257)
        x = torch.randint(0, vocab, (batch, length), generator=g).to(device)
        y = torch.randint(0, vocab, (batch, length), generator=g).to(device)
        return model, x, lambda out: F.cross_entropy(out.float().view(-1, vocab), y.view(-1))
    raise ValueError(f"unknown model {name!r} (resnet50 or gpt2)")


def registered(ddp, hook_name, density):
    """Registers hook_name on ddp; returns the gradcomp State, if any."""
    if hook_name == "none":
        return None
    if hook_name in ("dense", "fp16", "powersgd4"):
        state, hook = torch_hook(hook_name, start_iter=2)
        ddp.register_comm_hook(state, hook)
        return None
    import gradcomp.torch.ddp as gddp
    sparse = hook_name == "sparse_allreduce"
    method, aggregation = ("topk_ef", "sparse_allreduce") if sparse else (hook_name, "allgather")
    options = {}
    if hook_name == "topk_ef_m8":  # the residual in 8 bits (its step's float32 arrays are scratch)
        method, options = "topk_ef", {"memory_bits": 8}
    state = gddp.State(method=method, density=density, start_iter=0, aggregation=aggregation, **options)
    ddp.register_comm_hook(state, gddp.hook)
    return state


class HookTimes:
    """Wraps a DDP comm hook: per call, the host time and the GPU time of what the call
    queued on the current stream (events before and after it)."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self.calls = []
        self.marks = {}  # the step's phases: name -> event (or host time without a GPU)

    def mark(self, name):
        """Records when the stream reaches this point of the step."""
        if self.cuda:
            self.marks[name] = torch.cuda.Event(enable_timing=True)
            self.marks[name].record()
        else:
            self.marks[name] = time.perf_counter()

    def _ms(self, a, b):
        return a.elapsed_time(b) if self.cuda else 1e3 * (b - a)

    def wrap(self, hook):
        def timed(state, bucket):
            if self.cuda:
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
            else:
                begin, end = time.perf_counter(), None
            start = time.perf_counter()
            with torch.profiler.record_function("comm_hook"):
                future = hook(state, bucket)
            host = time.perf_counter() - start
            if self.cuda:
                end.record()
            self.calls.append((host, (begin, end)))
            return future
        return timed

    def take(self):
        """(calls, host seconds, GPU milliseconds, the step's phases) since the last take;
        synchronizes. The phases (ms): forward, backward, optimizer, and when each bucket
        reached its hook, from the start of backward (what gradcomp.plan takes)."""
        if self.cuda:
            torch.cuda.synchronize()
        calls, self.calls = self.calls, []
        gpu = sum(b.elapsed_time(e) for _, (b, e) in calls) if self.cuda else 0.0
        m = self.marks
        phases = {"forward_ms": self._ms(m["start"], m["backward"]),
                  "backward_ms": self._ms(m["backward"], m["optimizer"]),
                  "optimizer_ms": self._ms(m["optimizer"], m["end"]),
                  "ready_ms": [self._ms(m["backward"], b) for _, (b, _) in calls]} if len(m) == 4 else {}
        return len(calls), sum(h for h, _ in calls), gpu, phases


def run(model_name, hook_name, args, device):
    torch.manual_seed(0)
    module, x, loss_of = workload(model_name, args.small, device)
    module = module.to(device)
    parameters = sum(p.numel() for p in module.parameters())
    ddp = nn.parallel.DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None)
    times = HookTimes(device)
    if hook_name != "none":
        original = ddp.register_comm_hook
        ddp.register_comm_hook = lambda state, hook: original(state, times.wrap(hook))
    registered(ddp, hook_name, args.density)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-4)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16)

    def step():
        times.mark("start")
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            out = ddp(x)
        loss = loss_of(out)
        times.mark("backward")
        loss.backward()
        times.mark("optimizer")
        optimizer.step()
        times.mark("end")
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    times.take()
    wall, hook_host, hook_gpu, buckets, phases = [], [], [], 0, []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        wall.append(time.perf_counter() - start)
        buckets, host, gpu, phase = times.take()
        hook_host.append(host)
        hook_gpu.append(gpu)
        phases.append(phase)
    median = {k: statistics.median(p[k] for p in phases) for k in ("forward_ms", "backward_ms", "optimizer_ms")}
    median["ready_ms"] = [statistics.median(p["ready_ms"][i] for p in phases) for i in range(buckets)]
    syncs, sites, kernels, ours = profiled(step, device)
    return {"model": model_name, "hook": hook_name, "step_ms": 1e3 * statistics.median(wall),
            "hook_host_ms": 1e3 * statistics.median(hook_host), "hook_gpu_ms": statistics.median(hook_gpu),
            "buckets": buckets, "host_syncs": syncs, "sync_sites": sites, "kernel_ms": kernels,
            "gradcomp_kernel_ms": ours, "parameters": parameters, **median}


def profiled(step, device):
    """One step under torch.profiler: the CUDA runtime calls in it that wait for the
    device, by name, less the step's own closing torch.cuda.synchronize(), and by where
    they ran (sync_sites); the GPU time of every kernel the step ran, whichever thread or
    stream launched it, and of gradcomp's (ms)."""
    if device.type != "cuda":
        return {}, {}, 0.0, 0.0
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
    counts, kernels, ours = {}, 0.0, 0.0
    events = prof.events()
    for event in events:
        if event.name in SYNC_CALLS:
            counts[event.name] = counts.get(event.name, 0) + 1
        if event.device_type == torch.autograd.DeviceType.CUDA:
            time_us = getattr(event, "device_time", None) or getattr(event, "cuda_time", 0.0)
            kernels += time_us
            # gradcomp's kernels, CUB's among them: their names carry gradcomp's types
            ours += time_us if "gradcomp" in event.name else 0.0
    if counts.get("cudaDeviceSynchronize"):
        counts["cudaDeviceSynchronize"] -= 1  # the step's own
    sites = sync_sites([(e.name, e.thread, e.time_range.start, e.time_range.end) for e in events
                        if e.device_type == torch.autograd.DeviceType.CPU or e.name in SYNC_CALLS], SYNC_CALLS)
    return {k: v for k, v in counts.items() if v}, sites, kernels / 1e3, ours / 1e3


def sync_sites(events, targets):
    """Where the calls named in ``targets`` ran: for each, its thread and the chain of ops
    that enclose it on that thread (outermost first), counted by "thread N: op > op > call".
    ``events``: (name, thread, start, end) of the profiled host events. A call on a thread
    with no enclosing op is named by its thread alone (a gradcomp hook's worker thread
    records none: torch's profiler follows only the threads it was started on and
    autograd's)."""
    by_thread = {}
    for name, thread, start, end in events:
        by_thread.setdefault(thread, []).append((start, -end, name))
    sites = {}
    for thread, spans in by_thread.items():
        spans.sort()
        for start, negative_end, name in spans:
            if name not in targets:
                continue
            chain = [n for s, e, n in spans if s <= start and -e >= -negative_end and n not in targets]
            site = f"thread {thread}: " + " > ".join(chain + [name])
            sites[site] = sites.get(site, 0) + 1
    return sites


@contextlib.contextmanager
def world_of_one(device):
    """A process group of one rank for the run: NCCL on a GPU, gloo on the CPU."""
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", init_method=f"file://{tmp}/store",
                                rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def print_sync_sites(row):
    """Where a row's host synchronizations ran, a line each."""
    for site, count in sorted(row["sync_sites"].items()):
        print(f"    {count} x {site}", flush=True)


def save(args, rows, device):
    """The rows as JSON at args.out, with torch's version, the density, the steps and the device."""
    info = {"torch": torch.__version__, "density": args.density, "steps": args.steps, "rows": rows}
    if device.type == "cuda":
        info["device"] = torch.cuda.get_device_properties(device).name
    with open(args.out, "w") as f:
        json.dump(info, f, indent=1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="resnet50,gpt2")
    parser.add_argument("--hooks", default=",".join(HOOKS))
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny models: a check of the script, not a measurement")
    parser.add_argument("--out", default="step_cost.json")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
        torch.backends.cudnn.benchmark = True
    rows = []
    with world_of_one(device):
        for model_name in args.models.split(","):
            base = None
            for hook_name in args.hooks.split(","):
                row = run(model_name, hook_name, args, device)
                if device.type == "cuda":
                    torch.cuda.empty_cache()  # the run's model and DDP are gone
                base = row["step_ms"] if hook_name == "none" else base
                row["added"] = None if base is None else row["step_ms"] / base - 1
                rows.append(row)
                added = "" if row["added"] is None else f" ({100 * row['added']:+.1f}% over no hook)"
                print(f"{model_name} {hook_name}: step {row['step_ms']:.2f} ms{added}, hook GPU "
                      f"{row['hook_gpu_ms']:.3f} ms and host {row['hook_host_ms']:.2f} ms over "
                      f"{row['buckets']} buckets, kernels {row['kernel_ms']:.2f} ms (gradcomp's "
                      f"{row['gradcomp_kernel_ms']:.3f} ms), host syncs {row['host_syncs']}", flush=True)
                print_sync_sites(row)
    save(args, rows, device)

if __name__ == "__main__":
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    main()
