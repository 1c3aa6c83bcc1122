"""docs/results.md, "What it buys at scale": the step-time model of gradcomp.plan, first
checked against what the emulated cluster measured, then asked about GPU clusters.

1. Validation. The link's latency and efficiency are fitted, per rate, to the single
   collectives that experiments/plan_calibrate.py timed on the emulated links. The
   workload is the MLP of experiments/ddp_cluster.py: the step without communication of
   the cluster run's own "none" hook, split into forward, backward and optimizer, and
   backward into its buckets, as plan_calibrate timed them; each method's computation as
   plan_calibrate timed it, every rank at once. The model's step is set against the
   cluster run's median step, and its exchange alone (no computation) against the run's
   "communication alone", per hook.
2. Prediction. The GPU step costs that experiments/gpu_step_cost.py measured on one GPU
   (world 1: each hook's added time, spread over its buckets by size), DDP's buckets of
   ResNet-50 and of the GPT-2-small-shaped transformer (25 MB, the first 1 MB), the
   step's phases and the buckets' ready times as gpu_step_cost.py measured them (where a
   run recorded none: a backward of two thirds of the step making the buckets ready in
   proportion to their floats), and links of 10 µs per message at 90% of their rate.

    python3 -m experiments.plan_report docs/data/plan-2026-11-29-cores/*/ \\
        --step-cost docs/data/step_cost-h100-2026-11-27-device-exchange.json
"""
import argparse
import json
import os
import statistics

from gradcomp import plan

CLUSTER_HOOKS = ("dense", "fp16", "powersgd1-onebucket", "powersgd4-onebucket", "topk_ef", "dgc", "scalecom",
                 "ok_topk")


def fit(rate, rows, world):
    """(latency, efficiency) minimising the squared error of plan.collective_seconds
    against the measured collectives (absolute: the large collectives, which the step
    feels, count most), searched on a grid refined three times. gloo's all-reduce is a
    ring at every size (NCCL's tree would put a 4 KB all-reduce at 8 ranks at a third of
    what gloo takes: 20 ms on the 1 Gbit/s link)."""
    def error(latency, efficiency):
        link = plan.Link(rate, latency, efficiency, tree_all_reduce=False)
        return sum((plan.collective_seconds(link, world, r["collective"], r["bytes"]) - r["seconds"]) ** 2
                   for r in rows)

    lat_range, eff_range = (0.0, 5e-3), (0.02, 1.0)
    for _ in range(4):
        lats = [lat_range[0] + (lat_range[1] - lat_range[0]) * i / 40 for i in range(41)]
        effs = [eff_range[0] + (eff_range[1] - eff_range[0]) * i / 40 for i in range(41)]
        best = min((error(la, ef), la, ef) for la in lats for ef in effs)
        dl, de = (lat_range[1] - lat_range[0]) / 20, (eff_range[1] - eff_range[0]) / 20
        lat_range = (max(0.0, best[1] - dl), best[1] + dl)
        eff_range = (max(0.01, best[2] - de), min(1.0, best[2] + de))
    return best[1], best[2]


def fit_link(rate, rows, world, cores=None):
    """The link with each measured collective's own latency and efficiency (gloo's
    collectives on two cores differ: its all-gather and all-to-all copy more than its
    all-reduce, and it sums float16 slowly), each kind's floor, the least one of its
    collectives took: on ranks that share cores a collective of a few KB takes what each
    of its hops waits for a process to run (a 4 KB all-reduce at 8 ranks on 1 Gbit/s,
    21 ms, longer than one of 256 KB, 18 ms), which the fit, dominated by the large ones,
    misses; and the share of each kind's seconds its transport computes on the rank's
    cores: the processor seconds measured in its collectives over their seconds, as a
    share of the cores a rank has (``cores`` shared by ``world`` ranks; a calibration
    without processor seconds: what the efficiency takes from the rate)."""
    kinds = sorted({r["collective"] for r in rows})
    floors = {k: min(r["seconds"] for r in rows if r["collective"] == k) for k in kinds}
    fitted = {k: fit(rate, [r for r in rows if r["collective"] == k], world) for k in kinds}

    def busy(kind):
        of_kind = [r for r in rows if r["collective"] == kind]
        if any("cpu_seconds" not in r for r in of_kind):
            return 1.0 - fitted[kind][1]
        share = sum(r["cpu_seconds"] for r in of_kind) / sum(r["seconds"] for r in of_kind)
        return min(1.0, share * world / min(world, cores or world))

    return plan.Link(rate, *fit(rate, rows, world), fitted=fitted, tree_all_reduce=False, floors=floors,
                     busy={k: busy(k) for k in kinds})


def cluster_workload(calibration, compute_step, one_bucket=False, hooked=False):
    """The MLP's workload: the measured compute step split as calibrated. ``hooked``:
    gradcomp's costs as what its DDP hooks add to a step on one rank (the GPU
    predictions' kind of cost), not its compressors' own."""
    c = calibration
    total = c["forward"] + c["backward"] + c["optimizer"]
    scale = compute_step / total
    shapes = c["buckets"]
    if one_bucket:
        shapes, ready = [sum(shapes, [])], [c["backward"]]
    else:
        ready = c["ready"]
    buckets = []
    for s, t in zip(shapes, ready):
        matrices = tuple((d[0], plan.math.prod(d) // d[0]) for d in s if len(d) >= 2)
        vectors = sum(plan.math.prod(d) for d in s if len(d) < 2)
        buckets.append(plan.Bucket(sum(plan.math.prod(d) for d in s), min(t, c["backward"]) * scale, matrices,
                                   vectors))
    costs = {}
    for name, v in c["costs"].items():
        if name.endswith("-onebucket") != one_bucket or name.endswith("-hook"):
            continue
        if hooked and f"{name}-hook" in c["costs"]:
            v = c["costs"][f"{name}-hook"]
        costs[name.replace("-onebucket", "")] = plan.Costs(tuple(v["compress"]), v.get("decode_per_entry", 0.0),
                                                           v.get("entry_bytes", 8.0))
    if "topk_ef" in costs:  # Ok-Topk's global top-k compresses as topk_ef, its hook as its own
        costs["sparse_allreduce"] = costs["topk_ef"]
        if hooked and "ok_topk-hook" in c["costs"]:
            v = c["costs"]["ok_topk-hook"]
            costs["sparse_allreduce"] = plan.Costs(tuple(v["compress"]), v["decode_per_entry"], v["entry_bytes"])
    return plan.Workload(c["forward"] * scale, c["backward"] * scale, c["optimizer"] * scale, tuple(buckets), costs)


def validate(runs):
    """Per run directory (experiments/plan_validate.sh: calibration.json and one
    experiments/ddp_cluster.py result per hook), the predicted steps against the measured."""
    lines, worst, worst_hooked = [], 0.0, 0.0
    for directory in runs:
        c = json.load(open(os.path.join(directory, "calibration.json")))
        world, rate_name = c["world"], os.path.basename(directory.rstrip("/")).split("-")[0]
        link = fit_link(plan.parse_rate(rate_name), c["collectives"], world, c.get("cores", world))
        fitted = [(r, plan.collective_seconds(link, world, r["collective"], r["bytes"])) for r in c["collectives"]]
        spread = max(abs(p / r["seconds"] - 1) for r, p in fitted)
        none = json.load(open(os.path.join(directory, "none.json")))
        compute = statistics.median(none["step_seconds"])
        each = ", ".join(f"{k} {lat * 1e6:.0f} µs and {eff:.0%}" for k, (lat, eff) in link.fitted.items())
        floors = ", ".join(f"{k} {t * 1e3:.1f} ms" for k, t in link.floors.items())
        busy = ", ".join(f"{k} {share:.0%}" for k, share in link.busy.items())
        lines += [f"**{rate_name}, {world} ranks.** The link fitted to {len(fitted)} single collectives, each kind "
                  f"apart (latency per message, share of the rate): {each}; each kind's floor (the least one "
                  f"of its collectives took): {floors}; the share of each kind's seconds its transport computes "
                  f"on the rank's cores: {busy}; the worst collective off by {spread:.0%}. Step without "
                  f"communication: {compute:.3f} s (the `none` run's).", "",
                  "| hook | measured step | predicted | error | measured communication alone | predicted | error | "
                  "predicted from the hook on one rank | error |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for hook in CLUSTER_HOOKS:
            path = os.path.join(directory, f"{hook}.json")
            if not os.path.exists(path):
                continue
            run = json.load(open(path))
            one_bucket = hook.endswith("-onebucket")
            method = {"ok_topk": "sparse_allreduce"}.get(hook, hook.replace("-onebucket", ""))
            w = cluster_workload(c, compute, one_bucket)
            density = run["args"]["density"]
            rate = 1.0 if method.startswith("powersgd") else 2.0  # experiments/baselines.py's PowerSGD
            step = plan.predict(w, method, world, link, density, rate).step
            # The probe's own computation (a backward of a trivial loss) with every bucket
            # ready at once: what "communication alone" still holds.
            alone = plan.Workload(0.0, c["probe"], 0.0, tuple(plan.Bucket(b.numel, 0.0, b.matrices, b.vector_floats)
                                                              for b in w.buckets), w.costs)
            comm = plan.predict(alone, method, world, link, density, rate).step
            measured, measured_comm = statistics.median(run["step_seconds"]), run["communication_only_seconds"]
            worst = max(worst, abs(step / measured - 1))
            by_hook = ""
            if f"{hook}-hook" in c["costs"]:  # gradcomp's hooks, timed as on the GPU
                hooked = plan.predict(cluster_workload(c, compute, one_bucket, hooked=True), method, world, link,
                                      density, rate).step
                worst_hooked = max(worst_hooked, abs(hooked / measured - 1))
                by_hook = f" {hooked:.3f} s | {hooked / measured - 1:+.0%} |"
            lines.append(f"| {hook} | {measured:.3f} s | {step:.3f} s | {step / measured - 1:+.0%} | "
                         f"{measured_comm:.3f} s | {comm:.3f} s | {comm / measured_comm - 1:+.0%} |"
                         + (by_hook or " | |"))
        lines.append("")
    lines.append(f"Largest error of a predicted step: {worst:.0%}" + (
        f"; from gradcomp's hooks timed on one rank: {worst_hooked:.0%}." if worst_hooked else "."))
    return "\n".join(lines)


def resnet50_shapes():
    """torchvision's ResNet-50 (1000 classes): its parameters' shapes in registration order."""
    shapes = [(64, 3, 7, 7), (64,), (64,)]
    inplanes = 64
    for planes, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for b in range(blocks):
            shapes += [(planes, inplanes, 1, 1), (planes,), (planes,), (planes, planes, 3, 3), (planes,), (planes,),
                       (planes * 4, planes, 1, 1), (planes * 4,), (planes * 4,)]
            if b == 0:
                shapes += [(planes * 4, inplanes, 1, 1), (planes * 4,), (planes * 4,)]
            inplanes = planes * 4
    return shapes + [(1000, 2048), (1000,)]


def gpt2_shapes(layers=12, width=768, vocab=50257, context=1024):
    """experiments/gpu_step_cost.py's GPT: its parameters' shapes in registration order."""
    block = [(width,), (width,), (width,), (width,), (3 * width, width), (3 * width,), (width, width), (width,),
             (4 * width, width), (4 * width,), (width, 4 * width), (width,)]
    return [(vocab, width), (context, width)] + block * layers + [(width,), (width,)]


def ddp_buckets(shapes, cap=25 * 2**20, first_cap=2**20):
    """DDP's bucket assignment: the parameters in reverse order, a bucket closed once it
    holds its cap of float32 bytes (the first bucket's cap 1 MB)."""
    buckets, current, size = [], [], 0
    for s in reversed(shapes):
        current.append(s)
        size += 4 * plan.math.prod(s)
        if size >= (first_cap if not buckets else cap):
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


def gpu_workload(rows, model, shapes, hbm_bytes_per_second=3.35e12):
    """The model's workload on the GPU: the step without a hook, and each hook's added
    time spread over the buckets by their floats. Where gpu_step_cost.py recorded the
    step's phases, forward, backward, optimizer and the buckets' readiness (under the
    dense hook) are the measured ones, and a hook's added time is what it adds to
    backward and the optimizer (the forward phase, which no hook touches, moves by
    milliseconds between processes); otherwise backward is two thirds of the step and
    makes the buckets ready in proportion to their floats, and a hook adds what its step
    takes over the step without one."""
    by_hook = {r["hook"]: r for r in rows if r["model"] == model}
    step = by_hook["none"]["step_ms"] / 1e3
    groups = ddp_buckets(shapes)
    sizes = [sum(plan.math.prod(s) for s in g) for g in groups]
    total = sum(sizes)
    measured = "backward_ms" in by_hook["none"] and len(by_hook["dense"].get("ready_ms", [])) == len(groups)
    if measured:
        none = by_hook["none"]
        forward, backward, optimizer = none["forward_ms"] / 1e3, none["backward_ms"] / 1e3, none["optimizer_ms"] / 1e3
        ready = [min(t / 1e3, backward) for t in by_hook["dense"]["ready_ms"]]
    else:
        forward, backward, optimizer = step / 3, 2 * step / 3, 0.0
        ready = [backward * sum(sizes[:i + 1]) / total for i in range(len(sizes))]
    buckets = tuple(plan.Bucket(n, t, tuple((s[0], plan.math.prod(s) // s[0]) for s in g if len(s) >= 2),
                                sum(plan.math.prod(s) for s in g if len(s) < 2))
                    for g, n, t in zip(groups, sizes, ready))
    def hooked(r):  # the part of the step a hook's work falls in (s)
        return (r["backward_ms"] + r["optimizer_ms"]) / 1e3 if measured else r["step_ms"] / 1e3

    costs = {}
    for hook, r in by_hook.items():
        if hook != "none":
            added = max(0.0, hooked(r) - hooked(by_hook["none"]))
            # Decoding W messages: their entries read and added at the memory's rate.
            costs[hook] = plan.Costs(tuple(added * n / total for n in sizes), 2 * 8 / hbm_bytes_per_second, 8.0)
    return plan.Workload(forward, backward, optimizer, buckets, costs), measured


def predict_gpu(step_cost):
    data = json.load(open(step_cost))
    density = data["density"]
    lines = [f"GPU costs: {data.get('device', 'GPU')}, torch {data['torch']}, density {density} "
             f"(`{os.path.basename(step_cost)}`); links: 10 µs per message, 90% of the rate.", ""]
    methods = ["fp16", "powersgd4", "topk_ef", "dgc", "sparse_allreduce"]
    for model, shapes in (("resnet50", resnet50_shapes()), ("gpt2", gpt2_shapes())):
        w, measured = gpu_workload(data["rows"], model, shapes)
        phases = "measured" if measured else "backward two thirds of it, buckets ready by their floats"
        lines += [f"**{model}** ({w.numel / 1e6:.1f} M parameters, {len(w.buckets)} buckets; step without "
                  f"communication {1e3 * (w.forward + w.backward + w.optimizer):.1f} ms, {phases}): predicted step "
                  f"in ms and speedup over dense", "",
                  "| link | W | dense | " + " | ".join(methods) + " |", "|---|---:|---:|" + "---:|" * len(methods)]
        for gbit in (10, 25, 100, 400):
            link = plan.Link(gbit * 1e9, 10e-6, 0.9)
            for world in (8, 32, 128):
                dense = plan.predict(w, "dense", world, link).step
                cells = []
                for m in methods:
                    s = plan.predict(w, m, world, link, density, 1.0).step
                    cells.append(f"{s * 1e3:.0f} ({dense / s:.2f}x)")
                lines.append(f"| {gbit} Gbit/s | {world} | {dense * 1e3:.0f} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", help="directories of experiments/plan_validate.sh (RATE-wW)")
    parser.add_argument("--step-cost", default="docs/data/step_cost-h100-2026-11-27-device-exchange.json")
    args = parser.parse_args()
    print(validate(args.runs))
    print()
    print(predict_gpu(args.step_cost))


if __name__ == "__main__":
    main()
