"""GPU baseline for docs/benchmarks.md: torch.topk(|g|) against gradcomp's exact_topk
compressor (through gradcomp.torch, so both pay Python's call overhead) and a
streaming read (torch.sum), timed with CUDA events in one run, median of repeats.

    python3 -m experiments.torch_gpu [--sizes 1e7,1e8,1e9] [--out gpu_torch.json]
"""
import argparse
import json
import statistics

import torch

from gradcomp.torch import Compressor


def timed(fn, repeats):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1e7,1e8,1e9")
    parser.add_argument("--densities", default="0.001,0.01")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default="gpu_torch.json")
    args = parser.parse_args()
    rows = []
    for n in (int(float(s)) for s in args.sizes.split(",")):
        g = torch.randn(n, device="cuda") * torch.exp(1.5 * torch.randn(n, device="cuda")) * 1e-3
        read = timed(lambda g=g: g.sum(), args.repeats)
        for d in (float(x) for x in args.densities.split(",")):
            k = max(1, int(-(-d * n // 1)))
            topk = timed(lambda g=g, k=k: torch.topk(g.abs(), k, sorted=False), args.repeats)
            c = Compressor(n, "compose", selector="exact_topk", corrector="none", index="raw32", value="f32",
                           density=d, device="cuda")
            ours = timed(lambda c=c, g=g: c.compress(g), args.repeats)
            rows.append({"n": n, "density": d, "read_ms": read, "torch_topk_ms": topk, "gradcomp_ms": ours})
            print(f"N={n:.0e} d={d}: read {read:.3f} ms, torch.topk {topk:.3f} ms, gradcomp exact_topk {ours:.3f} ms "
                  f"({topk / ours:.1f}x faster than torch.topk, {ours / read:.1f}x the read)", flush=True)
            del c
        del g
        torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(0)
    with open(args.out, "w") as f:
        json.dump({"device": props.name, "torch": torch.__version__, "cuda": torch.version.cuda, "rows": rows}, f,
                  indent=1)


if __name__ == "__main__":
    main()
