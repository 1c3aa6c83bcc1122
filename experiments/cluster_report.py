"""The tables and the plot of docs/results.md's "Time, not bytes", from the JSON files
experiments/ddp_cluster.py wrote (experiments/ddp_cluster_hooks.sh):

    python3 -m experiments.cluster_report build/cluster_results [--plot docs/cluster_accuracy.png]

Per link rate and hook: the median step; the step against the same step without any
communication ("none"); the fraction of communication hidden behind backward,
(compute + communication - step) / communication, with compute the median step of
"none" and communication the median step of the hook's communication-only phase;
bytes sent per worker per step; the training time to reach the target accuracy (dense
all-reduce's final accuracy minus 1 point, at the first evaluation that reaches it); the
final accuracy. Refuses runs that did not start from the same parameters or see the same
data order (their digests differ), and names the torch of any run whose torch is not
dense all-reduce's (torch's PowerSGD runs under torch 2.x: experiments/ddp_cluster_hooks.sh).
"""
import argparse
import glob
import json
import os
import statistics

ORDER = ["dense", "fp16"] + [f"powersgd{r}{how}" for r in (1, 4) for how in ("", "-torch2", "-onebucket")] + [
    "topk_ef", "dgc", "scalecom", "ok_topk"]


def load(folder):
    runs = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        rate, hook = os.path.basename(path)[:-len(".json")].split("-", 1)
        with open(path) as f:
            runs.setdefault(rate, {})[hook] = json.load(f)
    return runs


def rate_bits(rate):
    """A rate as tc writes it ("1gbit", "500mbit") in bit/s, to order the tables."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return float(rate[:-len(unit)]) * scale
    return float("inf")


def time_to(curve, target):
    for _, seconds, accuracy in curve:
        if accuracy is not None and accuracy >= target:
            return seconds
    return None


def table(rate, runs, failures, only_run=False):
    compute = statistics.median(runs["none"]["step_seconds"]) if "none" in runs else None
    dense = runs.get("dense")
    target = dense["curve"][-1][2] - 0.01 if dense else None
    dense_time = time_to(dense["curve"], target) if dense else None
    lines = [f"### {rate}", "",
             f"Step without communication: {compute:.3f} s (median). Target accuracy: {100 * target:.2f}% "
             "(dense all-reduce's final accuracy minus 1 point)." if compute and target else "", "",
             "| hook | median step | step / no-comm step | communication alone | hidden behind backward "
             "| bytes per worker per step | time to target | vs dense | final accuracy |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for hook in ORDER:
        if hook not in runs:
            if only_run and f"{rate} {hook}" not in failures:
                continue
            why = failures.get(f"{rate} {hook}", "not run")
            lines.append(f"| {hook} | {why} | | | | | | | |")
            continue
        r = runs[hook]
        label = hook if r["torch"] == (dense or r)["torch"] else f"{hook} (torch {r['torch'].split('+')[0]})"
        step = statistics.median(r["step_seconds"])
        comm = r["communication_only_seconds"]
        hidden = max(0.0, min(1.0, (compute + comm - step) / comm)) if compute and comm else None
        reached = time_to(r["curve"], target) if target else None
        reached_text = "not reached" if reached is None else f"{reached:.0f} s"
        speedup = f"{dense_time / reached:.2f}x" if reached and dense_time else "-"
        lines.append(
            f"| {label} | {step:.3f} s | {step / compute:.2f}x | {comm:.3f} s | "
            f"{'-' if hidden is None else f'{100 * hidden:.0f}%'} | {statistics.mean(r['step_bytes']):,.0f} | "
            f"{reached_text} | {speedup} | {100 * r['curve'][-1][2]:.2f}% |")
    return "\n".join(lines) + "\n"


def plot(runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rates = sorted(runs, key=rate_bits)
    fig, axes = plt.subplots(1, len(rates), figsize=(6 * len(rates), 4.2), squeeze=False)
    for ax, rate in zip(axes[0], rates):
        for hook in ORDER:
            if hook in runs[rate]:
                curve = runs[rate][hook]["curve"]
                ax.plot([c[1] for c in curve], [100 * c[2] for c in curve], marker=".", label=hook)
        ax.set_title(f"4 DDP ranks, {rate} links")
        ax.set_xlabel("training time (s)")
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def check_same_start(runs):
    """Every hook's run must start from the same parameters and see the same data."""
    for key in ("init_digest", "order_digest"):
        seen = {f"{rate} {hook}": r[key] for rate in runs for hook, r in runs[rate].items()}
        if len(set(seen.values())) != 1:
            raise SystemExit(f"cluster_report: runs differ in {key}: {seen}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder")
    parser.add_argument("--plot", default=None)
    parser.add_argument("--only-run", action="store_true", help="rows only for the hooks that ran or failed")
    args = parser.parse_args()
    runs = load(args.folder)
    failures = {}
    failed = os.path.join(args.folder, "failures.txt")
    if os.path.exists(failed):
        for line in open(failed):
            key, _, why = line.partition(":")
            failures[key.strip()] = why.strip()
    check_same_start(runs)
    first = next(iter(next(iter(runs.values())).values()))
    torches = sorted({r["torch"] for rate in runs.values() for r in rate.values()})
    print(f"{first['world']} ranks, {first['parameters']:,} parameters, batch {first['args']['batch']} per rank, "
          f"{first['args']['steps']} steps, density {first['args']['density']}; every run from the same "
          f"parameters (digest {first['init_digest']}) and data order (digest {first['order_digest']}); "
          f"torch {', '.join(torches)}\n")
    for rate in sorted(runs, key=rate_bits):
        print(table(rate, runs[rate], failures, args.only_run))
    if args.plot:
        plot(runs, args.plot)


if __name__ == "__main__":
    main()
