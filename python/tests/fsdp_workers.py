"""What each rank of the FSDP2 tests runs (a spawned process; see test_fsdp.py). Needs torch 2.x."""

import numpy as np
import torch
import torch.distributed as dist

import gradcomp
from gradcomp.torch import fsdp

import reference


def grad_of(rank, step, n):
    g = torch.Generator().manual_seed(7000 * rank + step)
    return torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g))


def reference_step(e, step, n, k, world, stored=None):
    """One step of every rank's top-k with error feedback (residuals ``e``, updated;
    with ``stored`` = (bits, block), each then stored in blocks as a compact memory
    stores it): the sums, in rank order, of what the ranks sent."""
    sums = np.zeros(n, dtype=np.float32)
    seen = np.zeros(n, dtype=bool)
    for r in range(world):
        e[r] = (e[r] + grad_of(r, step, n).numpy()).astype(np.float32)
        for i in reference.top_k(e[r], k):
            sums[i] = np.float32(sums[i] + e[r][i]) if seen[i] else e[r][i]
            seen[i] = True
            e[r][i] = 0.0
        if stored is not None:
            e[r] = reference.stored_in_blocks(e[r], *stored)
    return sums


def check_reduce_scatter_against_reference(rank, world):
    """ReduceScatter as FSDP calls it: each rank's shard equals the reference (the sum,
    in rank order, of the entries the ranks' top-k with error feedback sent into that
    shard, divided by W for AVG) and its residual equals its simulation, bit for bit; a
    NaN on one rank raises the same error on every rank and changes nothing."""
    shard_n, density = 1501, 0.02
    n = shard_n * world
    k = reference.k_for(density, n)
    rs = fsdp.ReduceScatter(method="topk_ef", density=density)
    e = [np.zeros(n, dtype=np.float32) for _ in range(world)]
    group = dist.group.WORLD
    for step in range(4):
        sums = reference_step(e, step, n, k, world)
        # AVG, SUM, and PREMUL_SUM (set_gradient_divide_factor), the last through async_op.
        op, factor = [(dist.ReduceOp.AVG, 1.0 / world), (dist.ReduceOp.SUM, 1.0),
                      (dist.ReduceOp.PREMUL_SUM(0.125), 0.125),
                      (dist.ReduceOp.PREMUL_SUM(torch.tensor([0.375])), 0.375)][step]
        out = torch.full((shard_n,), 7.0)
        work = rs(out, grad_of(rank, step, n), group, op, async_op=step == 3)
        if step == 3:
            assert work.is_completed() and work.wait()
        else:
            assert work is None
        mine = sums[rank * shard_n:(rank + 1) * shard_n]
        np.testing.assert_array_equal(out.numpy(), np.float32(factor) * mine)
        np.testing.assert_array_equal(rs.compressor.corrector_state(0).numpy(), e[rank])
    # Three collectives a call (the frames' all-gather, the blocks' all-to-all, the records' all-gather),
    # and one more agreement where a rank grows its room for what it receives.
    assert rs.bytes_sent > 0 and 4 * 3 <= rs.collectives <= 4 * 4
    stats = rs.stats()
    assert stats["calls"] == 4 and stats["elements"] == n and stats["entries_sent"] == k, stats
    assert stats["density"] == k / n and stats["bytes_received"] > 0 and stats["bytes_sent"] == rs.bytes_sent
    memory = rs.state_dict()["compressor"]["state"].clone()
    bad = grad_of(rank, 9, n)
    if rank == world - 1:
        bad[5] = float("nan")
    out = torch.full((shard_n,), 7.0)
    try:
        rs(out, bad, group, dist.ReduceOp.AVG)
        raise AssertionError("a NaN was accepted")
    except gradcomp.NonFiniteError as error:
        text = str(error)
    assert text == f"gradcomp: compress: grad[5] = nan is not finite (rank {world - 1} of {world})", text
    texts = [None] * world
    dist.all_gather_object(texts, text)
    assert all(t == text for t in texts), texts
    assert torch.equal(out, torch.full((shard_n,), 7.0))
    assert torch.equal(rs.state_dict()["compressor"]["state"], memory)
    # A reduce op FSDP does not use: the same error on every rank, nothing changed.
    expect_error(lambda: rs(out, grad_of(rank, 9, n), group, dist.ReduceOp.MAX), gradcomp.InvalidArgumentError,
                 "gradcomp: fsdp ReduceScatter: reduce op")
    assert torch.equal(out, torch.full((shard_n,), 7.0))
    assert torch.equal(rs.state_dict()["compressor"]["state"], memory)


def expect_error(call, kind, start):
    """Runs ``call``, which must raise ``kind`` with a text that starts with ``start`` and
    is the same on every rank."""
    try:
        call()
    except kind as error:
        text = str(error)
    else:
        raise AssertionError(f"no {kind.__name__}")
    assert text.startswith(start), text
    texts = [None] * dist.get_world_size()
    dist.all_gather_object(texts, text)
    assert all(t == text for t in texts), texts
    return text


def check_16_bit_gradients(rank, world):
    """bfloat16 and float16 gradients (FSDP's reduce_dtype) are read as they are: the
    shards and residuals equal those of the same values in float32, bit for bit (each
    16-bit value is widened exactly as it is read), a 16-bit output holds the float32
    shard rounded once, and no float32 copy of the gradient is made: an instance that
    keeps its workspace holds after 16-bit calls exactly what one fed float32 holds
    (with float32 and with 8-bit memory, and DGC's momentum)."""
    shard_n = 777
    n = shard_n * world
    group = dist.group.WORLD
    for dtype in (torch.bfloat16, torch.float16):
        for method, options in (("topk_ef", {}), ("topk_ef", {"memory_bits": 8}), ("dgc", {})):
            wide = fsdp.ReduceScatter(method=method, density=0.03, keep_workspace=True, **options)
            narrow = fsdp.ReduceScatter(method=method, density=0.03, keep_workspace=True, **options)
            for step in range(3):
                g = grad_of(rank, step, n).to(dtype)
                want = torch.empty(shard_n)
                wide(want, g.float(), group, dist.ReduceOp.AVG)
                got = torch.empty(shard_n, dtype=dtype)
                narrow(got, g, group, dist.ReduceOp.AVG)
                assert torch.equal(got, want.to(dtype)), (dtype, method, options)
                for a in range(2 if method == "dgc" else 1):
                    assert torch.equal(narrow.compressor.corrector_state(a), wide.compressor.corrector_state(a))
                assert narrow.memory_bytes() == wide.memory_bytes(), (dtype, method, narrow.memory_bytes(),
                                                                      wide.memory_bytes())


def check_one_instance_per_group(rank, world):
    """An instance serves one parameter group: another size is refused on every rank with
    nothing changed. Its state_dict is meaningful before the first call, and restoring
    one mid-training (into a new instance, as a resumed job does) continues bit for bit;
    another method's state is refused."""
    shard_n = 300
    n = shard_n * world
    group = dist.group.WORLD
    rs = fsdp.ReduceScatter(method="topk_ef", density=0.05)
    fresh = rs.state_dict()
    assert fresh["compressor"] is None and fresh["calls"] == 0 and fresh["method"] == "topk_ef", fresh
    out = torch.empty(shard_n)
    rs(out, grad_of(rank, 0, n), group, dist.ReduceOp.AVG)
    memory = rs.compressor.corrector_state(0).clone()
    other = torch.full((shard_n + 1,), 3.0)
    expect_error(lambda: rs(other, grad_of(rank, 1, n + world), group, dist.ReduceOp.AVG),
                 gradcomp.InvalidArgumentError,
                 f"gradcomp: fsdp ReduceScatter: this instance compresses a parameter group of {n} elements and was "
                 f"called with {n + world}")
    assert torch.equal(other, torch.full((shard_n + 1,), 3.0))
    assert torch.equal(rs.compressor.corrector_state(0), memory)

    resumed = fsdp.ReduceScatter(method="topk_ef", density=0.05)
    resumed.load_state_dict(fresh)  # before anyone's first call: nothing to restore yet
    assert resumed.state_dict() == fresh
    resumed.load_state_dict(rs.state_dict())  # restored at its first call
    assert resumed.state_dict()["calls"] == 1
    for step in range(1, 4):
        a, b = torch.empty(shard_n), torch.empty(shard_n)
        rs(a, grad_of(rank, step, n), group, dist.ReduceOp.AVG)
        resumed(b, grad_of(rank, step, n), group, dist.ReduceOp.AVG)
        assert torch.equal(a, b)
    assert torch.equal(rs.compressor.corrector_state(0), resumed.compressor.corrector_state(0))
    expect_error(lambda: fsdp.ReduceScatter(method="dgc", density=0.05).load_state_dict(rs.state_dict()),
                 gradcomp.InvalidArgumentError, "gradcomp: fsdp ReduceScatter: load_state_dict: the state's method")


def check_set_density(rank, world):
    """set_density (DGC's warm-up under FSDP): before the first call it is the density the
    compressor is made with, after it the next call's; each step's shard and residual
    equal the reference top-k at that step's density, bit for bit. A bad density raises
    on the spot with nothing changed; a state saved mid-warm-up restores its density into
    an instance made with another, and continues bit for bit."""
    shard_n = 500
    n = shard_n * world
    group = dist.group.WORLD
    rs = fsdp.ReduceScatter(method="topk_ef", density=0.05)
    rs.set_density(0.02)
    e = [np.zeros(n, dtype=np.float32) for _ in range(world)]
    for step, density in enumerate((0.02, 0.1, 0.1)):
        if step == 1:
            rs.set_density(density)
        sums = reference_step(e, step, n, reference.k_for(density, n), world)
        out = torch.empty(shard_n)
        rs(out, grad_of(rank, step, n), group, dist.ReduceOp.SUM)
        np.testing.assert_array_equal(out.numpy(), sums[rank * shard_n:(rank + 1) * shard_n])
        np.testing.assert_array_equal(rs.compressor.corrector_state(0).numpy(), e[rank])
        assert rs.stats()["entries_sent"] == reference.k_for(density, n)
    for bad in (0.0, 1.5, float("nan")):
        try:
            rs.set_density(bad)
            raise AssertionError(f"density {bad} was accepted")
        except gradcomp.InvalidArgumentError as error:
            assert "density" in str(error), str(error)
    assert rs.compressor.density == 0.1 and rs.options["density"] == 0.1
    resumed = fsdp.ReduceScatter(method="topk_ef", density=0.05)
    resumed.load_state_dict(rs.state_dict())
    assert resumed.options["density"] == 0.1
    for step in range(3, 5):
        a, b = torch.empty(shard_n), torch.empty(shard_n)
        rs(a, grad_of(rank, step, n), group, dist.ReduceOp.SUM)
        resumed(b, grad_of(rank, step, n), group, dist.ReduceOp.SUM)
        assert torch.equal(a, b) and resumed.compressor.density == 0.1
    later = fsdp.ReduceScatter(method="topk_ef", density=0.05)
    later.load_state_dict(rs.state_dict())
    later.set_density(0.04)  # after loading: wins over the checkpoint's
    out = torch.empty(shard_n)
    later(out, grad_of(rank, 5, n), group, dist.ReduceOp.SUM)
    assert later.stats()["entries_sent"] == reference.k_for(0.04, n)


def in_one_backward(body):
    """Runs ``body()`` from a tensor hook, inside a backward pass (as FSDP calls its
    reduce-scatters), and returns once the backward pass ended."""
    def hook(grad):
        body()  # the hook returns None: the gradient stays as it is

    x = torch.zeros(1, requires_grad=True)
    y = x * 2.0
    y.register_hook(hook)
    y.sum().backward()


def in_raising_backward(body):
    """Runs ``body()`` from a tensor hook of a backward pass that then raises (a later
    hook's error), so that the pass never reaches its end; checks that it raised."""
    def call_then_raise():
        body()
        raise RuntimeError("a later hook failed")

    try:
        in_one_backward(call_then_raise)
        raise AssertionError("the backward pass did not raise")
    except RuntimeError as error:
        assert "a later hook failed" in str(error), error


def in_nested_backward(outer, inner):
    """Runs ``outer()`` from a hook of a backward pass, then ``inner()`` from a hook of a
    backward pass nested in it (a reentrant checkpoint's recomputation), and returns once
    both ended."""
    def recomputed(t):
        u = t * 3.0
        if u.requires_grad:  # the recomputation, in the outer backward pass
            u.register_hook(lambda g: inner() and None)
        return u

    x = torch.zeros(1, requires_grad=True)
    z = torch.utils.checkpoint.checkpoint(recomputed, x * 2.0, use_reentrant=True) * 5.0
    z.register_hook(lambda g: outer() and None)
    z.sum().backward()


def check_settled_by_step(rank, world):
    """settle="step": calls in a backward pass write their shards before anything is
    read and commit at its end. Against the reference: after a first call (settled at
    once, agreeing the blocks' room), a rank's block for a shard carries the first
    `room` of its entries (ascending), only those are committed and the rest stay in its
    residual, and the room grows (the density triples at step 2, so that the shards
    outgrow their blocks). A NaN on one rank zeros every shard of that backward pass and
    raises the same error on every rank from backward(), the residuals unchanged; the
    calls then go on. A call outside a backward pass settles at once."""
    shard_n = 1301
    n = shard_n * world
    group = dist.group.WORLD
    rs = fsdp.ReduceScatter(method="topk_ef", density=0.01, settle="step")
    twin = fsdp.ReduceScatter(method="topk_ef", density=0.01, settle="step")  # a second group in the same passes
    e = [np.zeros(n, dtype=np.float32) for _ in range(world)]
    roomy = lambda need: need + need // 8 + 16  # noqa: E731
    room, carried_part = None, False

    def expected(step, density, cap):
        """The shard of a step at `density` with blocks of `cap` entries (None: all), and
        the most entries a rank had for a shard; `e` updated."""
        nonlocal carried_part
        k = reference.k_for(density, n)
        sums, seen, largest = np.zeros(n, dtype=np.float32), np.zeros(n, dtype=bool), 0
        for r in range(world):
            e[r] = (e[r] + grad_of(r, step, n).numpy()).astype(np.float32)
            counts = [0] * world
            for i in reference.top_k(e[r], k):
                j = i // shard_n
                counts[j] += 1
                largest = max(largest, counts[j])
                if cap is not None and counts[j] > cap:
                    carried_part = True
                    continue
                sums[i] = np.float32(sums[i] + e[r][i]) if seen[i] else e[r][i]
                seen[i] = True
                e[r][i] = 0.0
        return np.float32(1.0 / world) * sums[rank * shard_n:(rank + 1) * shard_n], largest

    for step in range(5):
        density = 0.01 if step < 2 else 0.03
        rs.set_density(density)
        twin.set_density(density)
        want, largest = expected(step, density, room)
        out = torch.full((shard_n,), 7.0)
        committed = rs.compressor.step if rs.compressor is not None else 0

        def call(out=out, step=step, want=want, committed=committed):  # run in this iteration's backward
            rs(out, grad_of(rank, step, n), group, dist.ReduceOp.AVG)
            twin(torch.empty(shard_n), grad_of(rank, step, n), group, dist.ReduceOp.AVG)
            if step > 0:  # written, not yet committed
                np.testing.assert_array_equal(out.numpy(), want)
                assert rs.compressor.step == committed and twin.compressor.step == committed

        in_one_backward(call)
        np.testing.assert_array_equal(out.numpy(), want)
        np.testing.assert_array_equal(rs.compressor.corrector_state(0).numpy(), e[rank])
        assert rs.compressor.step == committed + 1
        room = roomy(largest) if room is None or largest > room or roomy(largest) < room // 2 else room
    assert carried_part
    assert torch.equal(rs.compressor.corrector_state(0), twin.compressor.corrector_state(0))

    # A NaN on the last rank: zeros in the shards, the same error on every rank from
    # backward(), nothing committed; then the calls go on.
    memory = rs.compressor.corrector_state(0).clone()
    bad = grad_of(rank, 9, n)
    if rank == world - 1:
        bad[5] = float("nan")
    out = torch.full((shard_n,), 7.0)
    expect_error(lambda: in_one_backward(lambda: rs(out, bad, group, dist.ReduceOp.AVG)), gradcomp.NonFiniteError,
                 f"gradcomp: compress: grad (or its error feedback) holds a NaN or infinity (rank {world - 1} of "
                 f"{world})")
    assert torch.equal(out, torch.zeros(shard_n))
    assert torch.equal(rs.compressor.corrector_state(0), memory)
    # A backward pass that raises after a call was queued never reaches its end: the
    # call's step is dropped when the instance is called again, nothing committed.
    in_raising_backward(lambda: rs(torch.empty(shard_n), grad_of(rank, 8, n), group, dist.ReduceOp.AVG))
    assert torch.equal(rs.compressor.corrector_state(0), memory)
    # A backward pass nested in another (a reentrant checkpoint's recomputation): the
    # inner pass's call settles at the inner end, the outer's at the outer end.
    want, largest = expected(5, 0.03, room)
    out, inner_out = torch.empty(shard_n), torch.empty(shard_n)

    in_nested_backward(lambda: rs(out, grad_of(rank, 5, n), group, dist.ReduceOp.AVG),
                       lambda: twin(inner_out, grad_of(rank, 5, n), group, dist.ReduceOp.AVG))
    for instance, shard in ((rs, out), (twin, inner_out)):
        np.testing.assert_array_equal(shard.numpy(), want)
        np.testing.assert_array_equal(instance.compressor.corrector_state(0).numpy(), e[rank])
    room = roomy(largest) if largest > room or roomy(largest) < room // 2 else room
    # A nested pass that calls an instance the outer pass queued: the outer pass's step
    # settles then (it is still running), the nested one's at the nested end.
    outer_want, largest = expected(10, 0.03, room)
    room = roomy(largest) if largest > room or roomy(largest) < room // 2 else room
    inner_want, _ = expected(11, 0.03, room)
    in_nested_backward(lambda: rs(out, grad_of(rank, 10, n), group, dist.ReduceOp.AVG),
                       lambda: rs(inner_out, grad_of(rank, 11, n), group, dist.ReduceOp.AVG))
    np.testing.assert_array_equal(out.numpy(), outer_want)
    np.testing.assert_array_equal(inner_out.numpy(), inner_want)
    np.testing.assert_array_equal(rs.compressor.corrector_state(0).numpy(), e[rank])
    # Outside a backward pass a call settles before it returns (running again where a
    # block is outgrown).
    want, _ = expected(12, 0.03, None)
    rs(out, grad_of(rank, 12, n), group, dist.ReduceOp.AVG)
    np.testing.assert_array_equal(out.numpy(), want)
    np.testing.assert_array_equal(rs.compressor.corrector_state(0).numpy(), e[rank])
    expect_error(lambda: fsdp.ReduceScatter(settle="later"), gradcomp.InvalidArgumentError,
                 "gradcomp: fsdp ReduceScatter: settle must be 'step', 'call' or None, got 'later'")
    expect_error(lambda: fsdp.ReduceScatter(settle=5), gradcomp.InvalidArgumentError,
                 "gradcomp: fsdp ReduceScatter: settle must be a str, got an int")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(32, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 4)])

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = torch.relu(x)
        return x


def batch_of(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(16, 32, generator=g)
    return x, (x[:, :4].sum(dim=1) > 0).long() + 2 * (x[:, 4:8].sum(dim=1) > 0).long()


def sharded(make_reduce_scatter, divide_factor=None, **shard_options):
    """The model under fully_shard (each layer, then the root, with ``shard_options``),
    every FSDPModule's reduce-scatter made by ``make_reduce_scatter()``."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    torch.manual_seed(0)
    model = Net()
    for layer in model.layers:
        fully_shard(layer, **shard_options)
    fully_shard(model, **shard_options)
    scatters = []
    for module in model.modules():
        if isinstance(module, FSDPModule):
            scatters.append(make_reduce_scatter())
            module.set_custom_reduce_scatter(scatters[-1])
            if divide_factor is not None:
                module.set_gradient_divide_factor(divide_factor)
    return model, scatters


def full_parameters(model):
    return torch.cat([p.full_tensor().reshape(-1) for p in model.parameters()])


def follows_single_process_sgd(model, rank, world, steps, divisor, single=None, before_step=None, **tolerance):
    """Trains ``model`` (sharded) ``steps`` SGD steps on each rank's batches and checks,
    after each, that its parameters equal single-process SGD of ``single`` (a Net by
    default) on the sum over ranks of the loss gradients divided by ``divisor`` (the mean
    for ``divisor`` = W); ``before_step(step, model, single)`` runs before each. Returns
    the number of layers of a Net."""
    torch.manual_seed(0)
    single = Net() if single is None else single
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    single_opt = torch.optim.SGD(single.parameters(), lr=0.1)
    for step in range(steps):
        if before_step is not None:
            before_step(step, model, single)
        x, y = batch_of(rank, step)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        single_opt.zero_grad()
        for r in range(world):
            xr, yr = batch_of(r, step)
            (torch.nn.functional.cross_entropy(single(xr), yr) / divisor).backward()
        single_opt.step()
        want = torch.cat([p.detach().reshape(-1) for p in single.parameters()])
        torch.testing.assert_close(full_parameters(model).detach(), want, **tolerance)
    return len(getattr(single, "layers", ()))


def loss_falls(model, rank, steps):
    """``steps`` SGD steps over 8 batches in turn: the mean loss of the last 8 is under
    0.85 of the first 8's."""
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for step in range(steps):
        x, y = batch_of(rank, step % 8)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert np.mean(losses[-8:]) < 0.85 * np.mean(losses[:8]), losses


def check_fully_shard_training(rank, world):
    """FSDP2 training with gradcomp's reduce-scatter. At density 1 every entry is sent:
    the parameters follow single-process SGD on the mean gradient (to float rounding).
    At density 0.05 the loss falls and each rank sends a fraction of the dense bytes."""
    model, scatters = sharded(lambda: fsdp.ReduceScatter(method="topk_ef", density=1.0))
    layers = follows_single_process_sgd(model, rank, world, 5, world, rtol=1e-5, atol=1e-6)
    # Each layer's group went through its ReduceScatter (the root holds no parameter of its own).
    assert sum(s.bytes_sent > 0 for s in scatters) == layers

    model, scatters = sharded(lambda: fsdp.ReduceScatter(method="topk_ef", density=0.05))
    loss_falls(model, rank, 40)
    params = sum(p.numel() for p in model.parameters())
    per_step = sum(s.bytes_sent for s in scatters) / 40
    assert per_step < 0.25 * 4 * params, (per_step, params)  # dense reduce-scatter input: 4 bytes a parameter
    # Each rank keeps the residual of the whole (unsharded) group: 4 bytes a parameter...
    assert sum(s.memory_bytes()["state"] for s in scatters) == 4 * params

    # ... or, stored in 8 bits with a scale per block of 64, 1 + 1/64 (rounded up per group).
    model, scatters = sharded(lambda: fsdp.ReduceScatter(method="topk_ef", density=0.05, memory_bits=8))
    loss_falls(model, rank, 40)
    state = sum(s.memory_bytes()["state"] for s in scatters)
    assert params + params // 64 <= state <= params + params // 64 + len(scatters), (state, params)
    assert all(s.memory_bytes()["total"] >= s.memory_bytes()["state"] for s in scatters)


class Gated(torch.nn.Module):
    """Three layers in one parameter group, the middle one used only where ``use_middle``."""

    def __init__(self):
        super().__init__()
        self.first, self.middle, self.last = torch.nn.Linear(32, 64), torch.nn.Linear(64, 64), torch.nn.Linear(64, 4)
        self.use_middle = True

    def forward(self, x):
        h = torch.relu(self.first(x))
        if self.use_middle:
            h = torch.relu(self.middle(h))
        return self.last(h)


def check_unused_parameters(rank, world):
    """A parameter group some of whose parameters get no gradient in a step: FSDP leaves
    them out of its reduce-scatter, whose input is then smaller, and gradcomp refuses it
    on every rank, saying how to keep them in; kept in (set_reduce_scatter_unused_params),
    training at density 1 follows single-process SGD, the unused layer unchanged in the
    steps that skip it."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    if not hasattr(FSDPModule, "set_reduce_scatter_unused_params"):
        return

    def sharded_gated(keep_unused):
        torch.manual_seed(0)
        model = Gated()
        fully_shard(model)  # one parameter group: every layer
        model.set_custom_reduce_scatter(fsdp.ReduceScatter(method="topk_ef", density=1.0))
        model.set_reduce_scatter_unused_params(keep_unused)
        return model

    model = sharded_gated(False)
    x, y = batch_of(rank, 0)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    model.use_middle = False
    text = expect_error(lambda: torch.nn.functional.cross_entropy(model(x), y).backward(),
                        gradcomp.InvalidArgumentError, "gradcomp: fsdp ReduceScatter: this instance compresses a "
                        "parameter group of")
    assert text.endswith("call set_reduce_scatter_unused_params(True) on it)"), text

    def gate(step, model, single):  # the middle layer in even steps only
        model.use_middle = single.use_middle = step % 2 == 0

    model = sharded_gated(True)
    torch.manual_seed(0)
    follows_single_process_sgd(model, rank, world, 4, world, single=Gated(), before_step=gate, rtol=1e-5, atol=1e-6)


def check_training_settled_by_step(rank, world):
    """FSDP2 training with settle="step" (one read at each backward pass's end): at
    density 1 the parameters follow single-process SGD on the mean gradient; at density
    0.05 the loss falls, also after a NaN on one rank, which makes backward() raise the
    same error on every rank and adds nothing to the gradients."""
    queued = []  # the calls queued for their backward pass's end: all but each group's first
    settle_at_end = fsdp._settle_at_backward_end
    fsdp._settle_at_backward_end = lambda *call: (queued.append(call[0]), settle_at_end(*call))
    try:
        model, scatters = sharded(lambda: fsdp.ReduceScatter(method="topk_ef", density=1.0, settle="step"))
        layers = follows_single_process_sgd(model, rank, world, 5, world, rtol=1e-5, atol=1e-6)
    finally:
        fsdp._settle_at_backward_end = settle_at_end
    assert sum(s.stats()["calls"] for s in scatters) == 5 * layers and len(queued) == 4 * layers

    model, scatters = sharded(lambda: fsdp.ReduceScatter(method="topk_ef", density=0.05, settle="step"))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for step in range(40):
        x, y = batch_of(rank, step % 8)
        if step == 3 and rank == world - 1:
            x = x.clone()
            x[0, 0] = float("nan")
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if step == 3:
            text = expect_error(loss.backward, gradcomp.NonFiniteError, "gradcomp: compress: grad (or its error")
            assert text.endswith(f"(rank {world - 1} of {world})"), text
            for p in model.parameters():  # the refused calls' shards were zeros
                assert p.grad is None or torch.equal(p.grad.to_local(), torch.zeros_like(p.grad.to_local()))
            opt.zero_grad()
            continue
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert np.mean(losses[-8:]) < 0.85 * np.mean(losses[:8]), losses


def check_compiled_training(rank, world):
    """FSDP2 with gradcomp's reduce-scatter under torch.compile (aot_eager: Dynamo's graphs
    and AOTAutograd's backward, with no code generated): at density 1 the parameters
    follow single-process SGD on the mean gradient; at density 0.05 the loss falls."""
    model, scatters = sharded(lambda: fsdp.ReduceScatter(method="topk_ef", density=1.0))
    layers = follows_single_process_sgd(torch.compile(model, backend="aot_eager"), rank, world, 4, world, rtol=1e-5,
                                        atol=1e-6)
    assert sum(s.stats()["calls"] for s in scatters) == 4 * layers
    model, scatters = sharded(lambda: fsdp.ReduceScatter(method="topk_ef", density=0.05))
    loss_falls(torch.compile(model, backend="aot_eager"), rank, 40)


def check_divide_factor_and_bf16_reduce(rank, world):
    """FSDP's set_gradient_divide_factor (a PREMUL_SUM reduce-scatter) and a bfloat16
    reduce dtype, at density 1: the parameters follow single-process SGD on the sum of
    the ranks' gradients divided by the factor (to bfloat16 rounding)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    factor = 2.0 * world
    policy = MixedPrecisionPolicy(reduce_dtype=torch.bfloat16)
    model, scatters = sharded(lambda: fsdp.ReduceScatter(method="topk_ef", density=1.0), divide_factor=factor,
                              mp_policy=policy)
    layers = follows_single_process_sgd(model, rank, world, 4, factor, rtol=2e-2, atol=2e-3)
    assert sum(s.stats()["calls"] for s in scatters) == 4 * layers


def check_hsdp_replicas_compressed(rank, world):
    """Hybrid sharding with the replicas' all-reduce compressed: 2 replicas of 2 shards,
    each FSDPModule sharded over its replica's ranks with gradcomp's reduce-scatter and
    an AllReduce hook over the replicate group. At density 1 the parameters follow
    single-process SGD on the mean gradient of all ranks; at density 0.05 the loss
    falls, the replicas stay identical, and a NaN on one rank is every rank's error.
    Settled by step (each backward pass's calls of both kinds settled at its end) the
    same."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule

    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    replicas = mesh["replicate"].get_group()

    def hybrid(density, settle=None):
        model, _ = sharded(lambda: fsdp.ReduceScatter(method="topk_ef", density=density, settle=settle),
                           mesh=mesh["shard"])
        hooks = []
        for module in model.modules():
            if isinstance(module, FSDPModule):
                hooks.append(fsdp.AllReduce(replicas, method="topk_ef", density=density, settle=settle))
                module.set_all_reduce_hook(hooks[-1])
        return model, hooks

    def replicas_equal(model):
        mine = full_parameters(model).detach()
        every = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)
        return all(torch.equal(p, every[0]) for p in every)

    model, hooks = hybrid(1.0)
    layers = follows_single_process_sgd(model, rank, world, 4, world, rtol=1e-5, atol=1e-6)
    assert sum(h.bytes_sent > 0 for h in hooks) == layers

    model, hooks = hybrid(0.05)
    loss_falls(model, rank, 30)
    assert replicas_equal(model)

    queued = []  # the all-reduces queued for their backward pass's end: all but each group's first
    settle_at_end = fsdp._settle_at_backward_end
    fsdp._settle_at_backward_end = lambda *call: (queued.append(call[0]), settle_at_end(*call))
    try:
        model, step_hooks = hybrid(1.0, settle="step")
        assert follows_single_process_sgd(model, rank, world, 4, world, rtol=1e-5, atol=1e-6) == layers
    finally:
        fsdp._settle_at_backward_end = settle_at_end
    assert sum(isinstance(call, fsdp.AllReduce) for call in queued) == 3 * layers
    assert sum(h.stats()["calls"] for h in step_hooks) == 4 * layers
    model, step_hooks = hybrid(0.05, settle="step")
    loss_falls(model, rank, 30)
    assert replicas_equal(model)

    hook = hooks[1]  # the first layer's (the root holds no parameter)
    shard = torch.ones(hook.compressor.numel)
    if mesh["replicate"].get_local_rank() == 0:  # one rank of each replicate group
        shard[3] = float("inf")
    before = hook.compressor.corrector_state(0).clone()
    expect_error(lambda: hook(shard), gradcomp.NonFiniteError,
                 "gradcomp: compress: grad[3] = inf is not finite (rank 0 of 2)")
    assert torch.equal(hook.compressor.corrector_state(0), before) and shard[0] == 1.0



def check_all_reduce_settled_by_step(rank, world):
    """AllReduce(settle="step") called in backward passes, against the reference of the
    global top-k with blocks and parts carrying what fits (docs/algorithms.md, "Carrying
    what fits"): after a first call (settled at once, agreeing the room and the
    capacity), a rank's block for a region carries the first `room` of its entries
    there, the selection is the top-k of the carried sums cut to the first `capacity`
    of each region's part, and each rank commits only the selected entries it carried;
    the output is written before anything is read and the step committed at the pass's
    end. A NaN on one rank zeros the output and raises the same error on every rank from
    backward(), the residuals unchanged."""
    import bisect

    n = 6007
    group = dist.group.WORLD
    hook = fsdp.AllReduce(group, method="topk_ef", density=0.01, settle="step")
    e = [np.zeros(n, dtype=np.float32) for _ in range(world)]
    bounds = [j * n // world for j in range(world + 1)]
    roomy = lambda need: need + need // 8 + 16  # noqa: E731
    sizes = {"room": 0, "capacity": 0}
    seen_cases = set()

    def grad(r, step):
        """Gradients the ranks largely share; rank 0's a hundredth of the others', at
        steps 3 and 4 crowding the upper half (its blocks leave out entries that others
        send, sum and select)."""
        g = grad_of(0, step, n) + 0.25 * grad_of(r + 1, step, n)
        if r == 0:
            g = g * torch.where(torch.arange(n) >= n // 2, 0.1 if step in (3, 4) else 0.01, 0.01).float()
        return g

    def expected(step, k, carry):
        """The output of a step with `k` selected (blocks and parts carrying what fits
        where `carry`), `e` and the regions updated; the most entries a rank had for a
        region and the largest part of the uncut selection."""
        region_of = lambda i: bisect.bisect_right(bounds, i) - 1  # noqa: E731
        sums, seen = np.zeros(n, dtype=np.float32), np.zeros(n, dtype=bool)
        carried, left_out, largest = [[] for _ in range(world)], [[] for _ in range(world)], 0
        for r in range(world):
            e[r] = (e[r] + grad(r, step).numpy()).astype(np.float32)
            counts = [0] * world
            for i in reference.top_k(e[r], k):
                j = region_of(i)
                counts[j] += 1
                largest = max(largest, counts[j])
                if carry and counts[j] > sizes["room"]:
                    left_out[r].append(i)
                    continue
                sums[i] = np.float32(sums[i] + e[r][i]) if seen[i] else e[r][i]
                seen[i] = True
                carried[r].append(i)
        union = np.flatnonzero(seen)
        full = np.sort(union[np.lexsort((union, -np.abs(sums[union].astype(np.float64))))[:k]])
        parts, longest, chosen = [0] * world, 0, []
        for i in full:
            j = region_of(i)
            parts[j] += 1
            longest = max(longest, parts[j])
            if carry and parts[j] > sizes["capacity"]:
                seen_cases.add("part cut")
                continue
            chosen.append(int(i))
        out = np.zeros(n, dtype=np.float32)
        out[chosen] = np.float32(1.0 / world) * sums[chosen]
        kept = set(chosen)
        for r in range(world):
            for i in carried[r]:
                if i in kept:
                    e[r][i] = 0.0
            if any(i in kept for i in left_out[r]):
                seen_cases.add("left-out entry selected")
            if left_out[r]:
                seen_cases.add("block carried part")
        if chosen:
            for j in range(1, world):
                bounds[j] = chosen[j * len(chosen) // world]
        return out, largest, longest

    for step in range(6):
        density = 0.01 if step < 2 else 0.03
        hook.set_density(density)
        k = reference.k_for(density, n)
        want, largest, longest = expected(step, k, step > 0)
        out = grad(rank, step)
        committed = hook.compressor.step if hook.compressor is not None else 0

        def call(out=out, want=want, committed=committed, step=step):  # run in this iteration's backward
            hook(out)
            if step > 0:  # written, not yet committed
                np.testing.assert_array_equal(out.numpy(), want)
                assert hook.compressor.step == committed

        in_one_backward(call)
        np.testing.assert_array_equal(out.numpy(), want)
        np.testing.assert_array_equal(hook.compressor.corrector_state(0).numpy(), e[rank])
        assert hook.compressor.step == committed + 1
        if step == 0:  # settled at once, running again with room for its blocks, then its parts
            sizes["room"], sizes["capacity"] = roomy(largest), min(k, roomy(longest))
        elif largest > sizes["room"] or longest > sizes["capacity"]:
            if largest > sizes["room"]:
                sizes["room"] = roomy(largest)
            if longest > sizes["capacity"]:
                sizes["capacity"] = min(k, roomy(longest))
        else:
            if roomy(largest) < sizes["room"] // 2:
                sizes["room"] = roomy(largest)
            if roomy(longest) < sizes["capacity"] // 2:
                sizes["capacity"] = min(k, roomy(longest))
    assert {"block carried part", "part cut"} <= seen_cases, seen_cases
    if world > 1:
        assert "left-out entry selected" in seen_cases, seen_cases

    # A backward pass that raises after a call was queued never reaches its end: the
    # call's step is dropped when the instance is called again, nothing committed, and
    # the calls go on as if it had not been made (the regions it cut put back).
    memory = hook.compressor.corrector_state(0).clone()
    in_raising_backward(lambda: hook(grad(rank, 8)))
    assert torch.equal(hook.compressor.corrector_state(0), memory)
    want, _, _ = expected(10, k, True)
    out = grad(rank, 10)
    in_one_backward(lambda: hook(out))
    np.testing.assert_array_equal(out.numpy(), want)
    np.testing.assert_array_equal(hook.compressor.corrector_state(0).numpy(), e[rank])

    # Ranks that disagree on the global selection's size (a density set on the last rank
    # alone, the exchange's k following it): zeros out, the same error on every rank from
    # backward(), nothing committed.
    if world > 1:
        memory = hook.compressor.corrector_state(0).clone()
        if rank == world - 1:
            hook.set_density(0.02)
        out = grad(rank, 11)
        expect_error(lambda: in_one_backward(lambda: hook(out)), gradcomp.InvalidArgumentError,
                     f"gradcomp: sparse_allreduce: ranks disagree on k: rank 0 has {k}, rank {world - 1} has "
                     f"{reference.k_for(0.02, n)}")
        assert torch.equal(out, torch.zeros(n))
        assert torch.equal(hook.compressor.corrector_state(0), memory)
        hook.set_density(0.03)

    # A NaN on the last rank: zeros out, the same error on every rank from backward(),
    # nothing committed.
    memory = hook.compressor.corrector_state(0).clone()
    bad = grad(rank, 9)
    if rank == world - 1:
        bad[5] = float("nan")
    expect_error(lambda: in_one_backward(lambda: hook(bad)), gradcomp.NonFiniteError,
                 f"gradcomp: compress: grad (or its error feedback) holds a NaN or infinity (rank {world - 1} of "
                 f"{world})")
    assert torch.equal(bad, torch.zeros(n))
    assert torch.equal(hook.compressor.corrector_state(0), memory)
    expect_error(lambda: fsdp.AllReduce(group, settle="later"), gradcomp.InvalidArgumentError,
                 "gradcomp: fsdp AllReduce: settle must be 'step', 'call' or None, got 'later'")

def check_workspace_given_back(rank, world):
    """Each call gives its workspace back (the default): the shards and the residuals are
    those of an instance that keeps it (``keep_workspace=True``, itself checked against the
    reference above), bit for bit, over steps with a density change, in float32 and in
    8-bit memory; between calls the instance holds its state and a few per-tile bytes,
    the one that keeps its workspace several bytes per element."""
    shard_n = 3001
    n = shard_n * world
    group = dist.group.WORLD
    for options in ({}, {"memory_bits": 8}):
        kept = fsdp.ReduceScatter(method="topk_ef", density=0.02, keep_workspace=True, **options)
        given = fsdp.ReduceScatter(method="topk_ef", density=0.02, **options)
        for step in range(5):
            if step == 3:
                kept.set_density(0.05)
                given.set_density(0.05)
            want, got = torch.empty(shard_n), torch.empty(shard_n)
            kept(want, grad_of(rank, step, n), group, dist.ReduceOp.AVG)
            given(got, grad_of(rank, step, n), group, dist.ReduceOp.AVG)
            assert torch.equal(got, want), (options, step)
            assert torch.equal(given.compressor.corrector_state(0), kept.compressor.corrector_state(0))
            held, whole = given.memory_bytes(), kept.memory_bytes()
            assert held["state"] == whole["state"], (held, whole)
            assert held["workspace"] <= 65536, held
            assert whole["workspace"] >= 4 * n, whole
    expect_error(lambda: fsdp.ReduceScatter(keep_workspace=1), gradcomp.InvalidArgumentError,
                 "gradcomp: fsdp ReduceScatter: keep_workspace must be a bool, got an int")


def check_compressed_memory_against_reference(rank, world):
    """ReduceScatter with its residual in 8 and in 4 bits (``memory_bits``, blocks of 64
    and of 8): each rank's shard and its stored residual equal the reference (top-k with
    error feedback whose residual is stored in blocks after every step, by
    docs/algorithms.md's "Compressed memory"), bit for bit, over steps with each call
    giving its workspace back; the memory is bits / 8 + 1 / block bytes per element."""
    shard_n, density = 1001, 0.02
    n = shard_n * world
    k = reference.k_for(density, n)
    group = dist.group.WORLD
    for bits, block in ((8, 64), (4, 8)):
        rs = fsdp.ReduceScatter(method="topk_ef", density=density, memory_bits=bits, memory_block=block)
        e = [np.zeros(n, dtype=np.float32) for _ in range(world)]
        for step in range(4):
            sums = reference_step(e, step, n, k, world, stored=(bits, block))
            out = torch.full((shard_n,), 7.0)
            rs(out, grad_of(rank, step, n), group, dist.ReduceOp.AVG)
            mine = sums[rank * shard_n:(rank + 1) * shard_n]
            np.testing.assert_array_equal(out.numpy(), np.float32(1.0 / world) * mine)
            np.testing.assert_array_equal(rs.compressor.corrector_state(0).numpy(), e[rank])
        assert rs.memory_bytes()["state"] == -(-n * bits // 8) + -(-n // block), rs.memory_bytes()


def check_disagreeing_ranks(rank, world):
    """Ranks whose reduce-scatters are configured differently (another method, another
    error memory) or that hold another group size raise the same error on every rank,
    naming what differs, with every shard and residual unchanged; the instances go on
    after. The density may differ by rank: each rank sends its own k entries, which the
    sums take as they come (the C++ exchange's reduce_scatter, test_mpi.cpp)."""
    shard_n = 400
    n = shard_n * world
    last = world - 1
    group = dist.group.WORLD
    cases = [({"method": "topk_ef"}, {"method": "dgc"}),
             ({"method": "topk_ef"}, {"method": "topk_ef", "memory_bits": 8}),
             ({"method": "topk_ef", "memory_bits": 8}, {"method": "topk_ef", "memory_bits": 4})]
    for others, mine in cases:
        rs = fsdp.ReduceScatter(density=0.05, **(mine if rank == last else others))
        out = torch.full((shard_n,), 7.0)
        expect_error(lambda rs=rs, out=out: rs(out, grad_of(rank, 0, n), group, dist.ReduceOp.AVG),
                     gradcomp.InvalidArgumentError,
                     "gradcomp: sparse_allreduce: ranks disagree on the policies: rank 0 has ")
        assert torch.equal(out, torch.full((shard_n,), 7.0)) and rs.compressor.step == 0
        assert not rs.compressor.corrector_state(0).any() and rs.stats()["calls"] == 0
    # Another group size on one rank: refused on every rank, nothing changed; then all go on.
    rs = fsdp.ReduceScatter(method="topk_ef", density=0.05)
    twin = fsdp.ReduceScatter(method="topk_ef", density=0.05)
    for instance in (rs, twin):
        instance(torch.empty(shard_n), grad_of(rank, 0, n), group, dist.ReduceOp.AVG)
    odd_n = n + (world if rank == last else 0)
    odd = fsdp.ReduceScatter(method="topk_ef", density=0.05)
    out = torch.full((odd_n // world,), 7.0)
    expect_error(lambda: odd(out, grad_of(rank, 1, odd_n), group, dist.ReduceOp.AVG), gradcomp.InvalidArgumentError,
                 f"gradcomp: sparse_allreduce: ranks disagree on n: rank 0 has {n}, rank {last} has {n + world}")
    assert torch.equal(out, torch.full((odd_n // world,), 7.0)) and odd.compressor.step == 0
    a, b = torch.empty(shard_n), torch.empty(shard_n)
    rs(a, grad_of(rank, 1, n), group, dist.ReduceOp.AVG)
    twin(b, grad_of(rank, 1, n), group, dist.ReduceOp.AVG)
    assert torch.equal(a, b) and torch.equal(rs.compressor.corrector_state(0), twin.compressor.corrector_state(0))


def check_on_device(device):
    """The scenario "cuda" (test_cuda.py; ranks sharing the one GPU over gloo): ReduceScatter
    and AllReduce on ``device`` tensors give what they give on CPU tensors, bit for bit
    (the shards, the residuals), over steps: float32 and 8-bit error memory, DGC, bfloat16
    gradients, the workspace kept (the default on CUDA) and given back; a checkpoint of the
    device instance resumes on the CPU bit for bit; a NaN on one rank raises the same error
    on every rank with the shard and the residual unchanged."""
    def check(rank, world):
        shard_n = 1001
        n = shard_n * world
        group = dist.group.WORLD
        cases = [("topk_ef", {}, torch.float32, None), ("topk_ef", {"memory_bits": 8}, torch.float32, False),
                 ("dgc", {}, torch.float32, None), ("topk_ef", {}, torch.bfloat16, None),
                 ("topk_ef", {"memory_bits": 4}, torch.bfloat16, False)]
        for method, options, dtype, keep in cases:
            on_device = fsdp.ReduceScatter(method=method, density=0.02, keep_workspace=keep, **options)
            on_cpu = fsdp.ReduceScatter(method=method, density=0.02, keep_workspace=keep, **options)
            for step in range(3):
                g = grad_of(rank, step, n).to(dtype)
                got, want = torch.full((shard_n,), 7.0, device=device), torch.full((shard_n,), 7.0)
                on_device(got, g.to(device), group, dist.ReduceOp.AVG)
                on_cpu(want, g, group, dist.ReduceOp.AVG)
                assert got.device.type == torch.device(device).type
                assert torch.equal(got.cpu(), want), (method, options, dtype, step)
                for a in range(2 if method == "dgc" else 1):
                    assert torch.equal(on_device.compressor.corrector_state(a).cpu(),
                                       on_cpu.compressor.corrector_state(a)), (method, options, dtype, step, a)
            resumed = fsdp.ReduceScatter(method=method, density=0.02, keep_workspace=keep, **options)
            resumed.load_state_dict(on_device.state_dict())  # made on the CPU at its first call
            got, want = torch.empty(shard_n), torch.empty(shard_n)
            resumed(got, grad_of(rank, 3, n).to(dtype), group, dist.ReduceOp.AVG)
            on_cpu(want, grad_of(rank, 3, n).to(dtype), group, dist.ReduceOp.AVG)
            assert torch.equal(got, want), (method, options, dtype, "resumed")

        rs = fsdp.ReduceScatter(method="topk_ef", density=0.02)
        rs(torch.empty(shard_n, device=device), grad_of(rank, 0, n).to(device), group, dist.ReduceOp.AVG)
        memory = rs.compressor.corrector_state(0).clone()
        bad = grad_of(rank, 1, n)
        if rank == world - 1:
            bad[5] = float("nan")
        out = torch.full((shard_n,), 7.0, device=device)
        expect_error(lambda: rs(out, bad.to(device), group, dist.ReduceOp.AVG), gradcomp.NonFiniteError,
                     f"gradcomp: compress: grad[5] = nan is not finite (rank {world - 1} of {world})")
        assert torch.equal(out.cpu(), torch.full((shard_n,), 7.0))
        assert torch.equal(rs.compressor.corrector_state(0), memory)

        # Settled by step (the default on CUDA) inside backward passes, against CPU tensors
        # settled by step, bit for bit: the shards written before the read, the residuals
        # committed at the end, the blocks outgrown at step 2 (the density triples).
        on_device = fsdp.ReduceScatter(method="topk_ef", density=0.01)
        on_cpu = fsdp.ReduceScatter(method="topk_ef", density=0.01, settle="step")
        for step in range(4):
            for instance in (on_device, on_cpu):
                instance.set_density(0.01 if step < 2 else 0.03)
            g = grad_of(rank, step, n)
            got, want = torch.empty(shard_n, device=device), torch.empty(shard_n)
            in_one_backward(lambda got=got, want=want, g=g: (on_device(got, g.to(device), group, dist.ReduceOp.AVG),
                                                             on_cpu(want, g, group, dist.ReduceOp.AVG)))
            assert torch.equal(got.cpu(), want), ("settled by step", step)
            assert torch.equal(on_device.compressor.corrector_state(0).cpu(), on_cpu.compressor.corrector_state(0))
        memory = on_device.compressor.corrector_state(0).clone()
        out = torch.full((shard_n,), 7.0, device=device)
        expect_error(lambda: in_one_backward(lambda: on_device(out, bad.to(device), group, dist.ReduceOp.AVG)),
                     gradcomp.NonFiniteError, "gradcomp: compress: grad (or its error feedback) holds a NaN")
        assert torch.equal(out.cpu(), torch.zeros(shard_n))
        assert torch.equal(on_device.compressor.corrector_state(0), memory)

        # HSDP's compressed all-reduce across replicas (here: all ranks one replicate group).
        on_device = fsdp.AllReduce(group, method="topk_ef", density=0.05)
        on_cpu = fsdp.AllReduce(group, method="topk_ef", density=0.05)
        for step in range(3):
            got, want = grad_of(rank, step, shard_n).to(device), grad_of(rank, step, shard_n)
            on_device(got)
            on_cpu(want)
            assert torch.equal(got.cpu(), want), ("AllReduce", step)
            assert torch.equal(on_device.compressor.corrector_state(0).cpu(), on_cpu.compressor.corrector_state(0))
        # ... settled by step, in backward passes, as the density grows (blocks and parts
        # carrying what fits).
        on_device = fsdp.AllReduce(group, method="topk_ef", density=0.02, settle="step")
        on_cpu = fsdp.AllReduce(group, method="topk_ef", density=0.02, settle="step")
        for step in range(4):
            for instance in (on_device, on_cpu):
                instance.set_density(0.02 if step < 2 else 0.06)
            got, want = grad_of(rank, step, shard_n).to(device), grad_of(rank, step, shard_n)
            in_one_backward(lambda got=got, want=want: (on_device(got), on_cpu(want)))
            assert torch.equal(got.cpu(), want), ("AllReduce settled by step", step)
            assert torch.equal(on_device.compressor.corrector_state(0).cpu(), on_cpu.compressor.corrector_state(0))
    return check


SCENARIOS = {
    "compressed-memory": check_compressed_memory_against_reference,
    "disagreement": check_disagreeing_ranks,
    "workspace": check_workspace_given_back,
    "reduce-scatter": check_reduce_scatter_against_reference,
    "16-bit": check_16_bit_gradients,
    "one-instance": check_one_instance_per_group,
    "set-density": check_set_density,
    "training": check_fully_shard_training,
    "unused-parameters": check_unused_parameters,
    "divide-factor": check_divide_factor_and_bf16_reduce,
    "compile": check_compiled_training,
    "hsdp": check_hsdp_replicas_compressed,
    "settled-by-step": check_settled_by_step,
    "all-reduce-settled-by-step": check_all_reduce_settled_by_step,
    "training-settled-by-step": check_training_settled_by_step,
    "cuda": check_on_device("cuda"),
}

