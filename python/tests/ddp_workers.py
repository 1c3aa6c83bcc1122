"""What each rank of the DDP tests runs (in a spawned process; see test_ddp.py)."""
import io
import time

import numpy as np
import torch
import torch.distributed as dist

import gradcomp
from gradcomp.torch import Compressor, accumulate, ddp

import reference

_PARAMETERS = {}


def parameters_of(index, n):
    """The one parameter a test bucket of index ``index`` and ``n`` elements holds (the
    same tensor every time, as DDP's buckets hold the model's parameters)."""
    return _PARAMETERS.setdefault((index, n), [torch.nn.Parameter(torch.zeros(n))])


class Bucket:
    """What the hook reads of a torch GradBucket; ``params``, the parameters it holds
    (one of its size when None)."""

    def __init__(self, tensor, index=0, last=True, params=None):
        self._tensor = tensor
        self._index = index
        self._last = last
        self._params = parameters_of(index, tensor.numel()) if params is None else params

    def buffer(self):
        return self._tensor

    def index(self):
        return self._index

    def is_last(self):
        return self._last

    def parameters(self):
        return self._params


def grad_of(rank, step, n, bucket=0):
    g = torch.Generator().manual_seed(1000 * rank + 10 * step + bucket)
    return torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g))


def run_hook(state, rank, step, n, bucket=0, last=True):
    return ddp.hook(state, Bucket(grad_of(rank, step, n, bucket).clone(), bucket, last)).wait()


def run_step(state, rank, step, sizes):
    """One step of buckets of ``sizes``, as DDP runs it: every bucket's hook called, then
    the Futures waited for (a step's all-gather buckets complete at its last)."""
    last = len(sizes) - 1
    futures = [ddp.hook(state, Bucket(grad_of(rank, step, n, b).clone(), b, b == last)) for b, n in enumerate(sizes)]
    return [f.wait() for f in futures]


def same_on_all_ranks(t, group=None):
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t, group=group)
    return all(torch.equal(p, t) for p in parts)


def check_topk_against_reference(rank, world, density):
    n = 3001
    state = ddp.State(method="topk_ef", density=density, start_iter=2)
    refs = [reference.TopkErrorFeedback(n) for _ in range(world)]
    k = reference.k_for(density, n)
    for step in range(7):
        got = run_hook(state, rank, step, n)
        if step < 2:  # dense all-reduce of the mean
            want = sum(grad_of(r, step, n) for r in range(world)) / world
            np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
        else:
            want = np.zeros(n, dtype=np.float32)
            for r in range(world):
                idx, values = refs[r].step(grad_of(r, step, n).numpy(), k)
                want[idx] += np.float32(1.0 / world) * values
            np.testing.assert_array_equal(got.numpy(), want)
            if density == 1.0:  # everything sent: the all-reduce mean
                mean = sum(grad_of(r, step, n) for r in range(world)) / world
                np.testing.assert_allclose(got.numpy(), mean.numpy(), rtol=1e-5, atol=1e-6)
        assert same_on_all_ranks(got)
    assert state.iter == 7


def check_16_bit_buckets(rank, world):
    """A float16 or bfloat16 bucket is compressed as its float32 values are (widened
    exactly), and the hook returns the aggregate in the bucket's dtype."""
    n = 2003
    for dtype in (torch.float16, torch.bfloat16):
        narrow = ddp.State(method="dgc", density=0.01, start_iter=0)
        wide = ddp.State(method="dgc", density=0.01, start_iter=0)
        for step in range(4):
            g = grad_of(rank, step, n).to(dtype)
            got = ddp.hook(narrow, Bucket(g.clone())).wait()
            want = ddp.hook(wide, Bucket(g.float())).wait()
            assert got.dtype == dtype
            assert torch.equal(got, want.to(dtype))
            assert same_on_all_ranks(got.float())
        cpu = torch.device("cpu")
        assert torch.equal(narrow.compressor(0, n, cpu).state_dict()["state"],
                           wide.compressor(0, n, cpu).state_dict()["state"])
    # Dense warm-up steps of 16-bit buckets (gloo sums bfloat16 through float32).
    for dtype in (torch.float16, torch.bfloat16):
        state = ddp.State(method="topk_ef", density=0.01, start_iter=2)
        for step in range(2):
            got = ddp.hook(state, Bucket(grad_of(rank, step, n).to(dtype))).wait()
            want = sum(grad_of(r, step, n).to(dtype).float() / world for r in range(world))
            assert got.dtype == dtype and same_on_all_ranks(got.float())
            torch.testing.assert_close(got.float(), want.to(dtype).float(), rtol=2e-2, atol=1e-2)


def check_nan_on_one_rank(rank, world, device="cpu"):
    n = 2000
    state = ddp.State(method="dgc", density=0.01, start_iter=0, max_norm=10.0)
    twin = ddp.State(method="dgc", density=0.01, start_iter=0, max_norm=10.0)
    for step in range(4):
        g = grad_of(rank, step, n).to(device)
        if step == 2:
            before = {i: c.state_dict()["state"].clone() for i, c in state.compressors.items()}
            bad = g.clone()
            if rank == world - 1:
                bad[17] = float("nan")
            try:
                ddp.hook(state, Bucket(bad)).wait()
                raise AssertionError("the hook accepted a NaN")
            except gradcomp.NonFiniteError as e:
                text = str(e)
            assert text == f"gradcomp: compress: grad[17] = nan is not finite (rank {world - 1} of {world})", text
            for i, c in state.compressors.items():
                assert torch.equal(c.state_dict()["state"], before[i])
        got = ddp.hook(state, Bucket(g.clone())).wait()
        want = ddp.hook(twin, Bucket(g.clone())).wait()
        assert torch.equal(got, want)


def check_scalecom_against_simulation(rank, world):
    n, density, beta = 4001, 0.01, 0.5
    state = ddp.State(method="scalecom", density=density, beta=beta, start_iter=0)
    k = reference.k_for(density, n)
    m = [np.zeros(n, dtype=np.float32) for _ in range(world)]
    for step in range(6):
        got = run_hook(state, rank, step, n)
        acc = [(m[r] + grad_of(r, step, n).numpy()).astype(np.float32) for r in range(world)]
        idx = reference.top_k(acc[step % world], k)
        want = np.zeros(n, dtype=np.float64)
        for r in range(world):
            want[idx] += acc[r][idx].astype(np.float64) / world
            sent = np.zeros(n, dtype=np.float32)
            sent[idx] = acc[r][idx]
            m[r] = ((1 - beta) * m[r] + beta * (acc[r] - sent)).astype(np.float32)
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-7)
        assert np.count_nonzero(got.numpy()) <= k
        assert same_on_all_ranks(got)
    np.testing.assert_allclose(state.compressors[0].corrector_state(0).numpy(), m[rank], rtol=1e-6, atol=1e-7)


def check_checkpoint_and_bucket_errors(rank, world):
    n = [1000, 37]  # two buckets
    state = ddp.State(method="dgc", density=0.05, start_iter=1)
    uninterrupted = ddp.State(method="dgc", density=0.05, start_iter=1)
    for step in range(3):
        run_step(state, rank, step, n)
        run_step(uninterrupted, rank, step, n)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    restored = torch.load(buffer)
    assert restored.process_group is None and restored.iter == 3
    for step in range(3, 6):
        for got, want in zip(run_step(restored, rank, step, n), run_step(uninterrupted, rank, step, n)):
            assert torch.equal(got, want)
    # A bucket whose size changed, on one rank: every rank raises the same error.
    size = n[0] + (1 if rank == 0 else 0)
    try:
        ddp.hook(restored, Bucket(grad_of(rank, 9, size), 0, params=parameters_of(0, n[0]))).wait()
        raise AssertionError("a bucket of another size was accepted")
    except gradcomp.InvalidArgumentError as e:
        assert str(e) == f"gradcomp: ddp hook: the bucket has 1001 elements, expected 1000 (rank 0 of {world})", str(e)


def check_real_ddp_training(rank, world):
    torch.manual_seed(0)
    # Large enough for several buckets (DDP's first bucket takes up to 1 MB).
    model = torch.nn.Sequential(torch.nn.Linear(20, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 4))
    net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=1)
    state = ddp.State(method="dgc", density=0.05, start_iter=2)
    net.register_comm_hook(state, ddp.hook)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(256, 20, generator=g)
    y = (x[:, :4] > 0).long().argmax(dim=1)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert state.iter == 30
    assert len(state.compressors) >= 2, "the model's gradients span several buckets"
    assert losses[-1] < 0.8 * losses[0], losses
    for p in net.parameters():
        assert torch.isfinite(p).all() and same_on_all_ranks(p.detach())
    # A NaN in one rank's batch: backward raises on every rank, and no memory changes.
    before = {i: c.state_dict()["state"].clone() for i, c in state.compressors.items()}
    bad = x.clone()
    if rank == 1:
        bad[0, 0] = float("nan")
    opt.zero_grad()
    try:
        torch.nn.functional.cross_entropy(net(bad), y).backward()
        raise AssertionError("backward accepted a NaN")
    except Exception as e:  # DDP's reducer may wrap the hook's gradcomp.NonFiniteError
        assert "is not finite (rank 1 of" in str(e), str(e)
    for i, c in state.compressors.items():
        assert torch.equal(c.state_dict()["state"], before[i])


def nan_in_bucket_1(grads, rank, world):
    """Copies of the buckets' gradients with a NaN at bucket 1's entry 7 on the last rank,
    and the error every rank then raises for bucket 1."""
    bad = [g.clone() for g in grads]
    if rank == world - 1:
        bad[1][7] = float("nan")
    return bad, f"gradcomp: compress: grad[7] = nan is not finite (rank {world - 1} of {world})"


def outcomes_of(futures):
    """What each Future ends with: None, or the gradcomp.Error's type and text."""
    outcomes = []
    for f in futures:
        try:
            f.wait()
            outcomes.append(None)
        except gradcomp.Error as e:
            outcomes.append((type(e), str(e)))
    return outcomes


def check_buckets_in_flight(rank, world, device="cpu"):
    """Four buckets in flight at once, as DDP has them: each hook returns before its
    bucket's exchange completes (one late rank holds every exchange back), every bucket
    equals the NumPy reference aggregation, the steady state costs one collective per
    bucket (two where a message outgrows the bound the ranks agreed on), and a NaN in one
    bucket on one rank makes that bucket raise the same error on every rank while the
    step changes no bucket's memory."""
    sizes = [3001, 1000, 4003, 17]
    last = len(sizes) - 1
    state = ddp.State(method="topk_ef", density=0.01, start_iter=1)
    refs = [[reference.TopkErrorFeedback(n) for n in sizes] for _ in range(world)]

    def submit(step, grads):
        late = step % world  # every rank is on time in some steps
        if rank == late:
            time.sleep(0.5)
        futures = [ddp.hook(state, Bucket(grads[b].to(device, copy=True), b, b == last)) for b in range(len(sizes))]
        if rank != late:
            assert not any(f.done() for f in futures), "a hook waited for its bucket's exchange"
        return futures

    def want(step, b, density):
        n = sizes[b]
        if step < 1:
            return (sum(grad_of(r, step, n, b) for r in range(world)) / world).numpy()
        out = np.zeros(n, dtype=np.float32)
        for r in range(world):
            idx, values = refs[r][b].step(grad_of(r, step, n, b).numpy(), reference.k_for(density, n))
            out[idx] += np.float32(1.0 / world) * values
        return out

    density = 0.01
    for step in range(7):
        if step == 4:  # messages grow past the agreed bound: resent, padded to the longest
            density = 0.03
            state.set_density(density)
        grads = [grad_of(rank, step, n, b) for b, n in enumerate(sizes)]
        if step == 6:  # a NaN in bucket 1 on the last rank, with every bucket in flight
            memory = memory_of(state)
            bad, text = nan_in_bucket_1(grads, rank, world)
            # every bucket's exchange ends before this rank's next collective
            outcomes = outcomes_of(submit(step, bad))
            assert outcomes == [None, (gradcomp.NonFiniteError, text), None, None], outcomes
            texts = [None] * world
            dist.all_gather_object(texts, outcomes[1][1])
            assert all(t == text for t in texts), texts
            now = memory_of(state)
            assert all(torch.equal(now[i], memory[i]) for i in memory), "a failed step changed a bucket's memory"
        before = state.collectives
        got = [f.wait().cpu() for f in submit(step, grads)]
        for b in range(len(sizes)):
            expected = want(step, b, density)
            if step < 1:
                np.testing.assert_allclose(got[b].numpy(), expected, rtol=1e-5, atol=1e-6)
            else:
                np.testing.assert_array_equal(got[b].numpy(), expected)
            assert same_on_all_ranks(got[b])
        issued = state.collectives - before
        if step in (0, 1):  # dense: agreement and all-reduce; first compressed step: no bound yet
            assert issued == 2 * len(sizes), (step, issued)
        elif step == 4:
            assert len(sizes) < issued <= 2 * len(sizes), (step, issued)
        else:
            assert issued == len(sizes), (step, issued)


def check_sparse_allreduce(rank, world):
    """aggregation="sparse_allreduce" with three buckets in flight: every bucket equals
    Ok-Topk's reference (the global top-k of the summed messages) and this rank's
    residual equals its simulation, bit for bit; a NaN in one bucket on one rank raises
    the same error on every rank and the step changes no bucket's memory, as does a rank
    that fails before it has its exchange."""
    sizes, density = [3001, 1000, 17], 0.01
    last = len(sizes) - 1
    state = ddp.State(method="topk_ef", density=density, start_iter=1, aggregation="sparse_allreduce")
    refs = [reference.GlobalTopk(world, n) for n in sizes]
    collectives = 0  # what docs/communication.md says each bucket's step issues
    beyond = []  # what each step issued beyond that
    for step in range(6):
        grads = [grad_of(rank, step, n, b) for b, n in enumerate(sizes)]
        if step == 4:  # a NaN in bucket 1 on the last rank, with every bucket in flight
            memory = memory_of(state)
            bad, text = nan_in_bucket_1(grads, rank, world)
            outcomes = outcomes_of([ddp.hook(state, Bucket(bad[b], b, b == last)) for b in range(len(sizes))])
            assert outcomes == [None, (gradcomp.NonFiniteError, text), None], outcomes
            now = memory_of(state)
            assert all(torch.equal(now[i], memory[i]) for i in memory), "a failed step changed a bucket's memory"
        before = state.collectives
        futures = [ddp.hook(state, Bucket(grads[b].clone(), b, b == last)) for b in range(len(sizes))]
        got = [f.wait() for f in futures]
        for b, n in enumerate(sizes):
            if step < 1:
                want = (sum(grad_of(r, step, n, b) for r in range(world)) / world).numpy()
                np.testing.assert_allclose(got[b].numpy(), want, rtol=1e-5, atol=1e-6)
                continue
            k = reference.k_for(density, n)
            idx, sums = refs[b].step([grad_of(r, step, n, b).numpy() for r in range(world)], k, k)
            want = np.zeros(n, dtype=np.float32)
            want[idx] = np.float32(1.0 / world) * sums
            np.testing.assert_array_equal(got[b].numpy(), want)
            assert np.count_nonzero(got[b].numpy()) <= k
            assert same_on_all_ranks(got[b])
            np.testing.assert_array_equal(state.compressors[b].corrector_state(0).numpy(), refs[b].e[rank])
            # The exchange's eight; on a bucket's first step and the first after a refused
            # one (bucket 1 at step 4), the hook's agreement on the host, after which the
            # exchange, its sizes forgotten, runs three times: its blocks outgrow their
            # empty room, then its parts the empty gather (7, 1 + 7, 1 + 8).
            collectives += 25 if step == 1 or (step == 4 and b == 1) else 8
        if step >= 1:  # and an agreement and the eight again where blocks or parts outgrow their room
            issued = state.collectives - before
            assert collectives <= issued <= collectives + 9 * len(sizes), (step, issued, collectives)
            assert (issued - collectives) % 9 == 0, (step, issued, collectives)
            beyond.append(issued - collectives)
            collectives = 0
    if world == 2:  # these gradients' later steps need no growth on 2 ranks: eight per bucket, no more
        assert min(beyond[1:]) == 0, beyond
    # What this rank holds: each bucket's residual (4 bytes an element) as state; the
    # compressors' and the exchanges' workspace beside it.
    held = state.memory_bytes()
    assert held["state"] == 4 * sum(sizes), held
    assert held["workspace"] > sum(c.memory_bytes()["workspace"] for c in state.compressors.values()), held
    # A rank that fails before bucket 0's exchange (its compressor does not restore), its
    # exchange settled before: it tells its error in the exchange's first all-gather, and
    # every rank raises it with no memory changed.
    memory = memory_of(state)
    if rank == world - 1:
        record = state.compressors[0].state_dict()
        record = {**record, "state": record["state"].clone()}
        record["state"][len(record["state"]) // 2] ^= 0x10
        del state.compressors[0], state._exchanges[0]
        state._saved[0] = record
    grads = [grad_of(rank, 9, n, b) for b, n in enumerate(sizes)]
    outcomes = outcomes_of([ddp.hook(state, Bucket(grads[b], b, b == last)) for b in range(len(sizes))])
    text = f"gradcomp: load_state: the record's checksum does not match (rank {world - 1} of {world})"
    assert outcomes == [(gradcomp.CorruptMessageError, text), None, None], outcomes
    now = memory_of(state)
    assert all(torch.equal(now[i], memory[i]) for i in now), "a failed step changed a bucket's memory"
    # scalecom has an exchange of its own
    raises_alike(lambda: ddp.State(method="scalecom", aggregation="sparse_allreduce"), gradcomp.InvalidArgumentError,
                 "gradcomp: State: aggregation 'sparse_allreduce' does not apply to method 'scalecom' (its cyclic "
                 "exchange is its aggregation)")
    raises_alike(lambda: ddp.State(aggregation="ring"), gradcomp.InvalidArgumentError,
                 "gradcomp: State: aggregation must be 'allgather' or 'sparse_allreduce', got 'ring'")


def check_scalecom_buckets_in_flight(rank, world):
    """ScaleCom's exchange (its frames, a broadcast, a reduce and a broadcast per bucket,
    read at the step's end) with four buckets in flight: each bucket equals its
    simulation, and a NaN in bucket 1 on one rank, or a rank without bucket 2's exchange,
    raises the same error on every rank while the step changes no bucket's memory (the
    buckets before it included) nor the next step's leader."""
    sizes, density, beta = [2001, 500, 3001, 40], 0.01, 0.5
    state = ddp.State(method="scalecom", density=density, beta=beta, start_iter=0)
    m = [[np.zeros(n, dtype=np.float32) for n in sizes] for _ in range(world)]

    def submit(grads):
        return [ddp.hook(state, Bucket(grads[b], b, b == len(sizes) - 1)) for b in range(len(sizes))]

    for step in range(4):
        if rank == step % world:
            time.sleep(0.3)
        grads = [grad_of(rank, step, n, b) for b, n in enumerate(sizes)]
        if step == 2:
            memory = memory_of(state)
            bad, text = nan_in_bucket_1(grads, rank, world)
            outcomes = outcomes_of(submit(bad))
            text = text.replace("compress:", "preview:")
            assert outcomes == [None, (gradcomp.NonFiniteError, text), None, None], outcomes
            now = memory_of(state)
            assert all(torch.equal(now[i], memory[i]) for i in memory), "a failed step changed a bucket's memory"
        futures = submit(grads)
        for b, n in enumerate(sizes):
            acc = [(m[r][b] + grad_of(r, step, n, b).numpy()).astype(np.float32) for r in range(world)]
            idx = reference.top_k(acc[step % world], reference.k_for(density, n))
            want = np.zeros(n, dtype=np.float64)
            for r in range(world):
                want[idx] += acc[r][idx].astype(np.float64) / world
                sent = np.zeros(n, dtype=np.float32)
                sent[idx] = acc[r][idx]
                m[r][b] = ((1 - beta) * m[r][b] + beta * (acc[r] - sent)).astype(np.float32)
            np.testing.assert_allclose(futures[b].wait().numpy(), want, rtol=1e-5, atol=1e-7)
    # Once each bucket's exchange has settled, its step is its frames' all-gather (which
    # carries the hook's settings), the broadcast, the reduce and the broadcast: the host
    # agreement of a bucket's first step is gone.
    assert state.stats()["collectives"] == 4 * len(sizes), state.stats()
    held = state.memory_bytes()  # the filtered memories, and beside them the leader's compressors' workspace
    assert held["state"] == 4 * sum(sizes) and held["total"] == held["state"] + held["workspace"], held
    assert held["workspace"] > sum(c.memory_bytes()["workspace"] for c in state.compressors.values()), held

    # A rank that fails before bucket 2's exchange (its compressor does not restore), its
    # exchange settled before: it takes part in the others' collectives, every rank
    # raises its error, and no memory changes.
    memory = memory_of(state)
    steps = {i: c.step for i, c in state.compressors.items()}
    good = state.compressors[2].state_dict()
    if rank == world - 1:
        record = {**good, "state": good["state"].clone()}
        record["state"][len(record["state"]) // 2] ^= 0x10
        del state.compressors[2], state._exchanges[2]
        state._saved[2] = record
    outcomes = outcomes_of(submit([grad_of(rank, 9, n, b) for b, n in enumerate(sizes)]))
    text = f"gradcomp: load_state: the record's checksum does not match (rank {world - 1} of {world})"
    assert outcomes == [None, None, (gradcomp.CorruptMessageError, text), None], outcomes
    now = memory_of(state)
    assert all(torch.equal(now[i], memory[i]) for i in now), "a failed step changed a bucket's memory"
    # The record fixed: that rank's exchange is new, the others' are not; after the
    # refused step the ranks agree on the host again and run at the sizes they agree.
    if rank == world - 1:
        state._saved[2] = good
    results = [f.wait() for f in submit([grad_of(rank, 9, n, b) for b, n in enumerate(sizes)])]
    assert all(same_on_all_ranks(r) for r in results)
    assert {i: c.step for i, c in state.compressors.items()} == {i: s + 1 for i, s in steps.items()}


def check_cuda_buckets(rank, world):
    """The hook on CUDA buckets (gloo moves the bytes through host memory) gives what it
    gives on CPU buckets, bit for bit: all-gather methods, ScaleCom, and the global top-k
    (its local work on the host, message, sums and residual filter crossing the bus)."""
    n = 30011
    for method, options in (("topk_ef", {"density": 0.01}), ("dgc", {"density": 0.01, "max_norm": 5.0}),
                            ("scalecom", {"density": 0.01, "beta": 0.5}),
                            ("topk_ef", {"density": 0.01, "aggregation": "sparse_allreduce"}),
                            ("dgc", {"density": 0.01, "max_norm": 5.0, "aggregation": "sparse_allreduce"})):
        on_gpu = ddp.State(method=method, start_iter=1, **options)
        on_cpu = ddp.State(method=method, start_iter=1, **options)
        for step in range(4):
            g = grad_of(rank, step, n)
            got = ddp.hook(on_gpu, Bucket(g.clone().cuda())).wait()
            want = ddp.hook(on_cpu, Bucket(g.clone())).wait()
            assert got.device.type == "cuda"
            assert torch.equal(got.cpu(), want), (method, options, step, (got.cpu() - want).abs().max())


def raises_alike(call, error, text, within=False):
    """``call()`` raises ``error`` with the text ``text`` (``within`` a longer one: DDP's
    backward wraps the hook's error) on this rank, and every rank's text is the same."""
    try:
        call()
    except error as e:
        got = str(e)
    else:
        raise AssertionError(f"no {error.__name__} was raised (expected {text!r})")
    assert text in got if within else got == text, got
    texts = [None] * dist.get_world_size()
    dist.all_gather_object(texts, got)
    assert all(t == got for t in texts), texts


def memory_of(state):
    return {i: c.state_dict()["state"].clone() for i, c in state.compressors.items()}


def check_disagreeing_ranks(rank, world):
    """Ranks configured differently, or a rank that fails before the exchange, make every
    rank raise the same error naming what differs (or the rank where it started), with no
    memory changed and no rank left waiting; the hook goes on after."""
    n = 1000
    last = world - 1

    def two_states(mine, others, steps=1, start_iter=0):
        options = mine if rank == last else others
        state = ddp.State(start_iter=start_iter, **options)
        for step in range(steps):
            run_hook(state, rank, step, n)
        return state

    cases = [
        ({"density": 0.3}, {"density": 0.1}, "option density", "0.1", "0.3"),
        ({"method": "dgc", "momentum": 0.5}, {"method": "dgc", "momentum": 0.9}, "option momentum", "0.9", "0.5"),
        ({"method": "scalecom"}, {"method": "topk_ef"}, "the method", "topk_ef", "scalecom"),
        ({"method": "topk_ef"}, {"method": "scalecom"}, "the method", "scalecom", "topk_ef"),
    ]
    for mine, others, name, first, theirs in cases:
        state = ddp.State(start_iter=0, **(mine if rank == last else others))
        raises_alike(lambda state=state: run_hook(state, rank, 0, n), gradcomp.InvalidArgumentError,
                     f"gradcomp: ddp hook: ranks disagree on {name}: rank 0 has {first}, rank {last} has {theirs}")
        assert state.compressors == {} or all(c.step == 0 for c in state.compressors.values())

    # set_density on one rank only, after steps: refused, nothing changes; then all agree again.
    state = two_states({"density": 0.05}, {"density": 0.05}, steps=2)
    if rank == last:
        state.set_density(0.02)
    before = memory_of(state)
    raises_alike(lambda: run_hook(state, rank, 2, n), gradcomp.InvalidArgumentError,
                 f"gradcomp: ddp hook: ranks disagree on option density: rank 0 has 0.05, rank {last} has 0.02")
    assert all(torch.equal(memory_of(state)[i], before[i]) for i in before)
    state.set_density(0.02)
    run_hook(state, rank, 2, n)

    # start_iter: one rank would all-reduce densely, another compress (at iteration 1):
    # the dense steps agree too, so the first step already tells.
    state = ddp.State(density=0.05, start_iter=1 if rank == 0 else 2)
    raises_alike(lambda: run_hook(state, rank, 0, n), gradcomp.InvalidArgumentError,
                 "gradcomp: ddp hook: ranks disagree on start_iter: rank 0 has 1, rank 1 has 2")

    # Buckets of other sizes, before any compressor exists.
    state = ddp.State(density=0.05, start_iter=0)
    size = n + 1 if rank == 0 else n
    raises_alike(lambda: ddp.hook(state, Bucket(grad_of(rank, 0, size))).wait(), gradcomp.InvalidArgumentError,
                 f"gradcomp: ddp hook: ranks disagree on the bucket's elements: rank 0 has {n + 1}, rank 1 has {n}")

    # A rank whose checkpoint does not restore fails before the exchange: every rank hears of it.
    state = two_states({"density": 0.05}, {"density": 0.05}, steps=2)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    restored = torch.load(buffer)
    if rank == last:
        record = restored._saved[0]["state"]
        record[len(record) // 2] ^= 0x10
    raises_alike(lambda: run_hook(restored, rank, 2, n), gradcomp.CorruptMessageError,
                 f"gradcomp: load_state: the record's checksum does not match (rank {last} of {world})")
    if rank == last:  # no compressor made, the record kept
        assert restored.compressors == {} and 0 in restored._saved
    else:  # restored, the step not taken
        assert restored.compressors[0].step == 2

    # ScaleCom: a NaN on one rank, after the cyclic exchange's first steps.
    state = ddp.State(method="scalecom", density=0.01, start_iter=0)
    run_hook(state, rank, 0, n)
    bad = grad_of(rank, 1, n)
    if rank == 0:
        bad[5] = float("nan")
    before = memory_of(state)
    raises_alike(lambda: ddp.hook(state, Bucket(bad)).wait(), gradcomp.NonFiniteError,
                 f"gradcomp: preview: grad[5] = nan is not finite (rank 0 of {world})")
    assert all(torch.equal(memory_of(state)[i], before[i]) for i in before)


def simulated_mean(compressors, step, n):
    """The hook's aggregate written out: every rank's message, in rank order, scaled by 1/W."""
    want = torch.zeros(n)
    for r, c in enumerate(compressors):
        accumulate(c.compress(grad_of(r, step, n)), want, 1.0 / len(compressors))
    return want


def check_every_method(rank, world):
    """Every method runs from DDP (adacomp and threshold_ef have no density) and its
    aggregate is every rank's message, added in rank order. DGC's clipping shares
    max_norm among the group's ranks unless ``workers`` is given."""
    n = 2001
    for method, options, workers in (("adacomp", {}, None), ("threshold_ef", {"tau": 1.0}, None),
                                     ("randomk_ef", {"density": 0.02}, None),
                                     ("dgc", {"density": 0.02, "max_norm": 5.0}, world),
                                     ("dgc", {"density": 0.02, "max_norm": 5.0, "workers": 1}, 1)):
        state = ddp.State(method=method, start_iter=0, **options)
        local = [Compressor(n, method, **{**options, **({} if workers is None else {"workers": workers})})
                 for _ in range(world)]
        for step in range(3):
            assert torch.equal(run_hook(state, rank, step, n), simulated_mean(local, step, n)), (method, step)


def check_schedules(rank, world):
    """set_density reaches every bucket, ScaleCom's included, and survives a resume."""
    n = 4001
    # ScaleCom: the leader's k follows the schedule.
    state = ddp.State(method="scalecom", density=0.01, start_iter=0)
    for step in range(2):
        got = run_hook(state, rank, step, n)
        assert np.count_nonzero(got.numpy()) <= reference.k_for(0.01, n)
    state.set_density(0.03)
    got = run_hook(state, rank, 2, n)
    assert reference.k_for(0.01, n) < np.count_nonzero(got.numpy()) <= reference.k_for(0.03, n)
    assert state.compressors[0].density == 0.03

    # A resumed State takes a density set after loading, not the checkpoint's.
    state = ddp.State(method="topk_ef", density=0.05, start_iter=0)
    run_hook(state, rank, 0, n)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    restored = torch.load(buffer)
    restored.set_density(0.01)
    got = run_hook(restored, rank, 1, n)
    assert restored.compressors[0].density == 0.01
    assert np.count_nonzero(got.numpy()) <= world * reference.k_for(0.01, n)


def check_stats(rank, world):
    """State.stats(): the last step's and every step's figures, against what the steps
    must have moved: each bucket's k entries, its elements, one all-gather of equal frames
    per bucket in the steady state (each rank receives the others' frames), and a dense
    ring all-reduce's 2 (W - 1) / W of the bucket's bytes for the ratio."""
    sizes, density = [3001, 1000], 0.01
    state = ddp.State(method="topk_ef", density=density, start_iter=1)
    assert state.stats()["steps"] == 0 and state.stats()["density"] == 0.0
    for step in range(4):
        run_step(state, rank, step, sizes)
        last = state.stats()
        assert last["steps"] == 1 and last["buckets"] == len(sizes) and last["elements"] == sum(sizes)
        assert last["dense_allreduce_bytes"] == sum(2 * (world - 1) * 4 * n // world for n in sizes)
        if step == 0:  # dense: every element, an agreement and an all-reduce per bucket
            assert last["compressed_buckets"] == 0 and last["entries_sent"] == sum(sizes)
            assert last["collectives"] == 2 * len(sizes)
            continue
        assert last["compressed_buckets"] == len(sizes)
        assert last["entries_sent"] == sum(reference.k_for(density, n) for n in sizes), last
        assert last["density"] == last["entries_sent"] / last["elements"]
        assert last["ratio"] == last["dense_allreduce_bytes"] / last["bytes_sent"] > 1
        assert last["compress_seconds"] > 0 and last["exchange_seconds"] > 0
        if step >= 2:  # the steady state: one all-gather of equal frames per bucket
            assert last["collectives"] == len(sizes)
            assert last["bytes_received"] == (world - 1) * last["bytes_sent"], last
    total = state.stats(total=True)
    assert total["steps"] == 4 and total["buckets"] == 4 * len(sizes) and total["refused_buckets"] == 0
    assert total["bytes_sent"] == state.bytes_sent and total["collectives"] == state.collectives
    # A refused step counts its buckets as refused.
    bad = grad_of(rank, 9, sizes[0])
    bad[0] = float("nan")
    outcomes_of([ddp.hook(state, Bucket(bad, 0, False)), ddp.hook(state, Bucket(grad_of(rank, 9, sizes[1]), 1, True))])
    assert state.stats()["refused_buckets"] == 1 and state.stats(total=True)["refused_buckets"] == 1


SCENARIOS = {
    "stats": check_stats,
    "disagree": check_disagreeing_ranks,
    "in-flight": check_buckets_in_flight,
    "scalecom-in-flight": check_scalecom_buckets_in_flight,
    "methods": check_every_method,
    "schedules": check_schedules,
    "cuda": check_cuda_buckets,
    "cuda-in-flight": lambda rank, world: check_buckets_in_flight(rank, world, "cuda"),
    "cuda-nan": lambda rank, world: check_nan_on_one_rank(rank, world, "cuda"),
    "topk": lambda rank, world: check_topk_against_reference(rank, world, 0.01),
    "allreduce": lambda rank, world: check_topk_against_reference(rank, world, 1.0),
    "nan": check_nan_on_one_rank,
    "sparse": check_sparse_allreduce,
    "scalecom": check_scalecom_against_simulation,
    "checkpoint": check_checkpoint_and_bucket_errors,
    "16-bit": check_16_bit_buckets,
    "training": check_real_ddp_training,
}

