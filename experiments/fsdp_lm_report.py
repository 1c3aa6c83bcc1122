"""The table and the plot of docs/results.md "FSDP2: a transformer on a slow link" from
experiments/fsdp_lm.py's JSON files (RATE-METHOD.json, written by
experiments/fsdp_lm_cluster.sh).

    python3 -m experiments.fsdp_lm_report DIR [--plot loss.png]

The target loss is dense's final validation loss plus 1%; a method's time to it is the
training time at which its validation loss first reaches it, interpolated linearly
between the two evaluations around the crossing.
"""
import argparse
import glob
import json
import os
import statistics

ORDER = ["dense", "int4", "topk_ef", "topk_ef_m8", "topk_ef_m4"]
NAMES = {"dense": "FSDP dense reduce-scatter (float32)", "topk_ef": "gradcomp topk_ef, float32 memory",
         "topk_ef_m8": "gradcomp topk_ef, 8-bit memory", "topk_ef_m4": "gradcomp topk_ef, 4-bit memory",
         "int4": "ZeRO++-style int4 blocks (no error feedback)"}
SKIP = 3  # the first steps (allocations, the compressors' first dense-sized exchange) are not typical


def time_to(curve, target):
    """Training seconds at which the loss first reaches target, or None."""
    previous = None
    for _, seconds, loss in curve:
        if loss <= target:
            if previous is None or previous[1] == loss:
                return seconds
            t0, l0 = previous
            return t0 + (seconds - t0) * (l0 - target) / (l0 - loss)
        previous = (seconds, loss)
    return None


def bits_per_second(rate):
    """A rate as tc writes it (1gbit, 200mbit) in bits per second."""
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6)):
        if rate.endswith(unit):
            return float(rate[:-len(unit)]) * scale
    raise ValueError(f"fsdp_lm_report: a rate like 1gbit or 200mbit, got {rate!r}")


def load(directory):
    runs = {}
    for path in glob.glob(os.path.join(directory, "*.json")):
        with open(path) as f:
            run = json.load(f)
        rate = os.path.basename(path).split("-")[0]
        runs.setdefault(rate, {})[run["method"]] = run
    return runs


def rows(runs):
    """One dict per method of one rate, dense first."""
    dense = runs["dense"]
    target = dense["curve"][-1][2] * 1.01
    dense_time = time_to(dense["curve"], target)
    out = []
    for method in [m for m in ORDER if m in runs]:
        run = runs[method]
        ranks = run["ranks"]
        per_rank_sent = [statistics.mean(r["link_sent_bytes"][SKIP:]) for r in ranks]
        reached = time_to(run["curve"], target)
        out.append({
            "method": method, "steps": len(run["step_seconds"]),
            "step_s": statistics.median(run["step_seconds"][SKIP:]),
            "sent_mb": statistics.mean(per_rank_sent) / 1e6,
            "peak_mib": max(r["peak_resident_mib"] for r in ranks),
            "training_mib": max(r["peak_resident_mib"] - r["before_model_resident_mib"] for r in ranks),
            "held_mib": max(r["gradcomp_held_bytes"] for r in ranks) / 2**20,
            "final_loss": run["curve"][-1][2], "dense_steps": dense["curve"][-1][0],
            "loss_at_dense_end": next((c[2] for c in run["curve"] if c[0] == dense["curve"][-1][0]), None),
            "target": target, "reached_s": reached,
            "speedup": dense_time / reached if reached and dense_time else None})
    return out


def table(rate, rs, run):
    a = run["args"]
    lines = [f"{rate}: {run['world']} ranks, {run['parameters']:,} parameters, batch {a['batch']} x {a['context']} "
             f"tokens per rank, density {a['density']}, target loss {rs[0]['target']:.4f} (dense's final + 1%)",
             "| reduce-scatter | steps | median step s | sent per rank per step (link) | peak RSS per rank | "
             f"RSS over the pre-model process | gradcomp holds | loss at step {rs[0]['dense_steps']} | final loss | "
             "time to target | vs dense |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rs:
        reached = f"{r['reached_s']:.0f} s" if r["reached_s"] is not None else "not reached"
        speedup = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
        lines.append(f"| {NAMES[r['method']]} | {r['steps']} | {r['step_s']:.3f} | {r['sent_mb']:.2f} MB | "
                     f"{r['peak_mib']:.0f} MiB | {r['training_mib']:.0f} MiB | {r['held_mib']:.1f} MiB | "
                     f"{r['loss_at_dense_end']:.4f} | {r['final_loss']:.4f} | {reached} | {speedup} |")
    return "\n".join(lines)


def plot(all_runs, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rates = sorted(all_runs, key=bits_per_second)
    fig, axes = plt.subplots(1, len(rates), figsize=(6 * len(rates), 4), squeeze=False)
    for ax, rate in zip(axes[0], rates):
        for method in [m for m in ORDER if m in all_runs[rate]]:
            curve = all_runs[rate][method]["curve"]
            ax.plot([c[1] for c in curve], [c[2] for c in curve], label=NAMES[method])
        ax.axhline(all_runs[rate]["dense"]["curve"][-1][2] * 1.01, color="gray", linestyle=":", label="target")
        ax.set_title(f"4 ranks, {rate} links")
        ax.set_xlabel("training time (s)")
        ax.set_ylabel("validation loss (nats per byte)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory")
    parser.add_argument("--plot", default=None)
    args = parser.parse_args()
    all_runs = load(args.directory)
    for rate, runs in sorted(all_runs.items(), key=lambda item: bits_per_second(item[0])):
        print(table(rate, rows(runs), runs["dense"]))
        print()
    if args.plot:
        plot(all_runs, args.plot)


if __name__ == "__main__":
    main()
