#!/usr/bin/env python3
"""Where a GPU step's time goes: reads the Nsight Compute log that scripts/gpu_check.sh
writes (ncu --csv --metrics gpu__time_duration.sum over bench_cuda, one
"### NAME/N/INVERSE_DENSITY" section per benchmark; "### NAME/N" in older logs: density
0.001) and prints, per section, each kernel's time per step (kernels named without their
template arguments, summed over their launches), the number of launches per step, and
the kernels' total. The steps of a section are the benchmark's iterations plus its
warm-up (bench/cuda_select.cu's timed()); the kernels that set a benchmark up once are
left out (the gradient's fill, thrust's fill of the message buffer). Usage:
kernel_profile.py ncu_profile.csv [bench_cuda.json] > table.md
With bench_cuda.json (the same run's timings) each section also shows the step's event
time and how much of it the kernels' sum does not cover: launch gaps, host reads, and the
write-back of what the kernels wrote (Nsight Compute flushes the caches between kernels,
so a kernel's writes are not charged to it there, and a kernel it times reads from DRAM)."""
import csv
import json
import re
import sys
from collections import defaultdict

SETUP = {"fill_gradient", "static_kernel"}  # once per benchmark: the gradient, thrust's fill of `out`


def short(name):
    """'void gradcomp::detail::cuda_radix::split<...>(...)' -> 'split'"""
    name = re.sub(r"\(.*", "", name)
    depth, out = 0, ""
    for ch in name:  # drop every <...>, nested ones too
        depth += ch == "<"
        if depth == 0:
            out += ch
        depth -= ch == ">"
    return out.split("::")[-1].replace("void ", "").strip()


def sections(path):
    """{section: (iterations, [(kernel, ns), ...])} in the log's order."""
    found, current, header = {}, None, None
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("### "):
                current = line[4:].strip()
                found[current] = [0, []]
                continue
            if current is None:
                continue
            if line.startswith('"ID"'):
                header = next(csv.reader([line]))
                continue
            m = re.match(r"^\S+/manual_time\s+\S+ \w+\s+\S+ \w+\s+(\d+)", line)
            if m:
                found[current][0] = int(m.group(1))
                continue
            if header and line.startswith('"'):
                row = dict(zip(header, next(csv.reader([line]))))
                if row.get("Metric Name") == "gpu__time_duration.sum":
                    scale = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6}.get(row.get("Metric Unit"), 1.0)
                    value = float(row["Metric Value"].replace(",", "")) * scale
                    found[current][1].append((short(row["Kernel Name"]), value))
    return found


def main():
    found = sections(sys.argv[1])
    timings = {}
    if len(sys.argv) > 2:
        with open(sys.argv[2]) as f:
            for b in json.load(f)["benchmarks"]:
                scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0}[b["time_unit"]]
                timings[b["name"].replace("/manual_time", "")] = b["real_time"] * scale
    for section, (iterations, kernels) in found.items():
        steps = iterations + 1
        per_kernel, launches = defaultdict(float), defaultdict(int)
        for name, ns in kernels:
            if name in SETUP:
                continue
            per_kernel[name] += ns / steps
            launches[name] += 1
        total = sum(per_kernel.values()) / 1e6
        count = sum(launches.values()) / steps
        name = section if section.count("/") >= 2 else section + "/1000"
        event = timings.get(name)
        title, inverse_density = name.rsplit("/", 1)
        print(f"### {title} (density {1 / int(inverse_density):g}): kernels {total:.4f} ms per step, "
              f"{count:.0f} launches"
              + (f"; the step's event time {event:.4f} ms ({event - total:+.4f} ms beside the kernels)"
                 if event else ""))
        print("| kernel | ms per step | launches per step |\n|---|---|---|")
        for name, ns in sorted(per_kernel.items(), key=lambda kv: -kv[1]):
            print(f"| {name} | {ns / 1e6:.4f} | {launches[name] / steps:g} |")
        print()


if __name__ == "__main__":
    main()
