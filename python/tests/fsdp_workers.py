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
        sums = np.zeros(n, dtype=np.float32)
        seen = np.zeros(n, dtype=bool)
        for r in range(world):
            e[r] = (e[r] + grad_of(r, step, n).numpy()).astype(np.float32)
            for i in reference.top_k(e[r], k):
                sums[i] = np.float32(sums[i] + e[r][i]) if seen[i] else e[r][i]
                seen[i] = True
                e[r][i] = 0.0
        op = dist.ReduceOp.AVG if step % 2 == 0 else dist.ReduceOp.SUM
        out = torch.full((shard_n,), 7.0)
        assert rs(out, grad_of(rank, step, n), group, op) is None
        mine = sums[rank * shard_n:(rank + 1) * shard_n]
        want = np.float32(1.0 / world) * mine if op == dist.ReduceOp.AVG else mine
        np.testing.assert_array_equal(out.numpy(), want)
        np.testing.assert_array_equal(rs.compressor.corrector_state(0).numpy(), e[rank])
    assert rs.bytes_sent > 0 and rs.collectives >= 4 * 4
    stats = rs.stats()
    assert stats["calls"] == 4 and stats["elements"] == n and stats["entries_sent"] == k, stats
    assert stats["density"] == k / n and stats["bytes_received"] > 0 and stats["bytes_sent"] == rs.bytes_sent
    memory = rs.state_dict()["state"].clone()
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
    assert torch.equal(rs.state_dict()["state"], memory)


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


def sharded(make_reduce_scatter):
    """The model under fully_shard (each layer, then the root), every FSDPModule's
    reduce-scatter made by ``make_reduce_scatter()``."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    torch.manual_seed(0)
    model = Net()
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    scatters = []
    for module in model.modules():
        if isinstance(module, FSDPModule):
            scatters.append(make_reduce_scatter())
            module.set_custom_reduce_scatter(scatters[-1])
    return model, scatters


def full_parameters(model):
    return torch.cat([p.full_tensor().reshape(-1) for p in model.parameters()])


def check_fully_shard_training(rank, world):
    """FSDP2 training with gradcomp's reduce-scatter. At density 1 every entry is sent:
    the parameters follow single-process SGD on the mean gradient (to float rounding).
    At density 0.05 the loss falls and each rank sends a fraction of the dense bytes."""
    model, scatters = sharded(lambda: fsdp.ReduceScatter(method="topk_ef", density=1.0))
    torch.manual_seed(0)
    single = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    single_opt = torch.optim.SGD(single.parameters(), lr=0.1)
    for step in range(5):
        x, y = batch_of(rank, step)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        single_opt.zero_grad()
        for r in range(world):  # the mean over ranks of each rank's loss gradient
            xr, yr = batch_of(r, step)
            (torch.nn.functional.cross_entropy(single(xr), yr) / world).backward()
        single_opt.step()
        want = torch.cat([p.detach().reshape(-1) for p in single.parameters()])
        torch.testing.assert_close(full_parameters(model).detach(), want, rtol=1e-5, atol=1e-6)
    # Each layer's group went through its ReduceScatter (the root holds no parameter of its own).
    assert sum(s.bytes_sent > 0 for s in scatters) == len(single.layers)

    model, scatters = sharded(lambda: fsdp.ReduceScatter(method="topk_ef", density=0.05))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for step in range(40):
        x, y = batch_of(rank, step % 8)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert np.mean(losses[-8:]) < 0.85 * np.mean(losses[:8]), losses
    params = sum(p.numel() for p in model.parameters())
    per_step = sum(s.bytes_sent for s in scatters) / 40
    assert per_step < 0.25 * 4 * params, (per_step, params)  # dense reduce-scatter input: 4 bytes a parameter


SCENARIOS = {
    "reduce-scatter": check_reduce_scatter_against_reference,
    "training": check_fully_shard_training,
}

