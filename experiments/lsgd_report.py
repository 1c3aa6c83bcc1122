"""The tables and plot of experiments/lsgd_cluster.py's runs (docs/results.md, "Leader SGD
against averaging and elastic averaging"): per rank count, each method's final test
accuracy (the mean over ranks, and the best rank's), training time, bytes per worker on
the link, and the time and bytes to reach dense all-reduce's final accuracy minus 1 point.

    python3 -m experiments.lsgd_report build/lsgd [--plot docs/lsgd_accuracy.png]
"""
import argparse
import glob
import json
import os

from experiments.lsgd_cluster import METHODS


def mean(values):
    return sum(values) / len(values)


def order(run):
    """Runs in METHODS' order, the variants of a method after it."""
    return METHODS.index(run["method"]), run.get("label", run["method"])


def rows_of(runs):
    """Per method: (final mean accuracy, best rank's, EASGD center's, seconds, MB sent per
    rank, library MB per rank, seconds and MB to target)."""
    dense = runs.get("dense")
    target = mean(dense["curve"][-1]["accuracy"]) - 0.01 if dense else None
    rows = []
    for label, run in sorted(runs.items(), key=lambda kv: order(kv[1])):
        last = run["curve"][-1]
        reached = next((p for p in run["curve"] if target is not None and mean(p["accuracy"]) >= target), None)
        rows.append({"method": label, "accuracy": mean(last["accuracy"]), "best": max(last["accuracy"]),
                     "center": last["center_accuracy"], "seconds": last["seconds"],
                     "sent_mb": mean(last["sent"]) / 1e6, "received_mb": mean(last["received"]) / 1e6,
                     "library_mb": None if run["method"] == "dense" else mean(run["library_bytes_sent"]) / 1e6,
                     "to_target_s": reached["seconds"] if reached else None,
                     "to_target_mb": mean(reached["sent"]) / 1e6 if reached else None})
    return target, rows


def table(world, runs):
    target, rows = rows_of(runs)
    lines = [f"### {world} ranks", ""]
    if target is not None:
        lines += [f"Target: {100 * target:.2f}% (dense all-reduce's final mean accuracy minus 1 point).", ""]
    lines += ["| method | final accuracy (mean of ranks) | best rank | training time | MB sent per rank "
              "(link) | MB received per rank (link) | library's count, MB per rank | time to target | "
              "MB sent to target |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        center = f" (center {100 * r['center']:.2f}%)" if r["center"] is not None else ""
        reached = (f"{r['to_target_s']:.1f} s", f"{r['to_target_mb']:.2f}") if r["to_target_s"] is not None \
            else ("not reached", "-")
        lines.append(f"| {r['method']} | {100 * r['accuracy']:.2f}%{center} | {100 * r['best']:.2f}% | "
                     f"{r['seconds']:.1f} s | {r['sent_mb']:.2f} | {r['received_mb']:.2f} | "
                     f"{'-' if r['library_mb'] is None else format(r['library_mb'], '.2f')} | {reached[0]} | "
                     f"{reached[1]} |")
    return "\n".join(lines) + "\n"


def plot(by_world, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    worlds = sorted(by_world)
    fig, axes = plt.subplots(len(worlds), 2, figsize=(11, 4 * len(worlds)), squeeze=False)
    for row, world in enumerate(worlds):
        for method, run in sorted(by_world[world].items(), key=lambda kv: order(kv[1])):
            acc = [100 * mean(p["accuracy"]) for p in run["curve"]]
            axes[row][0].plot([p["seconds"] for p in run["curve"]], acc, marker=".", label=method)
            axes[row][1].plot([mean(p["sent"]) / 1e6 for p in run["curve"]], acc, marker=".", label=method)
        axes[row][0].set(xlabel="training time (s)", ylabel="test accuracy, mean of ranks (%)",
                         title=f"{world} ranks, 1 Gbit/s")
        axes[row][1].set(xlabel="MB sent per rank (link)", xscale="log", title=f"{world} ranks: accuracy per byte")
        axes[row][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("--plot", default=None)
    args = parser.parse_args()
    by_world = {}
    for path in sorted(glob.glob(os.path.join(args.folder, "*.json"))):
        with open(path) as f:
            run = json.load(f)
        if run.get("method") in METHODS:
            by_world.setdefault(run["world"], {})[run.get("label", run["method"])] = run
    for world in sorted(by_world):
        print(table(world, by_world[world]))
    if args.plot:
        plot(by_world, args.plot)


if __name__ == "__main__":
    main()
