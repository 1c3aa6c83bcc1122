"""gradcomp.torch on CUDA tensors: the same bytes as on the CPU, on torch's current
stream, with memory from torch's caching allocator. Skipped without a GPU."""
import io

import pytest
import torch

import gradcomp
from gradcomp import _C
from gradcomp.torch import Compressor, accumulate, decode

pytestmark = pytest.mark.cuda

CASES = [
    ("topk_ef", {"density": 0.01}),
    ("dgc", {"density": 0.01, "max_norm": 3.0}),
    ("dgc", {"density": 0.01, "selector": "exact_topk", "reuse_threshold": True}),
    ("adacomp", {"bin": 50}),
    ("randomk_ef", {"density": 0.02, "seed": 3}),
    ("threshold_ef", {"tau": 2.0}),
    ("topk_ef", {"density": 0.01, "memory_bits": 8}),
    ("dgc", {"density": 0.01, "max_norm": 3.0, "memory_bits": 4, "memory_block": 16}),
    ("compose", {"selector": "exact_topk", "corrector": "low_pass", "beta": 0.5, "value": "qsgd", "levels": 5}),
    ("compose", {"selector": "sampled_threshold", "corrector": "momentum", "nesterov": True, "value": "int8",
                 "index": "delta_bitpack", "checksum": True}),
    ("compose", {"selector": "exact_topk", "corrector": "error_feedback", "density": 0.05, "value": "int4"}),
]


def gradient(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g))


def test_the_build_has_cuda():
    assert _C.cuda, "gradcomp was built without CUDA against a CUDA torch"


@pytest.mark.parametrize("method,options", CASES)
def test_cuda_messages_and_state_equal_the_cpu(method, options):
    n = 100003
    cpu = Compressor(n, method, **options)
    gpu = Compressor(n, method, device="cuda", **options)
    for step in range(4):
        g = gradient(n, step)
        want = cpu.compress(g)
        got = gpu.compress(g.cuda())
        assert got.device.type == "cuda"
        assert torch.equal(got.cpu(), want)
        assert torch.equal(gpu.preview(g.cuda()).cpu(), cpu.preview(g))
    for a in range(cpu._impl.state_arrays):
        assert torch.equal(gpu.corrector_state(a).cpu(), cpu.corrector_state(a))
    # checkpoints move between devices
    buffer = io.BytesIO()
    torch.save(gpu.state_dict(), buffer)
    buffer.seek(0)
    back = Compressor(n, method, **options)
    back.load_state_dict(torch.load(buffer))
    g = gradient(n, 9)
    assert torch.equal(back.compress(g), gpu.compress(g.cuda()).cpu())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_gradients_on_cuda_equal_the_cpu(dtype):
    n = 100003
    cpu = Compressor(n, "dgc", density=0.01, max_norm=3.0)
    gpu = Compressor(n, "dgc", density=0.01, max_norm=3.0, device="cuda")
    for step in range(4):
        g = gradient(n, step).to(dtype)
        assert torch.equal(gpu.preview(g.cuda()).cpu(), cpu.preview(g))
        assert torch.equal(gpu.compress(g.cuda()).cpu(), cpu.compress(g))
    assert torch.equal(gpu.corrector_state(1).cpu(), cpu.corrector_state(1))


def test_decode_and_accumulate_on_cuda():
    n = 50000
    c = Compressor(n, "topk_ef", density=0.01, device="cuda")
    m = c.compress(gradient(n, 1).cuda())
    idx, values, size = decode(m)
    assert idx.device.type == "cuda" and values.device.type == "cuda" and size == n
    dense = torch.full((n,), 0.5, device="cuda")
    accumulate(m, dense, 0.25)
    want = torch.full((n,), 0.5)
    want[idx.cpu()] += 0.25 * values.cpu()
    assert torch.equal(dense.cpu(), want)
    bad = m.clone()
    bad[60] ^= 0xFF
    before = dense.clone()
    with pytest.raises(gradcomp.CorruptMessageError):
        accumulate(bad, dense)
    assert torch.equal(dense, before)


def test_bad_tensors_on_cuda():
    c = Compressor(1000, "topk_ef", device="cuda")
    with pytest.raises(gradcomp.InvalidArgumentError, match="grad is on cpu, expected cuda:0"):
        c.compress(torch.randn(1000))
    before = c.state_dict()["state"].clone()
    g = torch.randn(1000, device="cuda")
    g[5] = float("nan")
    with pytest.raises(gradcomp.NonFiniteError, match=r"grad\[5\] = nan is not finite"):
        c.compress(g)
    assert torch.equal(c.state_dict()["state"], before)


def test_ordered_on_torchs_current_stream():
    n = 1 << 22
    c = Compressor(n, "topk_ef", density=0.001, device="cuda")
    ref = Compressor(n, "topk_ef", density=0.001)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for step in range(3):
            g = torch.randn(n, device="cuda") * (step + 1)  # queued on the side stream
            m = c.compress(g)                               # must see it finished
            m2 = m.clone()                                  # and finish before this
            assert torch.equal(m2.cpu(), ref.compress(g.cpu()))


def test_calls_on_changing_streams_follow_each_other():
    # compress and preview run on whichever stream is current, set_density and the
    # checkpoint calls on the compressor's own: each must see the state the one before
    # wrote, and torch's work after a call must see its output. A long sleep queued
    # first on each stream makes any missing wait show as a wrong message.
    n = 1 << 20
    c = Compressor(n, "dgc", density=0.01, max_norm=3.0, device="cuda")
    ref = Compressor(n, "dgc", density=0.01, max_norm=3.0)
    streams = [torch.cuda.Stream(), torch.cuda.current_stream(), torch.cuda.Stream()]
    dense, dense_ref = torch.zeros(n, device="cuda"), torch.zeros(n)
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())  # dense is made on the default stream
    for step in range(6):
        host = gradient(n, step)
        with torch.cuda.stream(streams[step % 3]):
            torch.cuda._sleep(20_000_000)
            g = host.pin_memory().cuda(non_blocking=True)  # lands after the sleep
            if step == 3:
                c.set_density(0.02)
                ref.set_density(0.02)
            preview = c.preview(g) + 0.0
            m = c.compress(g).clone()
            state = c.state_dict()
            accumulate(m, dense, 0.5)
            # read back on the stream that wrote them
            preview, m, state, total = preview.cpu(), m.cpu(), state["state"].cpu(), dense.cpu()
        assert torch.equal(preview, ref.preview(host))
        assert torch.equal(m, ref.compress(host))
        assert torch.equal(state, ref.state_dict()["state"])
        accumulate(m, dense_ref, 0.5)
        assert torch.equal(total, dense_ref)


def test_accumulate_calls_on_two_streams_follow_each_other():
    # accumulate keeps one workspace per device: a call on one stream must not start
    # while the one before, on another stream, still scatters from it. Large dense
    # messages make that scatter long enough to be overtaken if nothing waits.
    n = 1 << 24
    cpu = Compressor(n, "topk_ef", density=0.5)
    messages = [cpu.compress(gradient(n, 20 + i)) for i in range(2)]
    want = torch.zeros(n)
    for m in messages:
        accumulate(m, want, 1.0)
    on_device = [m.cuda() for m in messages]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for _ in range(3):
        dense = torch.zeros(n, device="cuda")
        for s in streams:
            s.wait_stream(torch.cuda.current_stream())
        for s, m in zip(streams, on_device):
            with torch.cuda.stream(s):
                accumulate(m, dense, 1.0)
        torch.cuda.synchronize()
        assert torch.equal(dense.cpu(), want)


def test_state_memory_comes_from_torchs_allocator():
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    c = Compressor(1 << 22, "dgc", density=0.01, device="cuda")
    assert torch.cuda.memory_allocated() - before >= 3 * 4 * (1 << 22)  # u, v and their next copies at least
    del c
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == before


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_hook_on_cuda_buckets(world, tmp_path):
    """2 and 4 gloo ranks sharing the one GPU (NCCL takes one rank per device)."""
    import test_ddp

    test_ddp.spawn(world, ["cuda"], tmp_path)


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_hook_device_exchange(world, tmp_path):
    """The all-gather exchanged on the device (the step's outcomes read once at its last
    bucket): four buckets in flight against the NumPy reference bit for bit, the
    collectives per step, messages that outgrow the frames, and a NaN in one bucket on one
    rank raising the same error on every rank with no memory changed; then a NaN in a
    single-bucket step, the hook going on after."""
    import test_ddp

    test_ddp.spawn(world, ["cuda-in-flight", "cuda-nan"], tmp_path)


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_resume_on_cuda_on_a_stream_of_its_own(world, tmp_path):
    """A run checkpointed and resumed in new processes on CUDA buckets, every step on a
    stream that is not the default one, ends with the uninterrupted run's parameters bit
    for bit (ddp_features.RESUMES: dense warm-up steps, DDP's buckets regrouped from the
    checkpoint's, the all-gather, the global top-k and ScaleCom). The Futures the hook
    returns must carry the step's stream: one that did not would let DDP read a bucket
    before it is written."""
    import ranks

    env = {"GRADCOMP_TEST_DIR": str(tmp_path), "GRADCOMP_TEST_DEVICE": "cuda"}
    ranks.spawn("ddp_features", world, ["uninterrupted"], tmp_path, timeout=120, env=env)
    ranks.spawn("ddp_features", world, ["resumed"], tmp_path, timeout=120, env=env)


@pytest.mark.parametrize("world", [2, 4])
def test_fsdp_on_cuda_tensors(world, tmp_path):
    """FSDP2's compressed reduce-scatter and HSDP's all-reduce on CUDA tensors, 2 and 4 gloo
    ranks sharing the one GPU: the CPU tensors' shards and residuals bit for bit (float32,
    8- and 4-bit memory, DGC, bfloat16, the workspace kept and given back), a device
    checkpoint resumed on the CPU, and a NaN on one rank every rank's error with nothing
    changed (fsdp_workers.check_on_device)."""
    import test_fsdp

    if test_fsdp.no_fsdp2 is not None:
        pytest.skip(test_fsdp.no_fsdp2)
    test_fsdp.spawn(world, ["cuda"], tmp_path)
