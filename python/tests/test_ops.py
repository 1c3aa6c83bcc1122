"""gradcomp.torch's ops against NumPy references written in reference.py."""
import numpy as np
import pytest
import torch

import gradcomp
from gradcomp.torch import Compressor, Warmup, accumulate, decode, ratio_plan

import reference


def gradient(n, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * torch.exp(1.5 * torch.randn(n, generator=g)) * scale).float()


@pytest.mark.parametrize("n,density", [(1, 0.5), (7, 0.3), (1000, 0.01), (4099, 0.001), (70001, 0.002)])
def test_topk_ef_equals_reference(n, density):
    c = Compressor(n, "topk_ef", density=density)
    ref = reference.TopkErrorFeedback(n)
    k = reference.k_for(density, n)
    for step in range(6):
        g = gradient(n, step)
        idx, values, size = decode(c.compress(g))
        want_idx, want_values = ref.step(g.numpy(), k)
        assert size == n
        assert idx.dtype == torch.int64 and values.dtype == torch.float32
        np.testing.assert_array_equal(idx.numpy(), want_idx)
        np.testing.assert_array_equal(values.numpy(), want_values)
        np.testing.assert_array_equal(c.corrector_state(0).numpy(), ref.e)
    assert c.step == 6


@pytest.mark.parametrize("bits,block", [(8, 64), (4, 8)])
def test_topk_ef_with_its_memory_in_blocks_equals_reference(bits, block):
    n, density = 3001, 0.01
    options = {"density": density, "memory_bits": bits} | ({"memory_block": block} if block != 64 else {})
    c = Compressor(n, "topk_ef", **options)
    assert f"compact<{bits},{block}>(error_feedback" in c.signature
    ref = reference.TopkErrorFeedback(n, stored=(bits, block))
    k = reference.k_for(density, n)
    for step in range(6):
        g = gradient(n, step)
        idx, values, _ = decode(c.compress(g))
        want_idx, want_values = ref.step(g.numpy(), k)
        np.testing.assert_array_equal(idx.numpy(), want_idx)
        np.testing.assert_array_equal(values.numpy(), want_values)
        np.testing.assert_array_equal(c.corrector_state(0).numpy(), ref.e)
    # What it holds: bits / 8 + 1 / block bytes per element, against 4 for float32.
    assert c.memory_bytes()["state"] == -(-n * bits // 8) + -(-n // block)
    assert Compressor(n, "topk_ef", density=density).memory_bytes()["state"] == 4 * n
    memory = c.memory_bytes()
    assert memory["total"] == memory["state"] + memory["workspace"] and memory["workspace"] > 0


@pytest.mark.parametrize("method,options", [("topk_ef", {"density": 0.01, "memory_bits": 8}),
                                            ("dgc", {"density": 0.01, "reuse_threshold": True})])
def test_release_workspace_keeps_the_steps_and_gives_back_the_workspace(method, options):
    """A compressor that gives its workspace back after every step writes the messages
    of one that keeps it (checked against the reference above and by the grid), and
    holds its state and a few per-tile bytes between steps; refused while staged."""
    n = 20011
    kept, given = Compressor(n, method, **options), Compressor(n, method, **options)
    for step in range(5):
        g = gradient(n, step).to(torch.bfloat16 if step == 4 else torch.float32)
        assert torch.equal(kept.compress(g), given.compress(g)), step
        before = given.memory_bytes()
        given.release_workspace()
        after = given.memory_bytes()
        assert after["state"] == before["state"] and after["workspace"] <= 65536 < before["workspace"], (before, after)
    given.stage(gradient(n, 5))
    with pytest.raises(gradcomp.InvalidArgumentError, match="release_workspace: a step is staged"):
        given.release_workspace()
    given.accept_staged()  # still staged after the refusal
    kept.compress(gradient(n, 5))
    assert torch.equal(kept.corrector_state(0), given.corrector_state(0))


def test_memory_bits_is_an_option_of_the_presets_checked_at_construction():
    with pytest.raises(gradcomp.InvalidArgumentError, match="compact: bits must be 8 or 4, got 6"):
        Compressor(1000, "topk_ef", memory_bits=6)
    with pytest.raises(gradcomp.InvalidArgumentError, match="compact: block must be a multiple of 8"):
        Compressor(1000, "dgc", memory_bits=4, memory_block=12)
    with pytest.raises(gradcomp.InvalidArgumentError, match="memory_bits"):
        Compressor(1000, "compose", selector="exact_topk", corrector="error_feedback", memory_bits=8)
    for method in ("topk_ef", "dgc", "adacomp", "randomk_ef", "scalecom"):
        assert "compact<4,64>" in Compressor(1000, method, memory_bits=4).signature


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("method,options", [("topk_ef", {"density": 0.01}), ("dgc", {"density": 0.01, "max_norm": 5.0}),
                                            ("adacomp", {"bin": 50})])
def test_16_bit_gradients_compress_as_their_float32_values(dtype, method, options):
    n = 5003
    narrow = Compressor(n, method, **options)
    wide = Compressor(n, method, **options)
    for step in range(4):
        g = gradient(n, step).to(dtype)
        assert torch.equal(narrow.preview(g), wide.preview(g.float()))
        assert torch.equal(narrow.compress(g), wide.compress(g.float()))
    assert torch.equal(narrow.state_dict()["state"], wide.state_dict()["state"])


def test_dgc_with_exact_topk_equals_reference():
    n, density = 20011, 0.005
    for max_norm in (float("inf"), 5.0):
        c = Compressor(n, "dgc", selector="exact_topk", density=density, momentum=0.9, max_norm=max_norm)
        ref = reference.DgcExactTopk(n, beta=0.9, max_norm=max_norm)
        k = reference.k_for(density, n)
        for step in range(5):
            g = gradient(n, 100 + step)
            idx, values, _ = decode(c.compress(g))
            want_idx, want_values = ref.step(g.numpy(), k)
            if max_norm == float("inf"):
                np.testing.assert_array_equal(idx.numpy(), want_idx)
                np.testing.assert_array_equal(values.numpy(), want_values)
            else:  # the clip's norm is summed in another order: an ulp apart at most
                assert len(set(idx.tolist()) ^ set(want_idx.tolist())) <= 2
                common = np.intersect1d(idx.numpy(), want_idx)
                got = dict(zip(idx.tolist(), values.tolist()))
                want = dict(zip(want_idx.tolist(), want_values.tolist()))
                np.testing.assert_allclose([got[i] for i in common], [want[i] for i in common], rtol=2e-3)


def test_dgc_sampled_threshold_sends_v_within_bounds():
    n, density = 100003, 0.001
    c = Compressor(n, "dgc", density=density)
    ref = reference.DgcExactTopk(n)  # the same memory; the selection is sampled
    k = reference.k_for(density, n)
    for step in range(4):
        g = gradient(n, 200 + step)
        idx, values, _ = decode(c.compress(g))
        ref.u = (ref.beta * ref.u + g.numpy()).astype(np.float32)
        ref.v = (ref.v + ref.u).astype(np.float32)
        assert 0.8 * k <= len(idx) <= 1.3 * k
        np.testing.assert_array_equal(values.numpy(), ref.v[idx.numpy()].astype(np.float16).astype(np.float32))
        # everything sent is at least as large as everything kept
        kept = np.delete(np.abs(ref.v), idx.numpy())
        assert np.min(np.abs(ref.v[idx.numpy()])) >= np.max(kept)
        ref.v[idx.numpy()] -= values.numpy()
        ref.u[idx.numpy()] = 0.0


def test_adacomp_equals_reference():
    n, bin_size = 5003, 50
    c = Compressor(n, "adacomp", bin=bin_size)
    e = np.zeros(n, dtype=np.float32)
    for step in range(4):
        g = gradient(n, 300 + step).numpy()
        acc = (e + g).astype(np.float32)
        want = reference.adacomp(acc, g, bin_size)
        idx, values, _ = decode(c.compress(torch.from_numpy(g)))
        np.testing.assert_array_equal(idx.numpy(), want)
        scale = np.float32(np.mean(np.abs(acc[want].astype(np.float64))))
        np.testing.assert_array_equal(values.numpy(), np.where(np.signbit(acc[want]), -scale, scale))
        e = acc
        e[want] -= values.numpy()


def test_threshold_and_randomk_and_scalecom_send_acc():
    n = 3001
    g = gradient(n, 7)
    idx, values, _ = decode(Compressor(n, "threshold_ef", tau=2.0).compress(g))
    np.testing.assert_array_equal(idx.numpy(), np.nonzero(np.abs(g.numpy()) >= 2.0)[0])
    np.testing.assert_array_equal(values.numpy(), g.numpy()[idx.numpy()])

    a = Compressor(n, "randomk_ef", density=0.01, seed=5)
    b = Compressor(n, "randomk_ef", density=0.01, seed=5)
    ia, va, _ = decode(a.compress(g))
    ib, _, _ = decode(b.compress(gradient(n, 8)))
    assert torch.equal(ia, ib)  # the same seed: the same indices, whatever the data
    assert len(ia) == reference.k_for(0.01, n) and len(set(ia.tolist())) == len(ia)
    np.testing.assert_array_equal(va.numpy(), g.numpy()[ia.numpy()])

    s = Compressor(n, "scalecom", density=0.01, beta=0.5)
    chosen = torch.tensor([3, 17, 400, 3000])
    s.set_indices(chosen)
    idx, values, _ = decode(s.compress(g))
    assert torch.equal(idx, chosen)
    np.testing.assert_array_equal(values.numpy(), g.numpy()[chosen.numpy()])
    m = np.zeros(n, dtype=np.float32)
    sent = np.zeros(n, dtype=np.float32)
    sent[chosen.numpy()] = values.numpy()
    np.testing.assert_allclose(s.corrector_state(0).numpy(), 0.5 * (g.numpy() - sent) + 0.5 * m, rtol=1e-6)


@pytest.mark.parametrize("value", ["f32", "f16", "bf16", "int8", "ternary", "qsgd", "int4"])
@pytest.mark.parametrize("index", ["auto", "raw32", "delta_bitpack", "bitmap"])
def test_every_coding_round_trips_and_the_residual_keeps_the_error(index, value):
    n = 2000
    qsgd = {"levels": 7} if value == "qsgd" else {}
    c = Compressor(n, "compose", selector="exact_topk", corrector="error_feedback", density=0.05, index=index,
                   value=value, checksum=True, **qsgd)
    g = gradient(n, 11)
    idx, decoded, _ = decode(c.compress(g))
    want = reference.top_k(g.numpy(), reference.k_for(0.05, n))
    np.testing.assert_array_equal(idx.numpy(), want)
    exact = g.numpy()[want]
    if value == "f32":
        np.testing.assert_array_equal(decoded.numpy(), exact)
    if value == "f16":
        np.testing.assert_array_equal(decoded.numpy(), exact.astype(np.float16).astype(np.float32))
    if value == "int8":
        scale = np.max(np.abs(exact)) / 127
        assert np.all(np.abs(decoded.numpy() - exact) <= scale / 2 * (1 + 1e-6))
    if value == "int4":  # a scale per block of 128 entries
        for first in range(0, len(exact), 128):
            block = exact[first:first + 128]
            scale = np.max(np.abs(block)) / 7
            assert np.all(np.abs(decoded.numpy()[first:first + 128] - block) <= scale / 2 * (1 + 1e-6))
    # whatever was not sent, exactly, stays in the residual
    residual = c.corrector_state(0).numpy()
    np.testing.assert_array_equal(residual[want], (exact - decoded.numpy()).astype(np.float32))
    unsent = np.setdiff1d(np.arange(n), want)
    np.testing.assert_array_equal(residual[unsent], g.numpy()[unsent])


def test_accumulate_adds_scaled_values():
    n = 1000
    c = Compressor(n, "topk_ef", density=0.05)
    g = gradient(n, 3)
    m = c.compress(g)
    dense = torch.full((n,), 0.25)
    accumulate(m, dense, 0.5)
    want = np.full(n, 0.25, dtype=np.float32)
    idx = reference.top_k(g.numpy(), 50)
    want[idx] += np.float32(0.5) * g.numpy()[idx]
    np.testing.assert_array_equal(dense.numpy(), want)


def test_set_density_and_warmup():
    w = Warmup()
    assert [w.by_epoch(e) for e in range(6)] == [0.25, 0.0625, 0.015625, 0.00390625, 0.001, 0.001]
    assert w.by_step(50, 100) == pytest.approx(0.125)
    n = 10000
    c = Compressor(n, "dgc", density=w.by_epoch(0))
    assert c.density == 0.25
    for epoch in range(5):
        c.set_density(w.by_epoch(epoch))
        _, values, _ = decode(c.compress(gradient(n, epoch)))
        k = reference.k_for(w.by_epoch(epoch), n)
        assert 0.8 * k <= len(values) <= 1.3 * k
    with pytest.raises(gradcomp.InvalidArgumentError, match="warmup: factor must be in"):
        Warmup(factor=1.5)
    with pytest.raises(gradcomp.InvalidArgumentError, match="set_density: chunk_local has no density"):
        Compressor(100, "adacomp").set_density(0.1)


def test_threads_sharing_a_compressor_take_turns():
    # Each call has the compressor to itself and releases the GIL while it works: two
    # threads compressing the same gradient leave the state of as many calls made one
    # after the other, and send the messages those calls send.
    import threading

    n, steps = 1 << 20, 25
    g = torch.randn(n, generator=torch.Generator().manual_seed(5))
    shared = Compressor(n, "dgc", density=0.01, max_norm=3.0)
    alone = Compressor(n, "dgc", density=0.01, max_norm=3.0)
    want = [bytes(alone.compress(g).numpy()) for _ in range(2 * steps)]
    got, failures = [], []

    def work():
        try:
            for _ in range(steps):
                got.append(bytes(shared.compress(g).numpy()))
        except Exception as e:  # noqa: BLE001 (reported below)
            failures.append(e)

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    assert shared.step == 2 * steps
    assert sorted(got) == sorted(want)
    assert torch.equal(shared.state_dict()["state"], alone.state_dict()["state"])


def test_ratio_plan():
    d = ratio_plan([1.0, 1e70], 0.01, 0.001)
    assert d[0] == 0.001 and d[1] == pytest.approx(0.019) and sum(d) <= 0.02
