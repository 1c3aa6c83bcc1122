"""gradcomp.plan, the step-time model: its collectives against the formulas written out,
its schedule against hand-worked steps and against a time-stepped simulation written
independently here, PowerSGD's and the top-k methods' traffic, and its errors."""
import json
import math
import os
import random
import subprocess
import sys

import pytest

import gradcomp
from gradcomp import plan


def test_collectives_follow_the_ring_and_tree_formulas():
    link = plan.Link(8e9, latency=1e-5, efficiency=0.5)  # 0.5 GB/s of payload: 2 ns a byte
    assert plan.collective_seconds(link, 1, "all_reduce", 1e9) == 0.0
    # 4 ranks, 4 MB: ring 6 messages of 1 MB (1e-5 + 2e-3 s each); the tree's 8 MB costs more.
    assert plan.collective_seconds(link, 4, "all_reduce", 4e6) == pytest.approx(6 * (1e-5 + 2e-3))
    # 128 ranks, 8 bytes: the tree's 14 latencies beat the ring's 254.
    assert plan.collective_seconds(link, 128, "all_reduce", 8) == pytest.approx(14 * 1e-5 + 2 * 8 * 2e-9)
    # No collective takes less than its kind's measured floor (float16 falls back to the
    # all-reduce's); one rank moves nothing.
    floored = plan.Link(8e9, latency=1e-5, efficiency=0.5, floors={"all_gather": 0.02, "all_reduce": 0.03})
    assert plan.collective_seconds(floored, 8, "all_gather", 1e3) == 0.02
    assert plan.collective_seconds(floored, 8, "all_gather", 1e7) == pytest.approx(7 * (1e-5 + 2e-2))
    assert plan.collective_seconds(floored, 8, "all_reduce_fp16", 8) == 0.03
    assert plan.collective_seconds(floored, 1, "all_gather", 1e3) == 0.0
    # gloo rings at every size, a fitted collective too.
    ring = plan.Link(8e9, latency=1e-5, efficiency=0.5, tree_all_reduce=False, fitted={"all_reduce": (1e-5, 0.5)})
    assert plan.collective_seconds(ring, 128, "all_reduce", 8) == pytest.approx(254 * (1e-5 + 8 / 128 * 2e-9))
    assert plan.collective_seconds(link, 4, "all_gather", 1e6) == pytest.approx(3 * (1e-5 + 2e-3))
    assert plan.collective_seconds(link, 4, "reduce_scatter", 4e6) == pytest.approx(3 * (1e-5 + 2e-3))
    assert plan.collective_seconds(link, 8, "all_to_all", 1e3) == pytest.approx(7 * (1e-5 + 2e-6))
    assert plan.collective_seconds(link, 8, "broadcast", 1e3) == pytest.approx(3 * (1e-5 + 2e-6))
    # A collective fitted apart takes its own latency and efficiency; float16 falls back
    # to the all-reduce's.
    gloo = plan.Link(8e9, 1e-5, 0.5, fitted={"all_gather": (1e-3, 0.25)})
    assert plan.collective_seconds(gloo, 4, "all_gather", 1e6) == pytest.approx(3 * (1e-3 + 4e-3))
    assert plan.collective_seconds(gloo, 4, "all_reduce_fp16", 4e6) == pytest.approx(6 * (1e-5 + 2e-3))
    gloo = plan.Link(8e9, 1e-5, 0.5, fitted={"all_reduce": (0.0, 1.0), "all_reduce_fp16": (0.0, 0.1)})
    assert plan.collective_seconds(gloo, 2, "all_reduce_fp16", 2e6) == pytest.approx(2 * 1e6 * 8 / 8e8)


def test_counts_are_the_densities_counts():
    assert plan.count(0.07, 100) == 7  # not 8: docs/algorithms.md, "Densities and counts"
    assert plan.count(0.001, 1000) == 1
    assert plan.count(0.5, 3) == 2
    assert plan.count(1e-9, 10) == 1
    assert plan.count(1.0, 10) == 10


def test_traffic_of_each_method():
    b = plan.Bucket(1_000_000 + 100 + 50, 0.0, matrices=((1000, 1000), (10, 10)), vector_floats=50)
    assert plan.traffic("dense", b, 4, 0.01) == ([("all_reduce", 4 * b.numel)], 0)
    assert plan.traffic("fp16", b, 4, 0.01) == ([("all_reduce_fp16", 2 * b.numel)], 0)
    # rank 4: the 1000 x 1000 matrix as P and Q of 4000 floats each; the 10 x 10 whole
    # ((10 + 10) * 4 * 2 = 160 floats are not half of 100), with the 50 of the vectors.
    assert plan.traffic("powersgd4", b, 4, 0.01) == ([("all_reduce", 4 * 150), ("all_reduce", 4 * 4000),
                                                      ("all_reduce", 4 * 4000)], 0)
    # with torch's min_compression_rate of 1 the 10 x 10 is still whole (80 floats of 100 compress)
    sent, _ = plan.traffic("powersgd4", b, 4, 0.01, min_compression_rate=1.0)
    assert sent[1:] == [("all_reduce", 4 * 4040), ("all_reduce", 4 * 4040)]
    k = math.ceil(0.01 * b.numel)
    sent, decoded = plan.traffic("topk_ef", b, 4, 0.01, entry_bytes=6)
    # the verdict, then the message padded to the bound: an eighth more, in 64 bytes
    # (k = 10,002: 60,068 bytes and 7,508)
    assert k == 10_002 and sent == [("all_gather", 24 + 67_584)] and decoded == 4 * k
    assert plan.traffic("topk_ef", plan.Bucket(800, 0.0), 4, 0.01, entry_bytes=8) == ([("all_gather", 24 + 192)], 32)
    # comm/frames.hpp's bound rounds an eighth down: 626 bytes + 78 is 704, not 768
    assert plan.traffic("topk_ef", plan.Bucket(9500, 0.0), 4, 0.01, entry_bytes=6) == ([("all_gather", 24 + 704)], 380)
    sent, decoded = plan.traffic("sparse_allreduce", b, 4, 0.01)
    assert sent[0] == ("all_gather", 40) and decoded == 2 * k and len(sent) == 8  # the frames
    # the blocks: a header and a rank's entries for each region, with an eighth of room and 16
    assert sent[1] == ("all_to_all", 8 * (1 + 9 * k / 32 + 16))
    assert sent[-2] == ("all_gather", 16)  # the records
    assert sent[-1] == ("all_gather", 8 * (9 * k / 32 + 16))  # the selection's parts, as much room
    sent, decoded = plan.traffic("scalecom", b, 4, 0.01)
    assert sum(n for c, n in sent if c == "broadcast") == 8 * k and decoded == k
    assert sent[0] == ("all_gather", 40)  # the frames: verdicts, and the sizes the collectives move


def test_one_bucket_at_the_end_of_backward_exposes_everything():
    link = plan.Link(8e9, latency=0.0)  # 1 GB/s
    w = plan.Workload(0.1, 0.3, 0.05, (plan.Bucket(1_000_000, 0.3),), {"topk_ef": plan.Costs((0.02,), 1e-8, 8.0)})
    dense = plan.predict(w, "dense", 4, link)
    assert dense.step == pytest.approx(0.1 + 0.3 + 6 * 1e-3 + 0.05)
    k = 10_000
    p = plan.predict(w, "topk_ef", 4, link, density=0.01)
    network = 3 * (24 + 90_112) / 1e9  # the frame: the verdict and 80,056 bytes' bound
    assert p.step == pytest.approx(0.45 + 0.02 + network + 4 * k * 1e-8)
    assert p.network == pytest.approx(network)
    assert p.exposed == pytest.approx(network)


def test_hook_work_takes_the_processor_from_backward():
    link = plan.Link(8e9, latency=0.0)
    w = plan.Workload(0.1, 0.3, 0.05, (plan.Bucket(1_000_000, 0.1), plan.Bucket(1_000_000, 0.3)),
                      {"topk_ef": plan.Costs((0.02, 0.02), 1e-8, 8.0)})
    # Bucket 0: ready at 0.1, compressed until 0.12, decoded on arrival (0.12 + network)
    # for 4e-4 s; backward's remaining 0.2 s end 0.0204 late; bucket 1 as the last above.
    network = 3 * (24 + 90_112) / 1e9
    assert plan.predict(w, "topk_ef", 4, link, 0.01).step == pytest.approx(
        0.1 + 0.3 + 0.02 + 4e-4 + 0.02 + network + 4e-4 + 0.05)
    # dense: bucket 0's all-reduce (6 ms) hides behind backward; bucket 1's does not.
    assert plan.predict(w, "dense", 4, link).step == pytest.approx(0.1 + 0.3 + 6e-3 + 0.05)


def test_the_transports_computation_takes_the_processor_from_backward():
    w = plan.Workload(0.1, 0.3, 0.05, (plan.Bucket(1_000_000, 0.1), plan.Bucket(1_000_000, 0.3)))
    ring = 6 * 4e6 / 4 / 1e9  # dense's all-reduce of 4 MB on 4 ranks at 1 GB/s: 6 ms
    # Half of each all-reduce is the transport's computation (gloo's sums): bucket 0's
    # 3 ms hold backward back; bucket 1's come after backward with the rest of its ring.
    link = plan.Link(8e9, latency=0.0, busy={"all_reduce": 0.5})
    p = plan.predict(w, "dense", 4, link)
    assert p.step == pytest.approx(0.1 + 0.3 + ring / 2 + ring + 0.05)
    assert p.hook_computation == pytest.approx(ring)
    # float16's all-reduce takes the all-reduce's share where it has none of its own.
    assert link.computing("all_reduce_fp16", 0.01) == pytest.approx(0.005)
    assert link.computing("all_gather", 0.01) == 0.0
    assert plan.Link(8e9, busy={"all_reduce_fp16": 0.9}).computing("all_reduce_fp16", 0.01) == pytest.approx(0.009)
    with pytest.raises(gradcomp.InvalidArgumentError, match=r"busy\['all_gather'\] must be in \[0, 1\], got 1.5"):
        plan.Link(8e9, busy={"all_gather": 1.5})
    with pytest.raises(gradcomp.InvalidArgumentError, match=r"busy\['all_gather'\] must be in \[0, 1\], got '0.5'"):
        plan.Link(8e9, busy={"all_gather": "0.5"})
    with pytest.raises(gradcomp.InvalidArgumentError, match="busy must be a dict of shares by collective, got list"):
        plan.Link(8e9, busy=[0.5])


def simulated_step(workload, method, world, link, density, tick):
    """An independent reference: the schedule of gradcomp.plan's docstring stepped in
    ticks of ``tick`` seconds."""
    costs = workload.costs[method]
    boundaries = [b.ready for b in workload.buckets] + [workload.backward]
    network = []
    for b in workload.buckets:
        sent, entries = plan.traffic(method, b, world, density, costs.entry_bytes)
        network.append((sum(plan.collective_seconds(link, world, c, n) for c, n in sent), entries))
    t, progress, hook_bucket, phase, left, wire_free = 0.0, 0.0, 0, "wait", 0.0, 0.0
    arrival = None
    n = len(workload.buckets)
    while True:
        ready = sum(progress >= x - 1e-12 for x in boundaries[:-1])
        if phase == "wait" and hook_bucket < n and ready > hook_bucket:
            phase, left = "compress", costs.compress[hook_bucket]
        if phase == "network" and t >= arrival - 1e-12:
            phase, left = "decode", costs.decode_per_entry * network[hook_bucket][1]
        if phase in ("compress", "decode") and left <= 1e-12:
            if phase == "compress":
                arrival = max(t, wire_free) + network[hook_bucket][0]
                wire_free, phase = arrival, "network"
                continue
            hook_bucket, phase = hook_bucket + 1, "wait"
            continue
        if hook_bucket == n and progress >= workload.backward - 1e-12:
            return workload.forward + t + workload.optimizer
        if phase in ("compress", "decode"):
            left -= tick
        elif progress < workload.backward:
            progress = min(workload.backward, progress + tick)
        t += tick


@pytest.mark.parametrize("seed", range(6))
def test_the_schedule_matches_a_time_stepped_simulation(seed):
    rng = random.Random(seed)
    buckets, ready = [], 0.0
    for _ in range(rng.randint(1, 4)):
        ready += rng.uniform(0.0, 0.01)
        buckets.append(plan.Bucket(rng.randint(10_000, 400_000), ready))
    w = plan.Workload(0.002, ready + rng.uniform(0.0, 0.005), 0.001, tuple(buckets),
                      {"topk_ef": plan.Costs(tuple(rng.uniform(0.0, 0.003) for _ in buckets),
                                             rng.uniform(0.0, 1e-7), 8.0)})
    link = plan.Link(rng.choice([1e8, 1e9, 1e10]), latency=rng.uniform(0.0, 1e-4))
    density = rng.choice([0.01, 0.1])
    tick = 2e-6
    expected = simulated_step(w, "topk_ef", 4, link, density, tick)
    assert plan.predict(w, "topk_ef", 4, link, density).step == pytest.approx(expected, abs=20 * tick)


def test_plan_ranks_methods_and_the_command_line_prints_them(tmp_path, capsys):
    workload = {"forward": 0.02, "backward": 0.04, "optimizer": 0.0,
                "buckets": [{"numel": 4_000_000, "ready": 0.02}, {"numel": 4_000_000, "ready": 0.04}],
                "costs": {"topk_ef": {"compress": [0.001, 0.001], "decode_per_entry": 1e-9, "entry_bytes": 8}}}
    path = tmp_path / "workload.json"
    path.write_text(json.dumps(workload))
    w = plan.load(str(path))
    rows = plan.plan(w, 8, plan.Link(1e9))
    assert [name for name, _, _ in rows][0] == "topk_ef"  # 1 Gbit/s: 32 MB dense per step cannot compete
    assert {(name, d) for name, d, _ in rows} == {("dense", 0.0), ("topk_ef", 0.01), ("topk_ef", 0.001)}
    plan.main([str(path), "--world", "8", "--link", "100gbit"])
    out = capsys.readouterr().out
    assert "W = 8, 100 Gbit/s" in out and "| dense | - |" in out and "| topk_ef | 0.001 |" in out


def test_bad_input_is_named():
    # every refusal is a gradcomp.InvalidArgumentError (a ValueError too)
    with pytest.raises(gradcomp.InvalidArgumentError, match="density must be in"):
        plan.predict(plan.Workload(0.0, 0.1, 0.0, ()), "dense", 2, plan.Link(1e9), density=0.0)
    with pytest.raises(ValueError, match="efficiency must be in"):
        plan.Link(1e9, efficiency=0.0)
    with pytest.raises(ValueError, match="bits_per_second must be positive"):
        plan.Link(-1.0)
    with pytest.raises(ValueError, match="rate must be written like 10gbit"):
        plan.parse_rate("fast")
    assert plan.parse_rate("400mbit") == 4e8
    w = plan.Workload(0.0, 0.1, 0.0, (plan.Bucket(10, 0.05),))
    with pytest.raises(ValueError, match="no measured costs for method 'dgc'"):
        plan.predict(w, "dgc", 2, plan.Link(1e9))
    with pytest.raises(ValueError, match="world must be >= 1, got 0"):
        plan.predict(w, "dense", 0, plan.Link(1e9))
    with pytest.raises(ValueError, match="method must be"):
        plan.traffic("gzip", w.buckets[0], 2, 0.1)
    with pytest.raises(ValueError, match="ready in order, within backward"):
        plan.predict(plan.Workload(0.0, 0.1, 0.0, (plan.Bucket(10, 0.2),)), "dense", 2, plan.Link(1e9))


def experiments_module(name):
    """experiments/<name>.py, imported from the repository's root."""
    import importlib
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    if root not in sys.path:
        sys.path.insert(0, root)
    return importlib.import_module(f"experiments.{name}")


def test_the_transports_share_is_its_processor_seconds_over_a_ranks_cores():
    report = experiments_module("plan_report")
    rows = [{"collective": "all_reduce", "bytes": 1e6, "seconds": 0.1, "cpu_seconds": 0.02},
            {"collective": "all_reduce", "bytes": 4e6, "seconds": 0.3, "cpu_seconds": 0.04},
            {"collective": "broadcast", "bytes": 1e6, "seconds": 0.1, "cpu_seconds": 0.09}]
    # 4 ranks on 2 cores: 0.06 of 0.4 s is 15% of a core, 30% of a rank's half; the
    # broadcast's 90% of a core is more than a rank's half: all of it.
    link = report.fit_link(1e9, rows, 4, cores=2)
    assert link.busy["all_reduce"] == pytest.approx(0.3) and link.busy["broadcast"] == 1.0
    assert report.fit_link(1e9, rows, 4).busy["all_reduce"] == pytest.approx(0.15)  # a core per rank
    # A calibration without processor seconds: what the efficiency takes from the rate.
    old = report.fit_link(1e9, [{k: v for k, v in r.items() if k != "cpu_seconds"} for r in rows], 4)
    assert old.busy["all_reduce"] == pytest.approx(1.0 - old.fitted["all_reduce"][1])


def test_a_hooks_cost_is_its_step_less_the_step_without_it_right_after():
    calibrate = experiments_module("plan_calibrate")
    calls, clock = [], iter(range(1000))

    def step(name, seconds):
        def run():
            calls.append(name)
            return seconds + 0.001 * next(clock)  # the machine slows down as it goes
        return run

    added = calibrate.added_in_turns(step("none", 1.0), {"a": step("a", 1.5), "b": step("b", 1.25)}, 10)
    assert calls[:4] == ["a", "none", "b", "none"] and len(calls) == 40
    # each difference is taken one tick apart: 0.5 - 0.001 and 0.25 - 0.001
    assert added == {"a": pytest.approx(0.499), "b": pytest.approx(0.249)}


def test_the_report_in_the_docs_is_what_its_data_gives():
    """docs/results.md's tables ("What it buys at scale") come from the committed runs."""
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    data = os.path.join("docs", "data", "plan-2026-11-29-cores")
    runs = [os.path.join(data, run) for run in ("1gbit-w4", "10gbit-w4", "1gbit-w8", "10gbit-w8")]
    printed = subprocess.run([sys.executable, "-m", "experiments.plan_report", *runs], cwd=root, capture_output=True,
                             text=True, timeout=120, check=True).stdout
    with open(os.path.join(root, data, "report.md")) as f:
        assert printed == f.read()
    with open(os.path.join(root, "docs", "results.md")) as f:
        results = f.read()
    for table_row in (line for line in printed.splitlines() if line.startswith("| ")):
        assert table_row in results
