"""What each rank runs in test_ddp_features.py: the hook under DistributedDataParallel's
own features (find_unused_parameters, static_graph, no_sync, gradient_as_bucket_view, a
frozen layer with BatchNorm, join, subgroups, 16-bit parameters and autocast, resume from
a checkpoint) and under torch.compile, each step checked against a reference written
here."""
import contextlib
import math
import os

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomp
from gradcomp.torch import ddp

import reference
from ddp_workers import raises_alike, same_on_all_ranks

# The model's layers are large enough for several DDP buckets in every torch (torch 1.13
# lets the first bucket reach 1 MB, torch 2 the others 0.25 MB here).
BUCKET_CAP_MB = 0.25


class Net(torch.nn.Module):
    """An MLP of 355 k parameters; optionally a layer never used in forward (for
    find_unused_parameters) and a frozen first layer followed by BatchNorm."""

    def __init__(self, unused=False, frozen_bn=False):
        super().__init__()
        self.first = torch.nn.Linear(32, 640)
        self.norm = torch.nn.BatchNorm1d(640) if frozen_bn else None
        self.hidden = torch.nn.Linear(640, 512)
        self.last = torch.nn.Linear(512, 8)
        self.unused = torch.nn.Linear(8, 8) if unused else None
        if frozen_bn:
            self.first.requires_grad_(False)

    def forward(self, x):
        h = _linear(self.first, x)
        if self.norm is not None:
            h = self.norm(h)
        return _linear(self.last, torch.relu(_linear(self.hidden, torch.relu(h))))


def _linear(layer, x):
    """``layer(x)`` computed in float32 (CPU kernels lack float16 matrix products in torch
    1.13); 16-bit parameters still get 16-bit gradients, in 16-bit DDP buckets."""
    return torch.nn.functional.linear(x.float(), layer.weight.float(), layer.bias.float())


def batch(rank, step, size=16, dtype=torch.float32):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(size, 32, generator=g).to(dtype), torch.randint(0, 8, (size,), generator=g)


def loss_of(net, rank, step, dtype=torch.float32):
    x, y = batch(rank, step, dtype=dtype)
    return torch.nn.functional.cross_entropy(net(x).float(), y)


class Recorder:
    """Records each bucket's parameters and local gradient before gradcomp's hook runs
    (``hook``, to register)."""

    def __init__(self):
        self.seen = []

        def hook(state, bucket):
            self.seen.append((list(bucket.parameters()), bucket.buffer().detach().clone()))
            return ddp.hook(state, bucket)

        self.hook = hook


def names_of(state):
    """The State's names of the model's parameters: {name: parameter}."""
    return {name: ref() for ref, name in state._parameters._names.values()}


def local_gradients(state, recorder):
    """This rank's gradient of each parameter the hook saw in the last step, as float32
    NumPy arrays by the State's names."""
    names = {id(p): n for n, p in names_of(state).items()}
    out = {}
    for params, buffer in recorder.seen:
        at = 0
        for p in params:
            out[names[id(p)]] = buffer[at:at + p.numel()].float().numpy()
            at += p.numel()
    return out


def every_rank(local, group=None):
    """Every rank's ``local`` ({name: array}, the same names everywhere), in rank order."""
    names = sorted(local)
    flat = torch.from_numpy(np.concatenate([local[n] for n in names]))
    parts = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, flat, group=group)
    out = []
    for part in parts:
        each, at = {}, 0
        for n in names:
            each[n] = part[at:at + len(local[n])].numpy()
            at += len(local[n])
        out.append(each)
    return out


class PerParameter:
    """The hook's steps written out with NumPy, each parameter's memory kept under its
    name (as the hook keeps it however DDP groups the parameters): per unit of the
    State's, error-feedback top-k whose messages every rank adds in rank order
    (aggregation "allgather"), or Ok-Topk's global top-k ("sparse_allreduce"); a dense
    step is the mean."""

    def __init__(self, world, density, aggregation):
        self.world, self.density, self.aggregation = world, density, aggregation
        self.memory = [{} for _ in range(world)]

    def dense(self, grads):
        return {n: sum(g[n].astype(np.float64) for g in grads) / self.world for n in grads[0]}

    def step(self, units, grads):
        out = {}
        scale = np.float32(1.0 / self.world)
        for unit in units:
            sizes = [len(grads[0][n]) for n in unit]
            total = sum(sizes)
            k = reference.k_for(self.density, total)
            e = [np.concatenate([self.memory[r].get(n, np.zeros(len(grads[0][n]), np.float32)) for n in unit])
                 for r in range(self.world)]
            g = [np.concatenate([grads[r][n] for n in unit]) for r in range(self.world)]
            mean = np.zeros(total, dtype=np.float32)
            if self.aggregation == "allgather":
                for r in range(self.world):
                    e[r] = (e[r] + g[r]).astype(np.float32)
                    idx = reference.top_k(e[r], k)
                    mean[idx] += scale * e[r][idx]
                    e[r][idx] = 0.0
            else:
                global_topk = reference.GlobalTopk(self.world, total)
                global_topk.e = e
                idx, sums = global_topk.step(g, k, k)
                mean[idx] = scale * sums
                e = global_topk.e
            at = 0
            for n, size in zip(unit, sizes):
                out[n] = mean[at:at + size]
                for r in range(self.world):
                    self.memory[r][n] = e[r][at:at + size].copy()
                at += size
        return out


def check_step(state, recorder, ref, compressed, group=None):
    """The model's gradients after DDP's backward equal the reference's step."""
    grads = every_rank(local_gradients(state, recorder), group)
    params = names_of(state)
    if compressed:
        want = ref.step(state.units, grads)
    else:
        want = ref.dense(grads)
    for n, p in params.items():
        if p.grad is None:  # unused on every rank: DDP leaves it
            continue
        got = p.grad.detach().view(-1)
        if compressed:
            expected = torch.from_numpy(want[n]).to(got.dtype)
            assert torch.equal(got, expected), (n, float((got.float() - expected.float()).abs().max()))
        else:
            wide = got.dtype == torch.float32  # a 16-bit bucket is divided and summed in 16 bits
            np.testing.assert_allclose(got.float().numpy(), want[n], rtol=1e-5 if wide else 2e-2,
                                       atol=1e-6 if wide else 1e-4)


def train_checked(rank, world, feature, aggregation="allgather", steps=5, start_iter=1, density=0.05, dtype=None,
                  group=None):
    """``steps`` steps of the model under DDP with ``feature``, each checked against the
    reference; returns the State."""
    torch.manual_seed(0)
    model = Net(unused=feature == "find_unused_parameters", frozen_bn=feature == "frozen_bn")
    if dtype is not None:
        model = model.to(dtype)
    kwargs = {"find_unused_parameters": feature == "find_unused_parameters", "static_graph": feature == "static_graph",
              "gradient_as_bucket_view": feature == "gradient_as_bucket_view"}
    if feature == "static_graph" and not _has_static_graph():
        return None
    # torch.compile's DDPOptimizer wants the first bucket no larger than the others
    # (DDP's first holds up to 1 MB): the compiled model's buckets are 1 MB.
    cap = 1.0 if feature == "compile" else BUCKET_CAP_MB
    net = DDP(model, bucket_cap_mb=cap, process_group=group, **kwargs)
    # aot_eager: Dynamo's graph split at the buckets and AOTAutograd's backward, without
    # generating code (what the hook meets under torch.compile, in seconds here).
    forward = torch.compile(net, backend="aot_eager") if feature == "compile" else net
    state = ddp.State(group, method="topk_ef", density=density, start_iter=start_iter, aggregation=aggregation)
    recorder = Recorder()
    net.register_comm_hook(state, recorder.hook)
    ref = PerParameter(dist.get_world_size(group), density, aggregation)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    me = dist.get_rank(group)
    for step in range(steps):
        recorder.seen.clear()
        compressed = state.iter >= state.start_iter
        if feature == "no_sync":  # two micro-batches, the first without the exchange
            with net.no_sync():
                loss_of(net, me, 100 + step, dtype or torch.float32).backward()
            assert not recorder.seen, "the hook ran inside no_sync()"
        if feature == "autocast":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_of(net, me, step)
        else:
            loss = loss_of(forward, me, step, dtype or torch.float32)
        loss.backward()
        check_step(state, recorder, ref, compressed, group)
        opt.step()
        opt.zero_grad()
    assert state.iter == steps
    return state


def _torch2():
    return int(torch.__version__.split(".")[0]) >= 2


def _has_static_graph():
    import inspect
    return "static_graph" in inspect.signature(DDP).parameters


def check_features(rank, world):
    """Every feature, both aggregations, each step against the reference. Several of
    them regroup (DDP rebuilds its buckets after the first step; start_iter=0 compresses
    that first step in the first buckets, and the memory moves with the parameters)."""
    for aggregation in ("allgather", "sparse_allreduce"):
        for feature, start_iter in (("plain", 0), ("find_unused_parameters", 1), ("static_graph", 1),
                                    ("no_sync", 2), ("gradient_as_bucket_view", 0), ("frozen_bn", 1),
                                    ("autocast", 1)):
            state = train_checked(rank, world, feature, aggregation, start_iter=start_iter)
            assert state is None or len(state.units) >= 2, (feature, state.units)


def check_compiled(rank, world):
    """The hook under a model compiled by torch.compile (torch 2.x), both aggregations,
    each step against the reference."""
    if not _torch2():
        return
    for aggregation in ("allgather", "sparse_allreduce"):
        train_checked(rank, world, "compile", aggregation, steps=4, start_iter=1)


def check_16_bit(rank, world):
    """bfloat16 and float16 parameters: dense warm-up steps (gloo all-reduces bfloat16
    through float32) and compressed steps (widened exactly), against the reference.
    (torch 1.13's DDP cannot broadcast bfloat16 parameters over gloo at construction:
    there ddp_workers.py's 16-bit test covers the hook's bfloat16 buckets.)"""
    for dtype in (torch.bfloat16, torch.float16) if _torch2() else (torch.float16,):
        for aggregation in ("allgather", "sparse_allreduce"):
            train_checked(rank, world, "plain", aggregation, steps=4, start_iter=2, dtype=dtype)


def check_density_1_is_dense_allreduce(rank, world):
    """At density 1 the hook's training follows DDP's own all-reduce, with
    find_unused_parameters and with join() over uneven inputs (each rank its own number
    of batches; a joined rank's buckets count as zeros, as DDP's)."""
    for feature in ("find_unused_parameters", "join"):
        params = []
        for hooked in (False, True):
            torch.manual_seed(0)
            net = DDP(Net(unused=feature == "find_unused_parameters"), bucket_cap_mb=BUCKET_CAP_MB,
                      find_unused_parameters=feature == "find_unused_parameters")
            if hooked:
                net.register_comm_hook(ddp.State(method="topk_ef", density=1.0, start_iter=1), ddp.hook)
            opt = torch.optim.SGD(net.parameters(), lr=0.05)
            steps = 4 + (rank if feature == "join" else 0)
            with net.join(enable=feature == "join"):
                for step in range(steps):
                    loss_of(net, rank, step).backward()
                    opt.step()
                    opt.zero_grad()
            params.append(torch.cat([p.detach().view(-1) for p in net.parameters()]))
        torch.testing.assert_close(params[1], params[0], rtol=1e-5, atol=1e-6)
        assert same_on_all_ranks(params[1])


def check_subgroups(rank, world):
    """DDP on subgroups (ranks in pairs; each State on its pair): each step against the
    reference within the pair."""
    size = 2 if world % 2 == 0 and world > 2 else 1
    # torch 1.13 has every rank make every group
    groups = [dist.new_group(list(range(first, first + size))) for first in range(0, world, size)]
    group = groups[rank // size]
    train_checked(rank, world, "plain", "allgather", steps=3, start_iter=1, group=group)
    train_checked(rank, world, "plain", "sparse_allreduce", steps=3, start_iter=1, group=group)


def check_every_method(rank, world):
    """Every method with find_unused_parameters, static_graph, no_sync and join() over
    uneven inputs: the ranks' gradients agree and stay finite."""
    for method, options in (("dgc", {"density": 0.02, "max_norm": 5.0}), ("adacomp", {}),
                            ("randomk_ef", {"density": 0.02}), ("threshold_ef", {"tau": 0.01}),
                            ("scalecom", {"density": 0.02})):
        aggregations = ("allgather",) if method == "scalecom" else ("allgather", "sparse_allreduce")
        for aggregation in aggregations:
            for feature in ("find_unused_parameters", "static_graph", "no_sync", "join"):
                if feature == "static_graph" and not _has_static_graph():
                    continue
                torch.manual_seed(0)
                net = DDP(Net(unused=feature == "find_unused_parameters"), bucket_cap_mb=BUCKET_CAP_MB,
                          find_unused_parameters=feature == "find_unused_parameters",
                          static_graph=feature == "static_graph")
                state = ddp.State(method=method, start_iter=1, aggregation=aggregation, **options)
                net.register_comm_hook(state, ddp.hook)
                opt = torch.optim.SGD(net.parameters(), lr=0.05)
                steps = 4 + (rank if feature == "join" else 0)  # join: each rank its own number of batches
                with net.join(enable=feature == "join"):
                    for step in range(steps):
                        if feature == "no_sync":
                            with net.no_sync():
                                loss_of(net, rank, 100 + step).backward()
                        loss_of(net, rank, step).backward()
                        grads = torch.cat([p.grad.view(-1) for p in net.parameters() if p.grad is not None])
                        assert torch.isfinite(grads).all(), (method, aggregation, feature)
                        if feature != "join":
                            assert same_on_all_ranks(grads), (method, aggregation, feature)
                        opt.step()
                        opt.zero_grad()
                params = torch.cat([p.detach().view(-1) for p in net.parameters()])
                assert same_on_all_ranks(params), (method, aggregation, feature)
                assert state.iter == 3 + world and len(state.compressors) >= 2 if feature == "join" else \
                    state.iter == 4, (method, feature, state.iter, state.units)


def check_one_state_per_model(rank, world):
    """A State registered on two models raises in the second's backward, the same error
    on every rank, before any memory is mixed; State's arguments after process_group are
    keywords; DGC's workers default to the group's size."""
    torch.manual_seed(0)
    state = ddp.State(method="topk_ef", density=0.05, start_iter=0)
    first, second = DDP(Net(), bucket_cap_mb=BUCKET_CAP_MB), DDP(Net(), bucket_cap_mb=BUCKET_CAP_MB)
    first.register_comm_hook(state, ddp.hook)
    second.register_comm_hook(state, ddp.hook)
    for step in range(2):
        loss_of(first, rank, step).backward()
    memory = {i: c.state_dict()["state"].clone() for i, c in state.compressors.items()}
    raises_alike(lambda: loss_of(second, rank, 0).backward(), RuntimeError,
                 "holds parameters this State has not seen: a State keeps the memory of one model's parameters "
                 "(make one State per model)", within=True)
    assert all(torch.equal(state.compressors[i].state_dict()["state"], memory[i]) for i in memory)

    try:
        ddp.State("dgc")
        raise AssertionError("State('dgc') was accepted")
    except gradcomp.InvalidArgumentError as e:
        assert str(e) == ("gradcomp: State: process_group must be a torch.distributed ProcessGroup or None, got a "
                          "str (the method is a keyword: State(method='dgc'))"), str(e)
    assert ddp.State(method="dgc")._options()["workers"] == world
    assert ddp.State(method="dgc", workers=1)._options()["workers"] == 1
    assert "workers" not in ddp.State(method="topk_ef")._options()


def check_non_finite(rank, world):
    """Mixed precision: an infinity in one rank's gradients (a loss scale too high) makes
    every bucket NaN on every rank with non_finite="propagate", so that GradScaler skips
    the step (torch 2's CPU GradScaler where it exists), and changes no memory; with the
    default it raises on every rank."""
    for mode in ("propagate", "raise"):
        torch.manual_seed(0)
        net = DDP(Net(), bucket_cap_mb=BUCKET_CAP_MB)
        state = ddp.State(method="topk_ef", density=0.05, start_iter=1, non_finite=mode)
        net.register_comm_hook(state, ddp.hook)
        scaler = _cpu_grad_scaler()
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        for step in range(4):
            loss = loss_of(net, rank, step)
            if step == 2:
                memory = {i: c.state_dict()["state"].clone() for i, c in state.compressors.items()}
                before = [p.detach().clone() for p in net.parameters()]
                if rank == world - 1:
                    loss = loss * math.inf
                if mode == "raise":
                    raises_alike(lambda loss=loss: loss.backward(), RuntimeError,
                                 f"is not finite (rank {world - 1} of {world})", within=True)
                    opt.zero_grad()
                    continue
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
            if step == 2:
                assert all(torch.isnan(p.grad).all() for p in net.parameters()), "a bucket came back finite"
                assert all(torch.equal(state.compressors[i].state_dict()["state"], memory[i]) for i in memory)
            if scaler is not None:
                scaler.step(opt)
                scaler.update()
            elif all(torch.isfinite(p.grad).all() for p in net.parameters()):
                opt.step()
            if step == 2:
                assert all(torch.equal(p, b) for p, b in zip(net.parameters(), before)), "the step was not skipped"
            opt.zero_grad()
        assert state.stats(total=True)["refused_buckets"] >= 1


def _cpu_grad_scaler():
    try:
        return torch.amp.GradScaler("cpu")
    except (AttributeError, TypeError, RuntimeError):
        return None  # torch 1.13 scales on CUDA only


# -- resume from a checkpoint, in new processes ----------------------------------------------

RESUMES = [
    # (case, model, start_iter, method, options)
    ("topk_ef-compressed-from-step-0", "several", 0, "topk_ef", {"density": 0.05}),
    ("sparse_allreduce", "several", 1, "topk_ef", {"density": 0.05, "aggregation": "sparse_allreduce"}),
    ("dgc", "several", 2, "dgc", {"density": 0.05, "max_norm": 5.0}),
    ("one-bucket", "one", 1, "topk_ef", {"density": 0.05}),
    ("scalecom", "several", 1, "scalecom", {"density": 0.05}),
]
CHECKPOINT_AT, STEPS = 4, 7


def _resume_model(kind):
    torch.manual_seed(0)
    if kind == "one":  # one bucket whose parameters DDP reorders when it rebuilds
        return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    return Net()


def _resume_run(rank, world, first, last, case, kind, start_iter, method, options):
    """The run of one case from step ``first`` to ``last``. With GRADCOMP_TEST_DEVICE=cuda
    the model and its buckets are on the GPU and every step runs on a stream of its own,
    not the default one (backward, DDP's buckets and the hook's work then run there; a
    Future of the hook's that missed it would let DDP read a bucket not yet written)."""
    folder = os.environ["GRADCOMP_TEST_DIR"]
    device = torch.device(os.environ.get("GRADCOMP_TEST_DEVICE", "cpu"))
    model = _resume_model(kind).to(device)
    checkpoint = os.path.join(folder, f"{case}-rank{rank}.pt")
    if first > 0:
        saved = torch.load(checkpoint)  # torch 2's weights-only unpickler rebuilds a State
        model.load_state_dict(saved["model"])
        state = saved["hook"]
        assert state.iter == first
    else:
        state = ddp.State(method=method, start_iter=start_iter, **options)
    net = DDP(model, bucket_cap_mb=BUCKET_CAP_MB)
    net.register_comm_hook(state, ddp.hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    side = torch.cuda.Stream() if device.type == "cuda" else None
    for step in range(first, last):
        x, y = batch(rank, step)
        with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
            if side is not None:
                side.wait_stream(torch.cuda.default_stream())  # the model and the optimizer's state
            loss = torch.nn.functional.cross_entropy(net(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            opt.zero_grad()
        if side is not None:
            torch.cuda.default_stream().wait_stream(side)
        if step + 1 == CHECKPOINT_AT and first == 0:
            torch.save({"model": net.module.state_dict(), "hook": state}, checkpoint)
    final = torch.cat([p.detach().view(-1) for p in net.parameters()]).cpu()
    torch.save(final, os.path.join(folder, f"{case}-rank{rank}-{'resumed' if first else 'uninterrupted'}.pt"))
    return state


def run_uninterrupted(rank, world):
    for case, kind, start_iter, method, options in RESUMES:
        _resume_run(rank, world, 0, STEPS, case, kind, start_iter, method, options)


def run_resumed(rank, world):
    """In new processes: each case resumed from its checkpoint ends with the parameters
    of the uninterrupted run, bit for bit."""
    folder = os.environ["GRADCOMP_TEST_DIR"]
    for case, kind, start_iter, method, options in RESUMES:
        _resume_run(rank, world, CHECKPOINT_AT, STEPS, case, kind, start_iter, method, options)
        got = torch.load(os.path.join(folder, f"{case}-rank{rank}-resumed.pt"))
        want = torch.load(os.path.join(folder, f"{case}-rank{rank}-uninterrupted.pt"))
        assert torch.equal(got, want), (case, float((got - want).abs().max()))


SCENARIOS = {
    "features": check_features,
    "16-bit": check_16_bit,
    "compile": check_compiled,
    "density-1": check_density_1_is_dense_allreduce,
    "subgroups": check_subgroups,
    "methods": check_every_method,
    "one-state-per-model": check_one_state_per_model,
    "non-finite": check_non_finite,
    "uninterrupted": run_uninterrupted,
    "resumed": run_resumed,
}
