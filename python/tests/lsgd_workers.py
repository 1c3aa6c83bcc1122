"""What each rank of the Leader SGD tests runs (a spawned process; see test_lsgd.py)."""
import io

import numpy as np
import torch
import torch.nn.functional as F

import gradcomp
from gradcomp.torch.lsgd import LeaderSGD

import reference

PERIOD, GLOBAL_EVERY, C1, C2, WINDOW = 2, 2, 0.25, 0.5, 3


def group_size(world):
    return 2 if world == 4 else 0


def start(rank):
    """Rank `rank`'s model: a Linear(40, 25) of its own initial parameters."""
    torch.manual_seed(100 + rank)
    return torch.nn.Linear(40, 25)


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()


def target(rank, t, n):
    """Where rank's local step t moves its parameters half of the way (float32)."""
    return np.random.default_rng(1000 * rank + t).standard_normal(n).astype(np.float32)


def loss_of(rank, t):
    """Rank's training loss at step t: distinct values, a different rank leading each time."""
    return float(np.random.default_rng(50 + 7 * t + rank).uniform(0.5, 2.0))


def local_step(model, rank, t):
    """p <- p - 0.5 (p - target), in float32 (as the simulation writes it)."""
    with torch.no_grad():
        offset = 0
        want = torch.from_numpy(target(rank, t, sum(p.numel() for p in model.parameters())))
        for p in model.parameters():
            piece = want[offset:offset + p.numel()].view_as(p)
            p.sub_(0.5 * (p - piece))
            offset += p.numel()


def against_simulation(rank, world, density):
    """LeaderSGD on every rank against the simulation of all ranks: parameters, leaders
    and (compressed) references bit for bit at every step."""
    model = start(rank)
    leader = LeaderSGD(model, period=PERIOD, global_every=GLOBAL_EVERY, local_pull=C1, global_pull=C2,
                       group_size=group_size(world), loss_window=WINDOW,
                       compressed=None if density is None else {"density": density})
    sim = reference.LeaderSgd([flat(start(r)) for r in range(world)], PERIOD, GLOBAL_EVERY, C1, C2, group_size(world),
                              density)
    n = sim.x[0].size
    windows = [[] for _ in range(world)]
    rounds = 0
    for t in range(12):
        for r in range(world):
            sim.x[r] = (sim.x[r] - np.float32(0.5) * (sim.x[r] - target(r, t, n))).astype(np.float32)
            windows[r] = (windows[r] + [loss_of(r, t)])[-WINDOW:]
        means = [sum(w) / len(w) for w in windows]
        want = sim.step(means)
        local_step(model, rank, t)
        got = leader.step(loss_of(rank, t))
        np.testing.assert_array_equal(flat(model), sim.x[rank], err_msg=f"step {t}")
        assert got["held"] == (want is not None), (t, got)
        if want is not None:
            rounds += 1
            assert got["group_leader"] == want[0][rank] and got["global_leader"] == want[1], (t, got, want)
            if density is not None:
                g = group_size(world) or world
                np.testing.assert_array_equal(leader._impl.reference(0).numpy(), sim.group_ref[rank // g])
                if sim.global_ref[0] is not None:
                    np.testing.assert_array_equal(leader._impl.reference(1).numpy(), sim.global_ref[0])
    assert rounds == 6 and leader.steps == 12
    if world > 1:
        assert leader.bytes_received > 0 or leader.bytes_sent > 0


def whole(rank, world):
    against_simulation(rank, world, None)


def compressed(rank, world):
    against_simulation(rank, world, 0.05)


def errors(rank, world):
    """A NaN loss on one rank, or another model size on one rank, raises the same error on
    every rank at the round and changes no parameters and no count; bad arguments are
    refused by name."""
    model = start(rank)
    leader = LeaderSGD(model, period=2, loss_window=2)
    leader.step(1.0)
    before, steps = flat(model).copy(), leader.steps
    try:
        leader.step(float("nan") if rank == world - 1 else 1.0)
        raise AssertionError("a NaN loss was accepted")
    except gradcomp.NonFiniteError as e:
        text = str(e)
    assert text == f"gradcomp: leader_exchange: the loss must be finite, got nan (rank {world - 1} of {world})", text
    np.testing.assert_array_equal(flat(model), before)
    assert leader.steps == steps
    assert leader.step(1.5 + rank)["held"]  # the round again, now with finite losses
    if rank == 0:  # the leader, whose parameters stay its own
        np.testing.assert_array_equal(flat(model), before)
    else:
        assert not np.array_equal(flat(model), before)
    # Another model on the last rank: every rank refuses at the round.
    other = torch.nn.Linear(40, 24 if rank == world - 1 else 25)
    mixed = LeaderSGD(other, period=1)
    kept = flat(other).copy()
    try:
        mixed.step(1.0)
        raise AssertionError("models of different sizes were exchanged")
    except gradcomp.InvalidArgumentError as e:
        assert str(e).startswith("gradcomp: leader_exchange: ranks disagree on n: rank 0 has 1025, rank "
                                 f"{world - 1} has 984"), str(e)
    np.testing.assert_array_equal(flat(other), kept)
    refused = (({"period": 0}, "period must be in [1,"), ({"local_pull": 1.5}, "local_pull must be in [0, 1]"),
               ({"group_size": 3}, "group_size must divide"), ({"compressed": {"density": 2.0}}, "density"),
               ({"compressed": {"bogus": 1}}, "bogus"), ({"loss_window": 0}, "loss_window"))
    for kwargs, words in refused:
        if kwargs.get("group_size") == 3 and world == 3:
            continue
        try:
            LeaderSGD(start(rank), **kwargs)
            raise AssertionError(f"{kwargs} was accepted")
        except gradcomp.InvalidArgumentError as e:
            assert words in str(e), (kwargs, str(e))
    for loss in ("1.0", None, torch.ones(2)):
        try:
            leader.step(loss)
            raise AssertionError(f"loss {loss!r} was accepted")
        except gradcomp.InvalidArgumentError as e:
            assert "loss must be a number or a 1-element tensor" in str(e), str(e)


def train(rank, world, steps, resume_at=None):
    """Real training (SGD with momentum, gradients from autograd) of a small regression
    with compressed leaders; resumed from a checkpoint at `resume_at` if given. Returns the
    final parameters."""
    torch.manual_seed(7)
    truth = torch.randn(40, 25)
    model = start(rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    make = lambda m, o: LeaderSGD(m, o, period=2, global_every=2, compressed={"density": 0.1, "value": "f16"})  # noqa
    leader = make(model, optimizer)
    data = torch.Generator().manual_seed(rank)
    first_loss = None
    for t in range(steps):
        x = torch.randn(16, 40, generator=data)
        if t == resume_at:
            buffer = io.BytesIO()
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "leader": leader.state_dict()}, buffer)
            buffer.seek(0)
            saved = torch.load(buffer)
            model = start(rank)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            leader = make(model, optimizer)
            leader.load_state_dict(saved["leader"])
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), x @ truth)
        loss.backward()
        leader.step(loss)
        first_loss = first_loss or float(loss)
    return flat(model), first_loss, float(loss)


def checkpoint(rank, world):
    """Training resumed from a checkpoint (model, optimizer, LeaderSGD) ends bit for bit
    where the uninterrupted run does; the training loss falls."""
    straight, first, last = train(rank, world, 20)
    resumed, _, _ = train(rank, world, 20, resume_at=9)
    np.testing.assert_array_equal(resumed, straight)
    assert last < 0.6 * first, (first, last)


SCENARIOS = {"whole": whole, "compressed": compressed, "errors": errors, "checkpoint": checkpoint}
