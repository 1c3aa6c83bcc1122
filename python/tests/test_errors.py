"""Bad arguments and hostile messages raise gradcomp errors and change nothing."""
import random

import pytest
import torch

import gradcomp
from gradcomp.torch import Compressor, accumulate, decode


def snapshot(c):
    return bytes(c.state_dict()["state"].numpy())


def make():
    c = Compressor(1000, "dgc", density=0.01, max_norm=5.0)
    c.compress(torch.randn(1000))
    return c


BAD_GRADS = [
    (lambda: torch.randn(1000, dtype=torch.float64), gradcomp.InvalidArgumentError,
     "grad must be a float32, float16 or bfloat16 tensor, got a Double.*convert it with .float"),
    (lambda: torch.zeros(1000, dtype=torch.int32), gradcomp.InvalidArgumentError,
     "grad must be a float32, float16 or bfloat16 tensor, got a Int"),
    (lambda: torch.tensor([0.0] * 999 + [float("inf")]).half(), gradcomp.NonFiniteError,
     r"grad\[999\] = inf is not finite"),
    (lambda: torch.tensor([0.0, float("nan")] + [0.0] * 998).bfloat16(), gradcomp.NonFiniteError,
     r"grad\[1\] = -?nan is not finite"),
    (lambda: torch.randn(999), gradcomp.InvalidArgumentError, "grad has 999 elements, expected 1000"),
    (lambda: torch.randn(2000)[::2], gradcomp.InvalidArgumentError, "grad must be contiguous"),
    (lambda: torch.randn(10, 100), gradcomp.InvalidArgumentError, "grad must be 1-D"),
    (lambda: torch.empty(1000, device="meta"), gradcomp.InvalidArgumentError,
     "grad is on meta; gradcomp reads tensors on cpu and cuda devices"),
    (lambda: torch.randn(1000).to_sparse(), gradcomp.InvalidArgumentError,
     r"grad must be a dense \(strided\) tensor, got a Float tensor of shape \[1000\] on cpu \(layout Sparse\)"),
    (lambda: [0.0] * 1000, gradcomp.InvalidArgumentError, "grad must be a torch.Tensor, got a list"),
    (lambda: None, gradcomp.InvalidArgumentError, "grad must be a torch.Tensor, got None"),
    (lambda: torch.tensor([float("nan")] + [0.0] * 999), gradcomp.NonFiniteError, r"grad\[0\] = nan is not finite"),
    (lambda: torch.tensor([0.0] * 999 + [float("inf")]), gradcomp.NonFiniteError, r"grad\[999\] = inf is not finite"),
]


@pytest.mark.parametrize("bad,error,text", BAD_GRADS)
@pytest.mark.parametrize("call", ["compress", "stage", "preview"])
def test_bad_gradients_raise_and_change_nothing(bad, error, text, call):
    c = make()
    before = snapshot(c)
    with pytest.raises(error, match=text):
        getattr(c, call)(bad())
    assert snapshot(c) == before
    assert c.step == 1
    c.compress(torch.randn(1000))  # and it goes on


def test_errors_are_value_errors_where_the_value_is_wrong():
    assert issubclass(gradcomp.InvalidArgumentError, ValueError)
    assert issubclass(gradcomp.NonFiniteError, ValueError)
    assert issubclass(gradcomp.CorruptMessageError, ValueError)
    assert issubclass(gradcomp.DeviceError, RuntimeError)
    assert all(issubclass(e, gradcomp.Error) for e in (gradcomp.InvalidArgumentError, gradcomp.NonFiniteError,
                                                       gradcomp.CorruptMessageError, gradcomp.StateIOError))


@pytest.mark.parametrize("method,options,text", [
    ("nope", {},
     "method must be one of topk_ef, dgc, adacomp, randomk_ef, threshold_ef, scalecom, compose; got 'nope'"),
    ("topk_ef", {"density": 0.0}, r"exact_topk: density must be in \(0, 1\], got 0"),
    ("topk_ef", {"density": float("nan")}, r"exact_topk: density must be in \(0, 1\], got nan"),
    ("dgc", {"momentum": float("inf")}, "momentum: beta must be finite, got inf"),
    ("dgc", {"max_norm": -1.0}, "clip_norm: max_norm must be > 0, got -1"),
    ("adacomp", {"bin": 0}, "chunk_local: bin must be >= 1, got 0"),
    ("adacomp", {"bin": -3}, "option bin must be >= 0, got -3"),
    ("scalecom", {"density": 1.5}, r"scalecom: density must be in \(0, 1\], got 1.5"),
    ("topk_ef", {"densty": 0.1}, "option densty is not a parameter of method topk_ef"),
    ("topk_ef", {"density": "high"}, "option density must be a number, got a str"),
    ("compose", {}, "method 'compose' needs selector="),
    ("compose", {"selector": "exact_topk", "corrector": "adam"}, "corrector must be one of none"),
    ("compose", {"selector": "exact_topk", "value": "f8"}, "option value must be one of f32"),
    ("compose", {"selector": "exact_topk", "value": "qsgd", "levels": 0}, r"levels must be in \[1, 65536\], got 0"),
    ("compose", {"selector": "exact_topk", "seed": 3}, "option seed is not a parameter of method compose"),
])
def test_bad_options_are_named(method, options, text):
    with pytest.raises(gradcomp.InvalidArgumentError, match=text):
        Compressor(1000, method, **options)


def test_bad_numel():
    with pytest.raises(gradcomp.InvalidArgumentError, match=r"numel must be in \[1, 4294967295\], got 0"):
        Compressor(0)
    with pytest.raises(gradcomp.InvalidArgumentError, match="numel must be an int"):
        Compressor(10.5)


def message_of(value="f32", index="raw32", checksum=False):
    c = Compressor(300, "compose", selector="exact_topk", density=0.05, value=value, index=index, checksum=checksum)
    return c.compress(torch.randn(300))


def expect_refused(message, dense):
    before = dense.clone()
    with pytest.raises(gradcomp.CorruptMessageError):
        decode(message)
    with pytest.raises(gradcomp.CorruptMessageError):
        accumulate(message, dense, 1.0)
    assert torch.equal(dense, before)


def test_hostile_messages_raise_and_leave_dense_unchanged():
    dense = torch.randn(300)
    good = message_of()
    for length in range(0, good.numel()):  # every truncation
        expect_refused(good[:length].clone(), dense)
    checked = message_of(value="ternary", index="delta_bitpack", checksum=True)
    for bit in range(checked.numel() * 8):  # every bit flip of a checksummed message
        flipped = checked.clone()
        flipped[bit // 8] ^= 1 << (bit % 8)
        expect_refused(flipped, dense)
    rng = random.Random(5)
    for _ in range(300):  # garbage
        junk = torch.tensor([rng.randrange(256) for _ in range(rng.randrange(200))], dtype=torch.uint8)
        expect_refused(junk, dense)


def test_accumulate_checks_its_arguments():
    m = message_of()
    dense = torch.zeros(300)
    with pytest.raises(gradcomp.InvalidArgumentError,
                       match="dense.size\\(\\) = 299 does not match the message's n = 300"):
        accumulate(m, torch.zeros(299))
    with pytest.raises(gradcomp.InvalidArgumentError, match="scale must be a finite float32, got inf"):
        accumulate(m, dense, float("inf"))
    with pytest.raises(gradcomp.InvalidArgumentError, match="dense must be a Float tensor"):
        accumulate(m, torch.zeros(300, dtype=torch.float64))
    with pytest.raises(gradcomp.InvalidArgumentError, match="message must be a Byte tensor"):
        decode(m.to(torch.int32))
    assert torch.count_nonzero(dense) == 0


def test_bad_indices_for_scalecom():
    c = Compressor(100, "scalecom", density=0.05)
    with pytest.raises(gradcomp.InvalidArgumentError, match="not below n = 100"):
        c.set_indices(torch.tensor([1, 100]))
    with pytest.raises(gradcomp.InvalidArgumentError, match="does not exceed"):
        c.set_indices(torch.tensor([5, 5]))
    with pytest.raises(gradcomp.InvalidArgumentError, match="is not an index"):
        c.set_indices(torch.tensor([-1]))
    with pytest.raises(gradcomp.InvalidArgumentError, match="set_indices: exact_topk chooses its own indices"):
        Compressor(100, "topk_ef").set_indices(torch.tensor([1]))


def test_accept_without_stage():
    with pytest.raises(gradcomp.InvalidArgumentError, match="no step is staged"):
        Compressor(100).accept_staged()


def test_fsdp_reduce_scatter_refuses_what_is_not_its_input():
    """gradcomp.torch.fsdp.ReduceScatter names a bad argument before any collective (its
    collectives' own checks run on every rank alike: test_fsdp.py, under torch 2.x)."""
    from gradcomp.torch import fsdp

    if fsdp._FSDPModule is None:
        pytest.skip(f"torch {torch.__version__} has no FSDP2: both classes refuse to be made (test_fsdp.py)")
    rs = fsdp.ReduceScatter(method="topk_ef", density=0.1)
    out, grad = torch.zeros(4), torch.ones(8)
    with pytest.raises(gradcomp.InvalidArgumentError, match="output_tensor must be a torch.Tensor, got a list"):
        rs([0.0] * 4, grad, None, None)
    with pytest.raises(gradcomp.InvalidArgumentError, match="input_tensor must be a torch.Tensor, got a str"):
        rs(out, "grad", None, None)
    with pytest.raises(gradcomp.InvalidArgumentError, match="group must be a torch.distributed ProcessGroup, got None"):
        rs(out, grad, None, None)
    with pytest.raises(gradcomp.InvalidArgumentError, match="method must be"):
        fsdp.ReduceScatter(method=3)
    with pytest.raises(gradcomp.InvalidArgumentError, match="density"):
        fsdp.ReduceScatter(density=2.0)
    with pytest.raises(gradcomp.InvalidArgumentError, match="group must be a torch.distributed ProcessGroup, got a s"):
        fsdp.AllReduce("replicas", density=0.1)
    assert torch.equal(out, torch.zeros(4)) and rs.compressor is None
