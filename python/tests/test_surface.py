"""The Python surface keeps the core's promises: every entry point refuses what it cannot
take with a gradcomp.Error naming the argument, and changes nothing then; autograd's
rules hold where gradcomp writes a tensor; the OpenMP thread count may change between
calls. (DDP's ranks: test_ddp.py.)"""
import io
import threading

import numpy as np
import pytest
import torch

import gradcomp
from gradcomp.torch import Compressor, Warmup, accumulate, ddp, decode, ratio_plan

import reference


def snapshot(c):
    return bytes(c.state_dict()["state"].numpy())


def stepped(method="topk_ef", n=1000, **options):
    c = Compressor(n, method, **options)
    c.compress(torch.randn(n, generator=torch.Generator().manual_seed(1)))
    return c


# -- arguments of the wrong kind: each names the argument and what it got ---------------------

WRONG = [
    ("a list for grad", lambda c: c.compress([0.0] * 1000), "compress: grad must be a torch.Tensor, got a list"),
    ("a NumPy array for grad", lambda c: c.compress(np.zeros(1000, np.float32)),
     "compress: grad must be a torch.Tensor, got a numpy.ndarray"),
    ("None for grad", lambda c: c.stage(None), "stage: grad must be a torch.Tensor, got None"),
    ("a sparse grad", lambda c: c.preview(torch.zeros(1000).to_sparse()), r"preview: grad must be a dense \(strided\)"),
    ("a meta grad", lambda c: c.compress(torch.empty(1000, device="meta")), "compress: grad is on meta"),
    ("set_density(None)", lambda c: c.set_density(None), "set_density: density must be a real number, got None"),
    ("set_density('0.1')", lambda c: c.set_density("0.1"), "set_density: density must be a real number, got a str"),
    ("set_density(True)", lambda c: c.set_density(True), "set_density: density must be a real number, got a bool"),
    ("set_indices('abc')", lambda c: c.set_indices("abc"), "set_indices: indices must be a 1-D integer tensor or a "
     "sequence of ints, got a str"),
    ("set_indices of floats", lambda c: c.set_indices([0.5, 1.7]), r"set_indices: indices\[0\] must be an int, got a "
     "float"),
    ("set_indices of a float tensor", lambda c: c.set_indices(torch.tensor([0.5, 1.7])),
     "set_indices: indices must be a 1-D tensor of integers, got a Float tensor"),
    ("set_indices of a 2-D tensor", lambda c: c.set_indices(torch.tensor([[1, 2], [3, 4]])),
     "set_indices: indices must be a 1-D tensor of integers, got a Long tensor of shape \\[2, 2\\]"),
    ("set_indices beyond 2**32", lambda c: c.set_indices([2**40]), r"set_indices: indices\[0\] = 1099511627776 is not "
     "an index"),
    ("corrector_state('0')", lambda c: c.corrector_state("0"), "corrector_state: array must be an int, got a str"),
    ("a state dict with a missing key", lambda c: c.load_state_dict({"format": "gradcomp.torch.Compressor",
                                                                     "method": "scalecom"}),
     "load_state_dict: the state_dict has no 'numel'"),
    ("a state dict that is a list", lambda c: c.load_state_dict([]), "load_state_dict: not a gradcomp.torch"),
]


@pytest.mark.parametrize("what,call,text", WRONG, ids=[w[0] for w in WRONG])
def test_wrong_kinds_of_argument_are_named_and_change_nothing(what, call, text):
    c = stepped("scalecom", density=0.01)
    before = snapshot(c)
    with pytest.raises(gradcomp.InvalidArgumentError, match=text):
        call(c)
    assert snapshot(c) == before


FREE = [
    ("decode(bytes)", lambda: decode(b"\x00" * 64), "decode: message must be a torch.Tensor, got a bytes "
     r"\(wrap bytes with torch.frombuffer"),
    ("decode(None)", lambda: decode(None), "decode: message must be a torch.Tensor, got None"),
    ("accumulate into a list", lambda: accumulate(torch.zeros(60, dtype=torch.uint8), [0.0]),
     "accumulate: dense must be a torch.Tensor, got a list"),
    ("accumulate with a str scale", lambda: accumulate(torch.zeros(60, dtype=torch.uint8), torch.zeros(3), "2"),
     "accumulate: scale must be a real number, got a str"),
    ("Compressor(2**63)", lambda: Compressor(2**63), r"Compressor: numel must be in \[1, 4294967295\], got "
     "9223372036854775808"),
    ("Compressor(2**40)", lambda: Compressor(2**40), r"Compressor: numel must be in \[1, 4294967295\], got "
     "1099511627776"),
    ("Compressor('10')", lambda: Compressor("10"), "Compressor: numel must be an int, got a str"),
    ("Compressor(10, 5)", lambda: Compressor(10, 5), "Compressor: method must be a str, got an int"),
    ("an int option of 2**63", lambda: Compressor(10, "dgc", seed=2**63), r"Compressor: option seed must be in "
     r"\[-9223372036854775808, 9223372036854775807\], got 9223372036854775808"),
    ("a list option", lambda: Compressor(10, "topk_ef", density=[0.1]), "Compressor: option density must be a bool, "
     "int, float or str, got a list"),
    ("device='nonsense'", lambda: Compressor(10, device="nonsense"), "Compressor: device 'nonsense' is not a device"),
    ("device=3.5", lambda: Compressor(10, device=3.5), "Compressor: device must be a str or torch.device, got a float"),
    ("device='meta'", lambda: Compressor(10, device="meta"), "Compressor: device must be cpu or cuda, got 'meta'"),
    ("Warmup(start=None)", lambda: Warmup(start=None), "Warmup: start must be a real number, got None"),
    ("by_epoch(-1)", lambda: Warmup().by_epoch(-1), r"Warmup.by_epoch: epoch must be in \[0, "),
    ("by_epoch('1')", lambda: Warmup().by_epoch("1"), "Warmup.by_epoch: epoch must be an int, got a str"),
    ("ratio_plan(volumes=3)", lambda: ratio_plan(3, 0.01, 0.001), "ratio_plan: volumes must be a sequence of numbers, "
     "got an int"),
    ("ratio_plan with a None volume", lambda: ratio_plan([1.0, None], 0.01, 0.001),
     r"ratio_plan: volumes\[1\] must be a real number, got None"),
    ("State(start_iter='2')", lambda: ddp.State(start_iter="2"), "State: start_iter must be an int, got a str"),
    ("State(start_iter=-1)", lambda: ddp.State(start_iter=-1), r"State: start_iter must be in \[0, "),
    ("State(method=None)", lambda: ddp.State(method=None), "State: method must be a str, got None"),
    ("State().set_density(2.0)", lambda: ddp.State().set_density(2.0),
     r"exact_topk: density must be in \(0, 1\], got 2"),
    ("State(method='adacomp').set_density(0.1)", lambda: ddp.State(method="adacomp").set_density(0.1),
     "set_density: chunk_local has no density"),
    ("hook(None, bucket)", lambda: ddp.hook(None, None),
     "ddp hook: state must be a gradcomp.torch.ddp.State, got None"),
    ("State('dgc')", lambda: ddp.State("dgc"), r"State: process_group must be a torch.distributed ProcessGroup or "
     r"None, got a str \(the method is a keyword: State\(method='dgc'\)\)"),
    ("State(non_finite='skip')", lambda: ddp.State(non_finite="skip"),
     "State: non_finite must be 'raise' or 'propagate', got 'skip'"),
]


@pytest.mark.skipif(gradcomp.torch._C.cuda, reason="this build has the CUDA backend")
def test_a_cuda_compressor_without_the_cuda_backend_names_why():
    with pytest.raises(gradcomp.InvalidArgumentError, match="Compressor: device cuda:0 needs gradcomp's CUDA backend, "
                       "which this build lacks: it was built "):
        Compressor(10, device="cuda:0")


@pytest.mark.parametrize("what,call,text", FREE, ids=[f[0] for f in FREE])
def test_free_functions_and_constructors_name_what_they_got(what, call, text):
    with pytest.raises(gradcomp.InvalidArgumentError, match=text):
        call()


def test_a_cpu_device_with_an_index_takes_cpu_tensors():
    c = Compressor(100, device="cpu:0")
    assert c.device == torch.device("cpu")
    c.compress(torch.randn(100))


# -- accumulate: aliasing, overflow, autograd, negation bits ----------------------------------

def test_accumulate_refuses_dense_sharing_the_messages_memory():
    n = 1000
    message = stepped(n=n, density=0.05).compress(torch.randn(n))
    storage = torch.zeros(4 * n + message.numel(), dtype=torch.uint8)
    storage[8:8 + message.numel()] = message  # the message inside dense's first entries
    dense = storage[: 4 * n].view(torch.float32)
    before = storage.clone()
    with pytest.raises(gradcomp.InvalidArgumentError, match="accumulate: dense shares memory with the message"):
        accumulate(storage[8:8 + message.numel()], dense)
    assert torch.equal(storage, before)


def test_accumulate_refuses_a_sum_that_overflows_and_changes_nothing():
    n = 1000
    message = Compressor(n, density=0.05).compress(torch.randn(n, generator=torch.Generator().manual_seed(3)) * 4)
    dense = torch.ones(n)
    with pytest.raises(gradcomp.NonFiniteError,
                       match=r"accumulate: dense\[\d+\] \+ scale \* value = 1 \+ 3\.0+\d*e\+38 \* "
                             r"[\d.]+ is not finite; dense is unchanged"):
        accumulate(message, dense, 3e38)
    assert torch.equal(dense, torch.ones(n))
    with pytest.raises(gradcomp.InvalidArgumentError, match=r"scale must be a finite float32, got 9\.9+\d*e\+38"):
        accumulate(message, dense, 1e39)


def test_accumulate_follows_autograds_rules_for_in_place_writes():
    n = 100
    message = Compressor(n, density=0.1).compress(torch.randn(n))
    leaf = torch.zeros(n, requires_grad=True)
    with pytest.raises(gradcomp.InvalidArgumentError, match="accumulate: dense requires grad and grad mode is on"):
        accumulate(message, leaf)
    assert torch.count_nonzero(leaf.detach()) == 0
    with torch.no_grad():  # as an optimizer writes parameters
        accumulate(message, leaf)
    assert torch.count_nonzero(leaf.detach()) == 10

    # A tensor saved for backward and written since: backward raises, as after any in-place op.
    x = torch.randn(n, requires_grad=True)
    y = x * 2
    z = (y * y).sum()  # saves y
    with torch.no_grad():
        accumulate(message, y)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.backward()


def test_tensors_with_a_negation_bit_are_read_as_their_values():
    b = torch.randn(100)
    b[7] = 2.0
    negated = torch._neg_view(b)  # -b, its memory holding b, with the negation bit set
    assert negated.is_neg() and negated.is_contiguous()
    for call in ("compress", "preview"):
        got = getattr(Compressor(100, density=0.01), call)(negated)
        want = getattr(Compressor(100, density=0.01), call)(-b)
        assert torch.equal(got, want), call
    message = Compressor(100, density=0.01).compress(b)
    dense = torch.zeros(100)
    with pytest.raises(gradcomp.InvalidArgumentError, match="dense has its negation bit set"):
        accumulate(message, torch._neg_view(dense))
    assert torch.count_nonzero(dense) == 0
    # A conj().imag view of a complex tensor is strided: refused as such, not misread.
    with pytest.raises(gradcomp.InvalidArgumentError, match="grad must be contiguous"):
        Compressor(100).compress(torch.complex(b, b).conj().imag)


# -- counts, checkpoints, densities -----------------------------------------------------------

def test_a_decimal_density_sends_the_count_it_names():
    # 100 * 0.07 is 7.000000000000001 in double: gradcomp sends 7 (GRACE's int(n d) would too
    # here, but floors every count that is not whole: 0.0123 of 1000 is 12 there, 13 here).
    for n, d in ((100, 0.07), (1000, 0.0123), (3001, 0.001), (100, 0.29)):
        for method in ("topk_ef", "randomk_ef"):
            c = Compressor(n, method, density=d)
            got = decode(c.compress(torch.randn(n)))[0].numel()
            assert got == reference.k_for(d, n), (method, n, d)
    assert reference.k_for(0.07, 100) == 7 and reference.k_for(0.0123, 1000) == 13


def test_checkpoint_records_with_trailing_bytes_are_refused():
    for method, options in (("topk_ef", {}), ("dgc", {"max_norm": 5.0}), ("adacomp", {}), ("scalecom", {}),
                            ("threshold_ef", {"tau": 0.5}), ("randomk_ef", {})):
        c = stepped(method, **options)
        good = c.state_dict()
        target = stepped(method, **options)
        target.compress(torch.randn(1000))
        before = snapshot(target)
        for extra in (b"\x00", b"more"):
            bad = dict(good, state=torch.cat([good["state"], torch.tensor(list(extra), dtype=torch.uint8)]))
            with pytest.raises(gradcomp.CorruptMessageError, match=f"{len(extra)} bytes follow the"):
                target.load_state_dict(bad)
            assert snapshot(target) == before
        target.load_state_dict(good)
        assert snapshot(target) == snapshot(c)


def test_scalecom_takes_a_density_schedule():
    c = Compressor(1000, "scalecom", density=0.01)
    assert c.density == 0.01
    c.set_indices(list(range(10)))
    c.set_density(0.02)
    assert c.density == 0.02
    c.set_indices(list(range(20)))
    assert decode(c.compress(torch.randn(1000)))[0].numel() == 20
    restored = Compressor(1000, "scalecom", density=0.5)
    restored.load_state_dict(c.state_dict())
    assert restored.density == 0.02


# -- OpenMP threads: the count may change between construction and calls ----------------------

def test_raising_the_thread_count_after_construction_changes_no_result():
    saved = torch.get_num_threads()
    n = 50_021  # below 2^16: exact top-k histograms into per-thread bins
    g = [torch.randn(n, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    try:
        torch.set_num_threads(1)
        made_with_one = [Compressor(n, m, density=0.01) for m in ("topk_ef", "dgc")]
        torch.set_num_threads(max(2, saved))
        reference_run = [Compressor(n, m, density=0.01) for m in ("topk_ef", "dgc")]
        for grad in g:
            for a, b in zip(made_with_one, reference_run):
                assert torch.equal(a.compress(grad), b.compress(grad))
    finally:
        torch.set_num_threads(saved)


def test_threads_with_their_own_openmp_setting_share_a_compressor():
    n = 50_021
    grads = [torch.randn(n, generator=torch.Generator().manual_seed(s)) for s in range(8)]
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    shared = Compressor(n, "topk_ef", density=0.01)
    torch.set_num_threads(max(2, saved))
    want = [Compressor(n, "topk_ef", density=0.01).stage(g) for g in grads]  # stage commits nothing
    errors = []

    def work(threads):
        try:
            torch.set_num_threads(threads)  # this thread's OpenMP setting
            for g, w in zip(grads, want):
                assert torch.equal(shared.stage(g), w)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    workers = [threading.Thread(target=work, args=(t,)) for t in (1, 2, 4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    torch.set_num_threads(saved)
    assert not errors, errors


def test_a_state_saves_and_restores_through_torch_save():
    state = ddp.State(method="adacomp", start_iter=0)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    assert torch.load(buffer).method == "adacomp"
