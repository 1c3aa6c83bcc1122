#!/usr/bin/env python3
"""Turns Google Benchmark JSON from bench_select / bench_pipeline into a Markdown table
(time, ratio to the streaming read of the same N, speed-up over nth_element) and a PNG
plot of the ratios. Usage: report.py OUT.png select.json [pipeline.json ...] > table.md"""
import json
import sys
from collections import defaultdict


def parse(name):
    """'exact_topk/N:25000000/d_1e4:10/min_time:0.300/real_time' -> family, {N, d_1e4}"""
    parts = name.split("/")
    args = {}
    for p in parts[1:]:
        if ":" in p:
            key, value = p.split(":", 1)
            if key in ("N", "d_1e4"):
                args[key] = int(value)
        elif p.isdigit() and "N" not in args:
            args["N"] = int(p)
    return parts[0], args


def load(paths):
    rows, context = [], None
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        context = context or data["context"]
        for b in data["benchmarks"]:
            if b.get("run_type") == "aggregate" or b.get("error_occurred"):
                continue
            family, args = parse(b["name"])
            scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b["time_unit"]]
            b["_file"] = path  # ratios compare with the read measured in the same run
            rows.append((family, args.get("N"), args.get("d_1e4"), b["real_time"] * scale, b))
    return rows, context


def main():
    png, paths = sys.argv[1], sys.argv[2:]
    rows, context = load(paths)
    read = {(b["_file"], n): t for family, n, d, t, b in rows if family == "read"}
    nth = {(n, d): t for family, n, d, t, _ in rows if family == "nth_element"}
    print(f"Machine: {context.get('host_name', '?')}, {context.get('num_cpus')} CPUs at "
          f"{context.get('mhz_per_cpu')} MHz; run {context.get('date', '?')}\n")
    print("| benchmark | N | density | time (ms) | x read | speed-up vs nth_element |")
    print("|---|---:|---:|---:|---:|---:|")
    series = defaultdict(list)
    backends = {}
    for family, n, d, t, b in rows:
        if family in ("host", "kokkos"):  # bench_kokkos: the label names the selector
            backends.setdefault(b.get("label", str(n)), {})[family] = t
            continue
        if family == "read":
            print(f"| read (bound) | {n} | | {t:.2f} | 1.00 | |")
            continue
        x_read = t / read[(b["_file"], n)] if (b["_file"], n) in read else float("nan")
        speedup = nth[(n, d)] / t if (n, d) in nth else float("nan")
        density = f"{d * 1e-4:g}" if d is not None else ""
        extra = ""
        if "bytes_per_second" in b and n is None:
            extra = f" ({b['bytes_per_second'] / 1e9:.2f} GB/s)"
        print(f"| {family}{extra} | {n or ''} | {density} | {t:.3f} | {x_read:.2f} | {speedup:.2f} |")
        if n is not None and d is not None:
            series[(family, d)].append((n, x_read))
    if backends:
        print("\n| selector (N = 2.5e7, density 0.001) | host, 1 thread (ms) | Kokkos<Serial> (ms) | Kokkos / host |")
        print("|---|---:|---:|---:|")
        for label, times in backends.items():
            if "host" in times and "kokkos" in times:
                ratio = times['kokkos'] / times['host']
                print(f"| {label} | {times['host']:.2f} | {times['kokkos']:.2f} | {ratio:.2f} |")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("\n(matplotlib missing: no plot)", file=sys.stderr)
        return
    densities = sorted({d for _, d in series})
    fig, axes = plt.subplots(1, len(densities), figsize=(6 * len(densities), 4.5), squeeze=False)
    for ax, d in zip(axes[0], densities):
        for (family, dd), points in sorted(series.items()):
            if dd != d:
                continue
            points.sort()
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=family)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xlabel("N (float32 elements)")
        ax.set_ylabel("time / streaming read of N floats")
        ax.set_title(f"density {d * 1e-4:g}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"gradcomp selection throughput ({context.get('num_cpus')} CPUs, {context.get('date', '')[:10]})")
    fig.tight_layout()
    fig.savefig(png, dpi=110)


if __name__ == "__main__":
    main()
