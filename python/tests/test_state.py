"""state_dict round trips through torch.save / torch.load; mismatches are refused."""
import io

import pytest
import torch

import gradcomp
from gradcomp.torch import Compressor


def run(c, seeds):
    out = []
    for s in seeds:
        g = torch.Generator().manual_seed(s)
        out.append(c.compress(torch.randn(c.numel, generator=g)))
    return out


@pytest.mark.parametrize("method,options", [
    ("topk_ef", {"density": 0.01}),
    ("dgc", {"density": 0.01, "max_norm": 3.0, "reuse_threshold": True}),
    ("adacomp", {"bin": 40}),
    ("randomk_ef", {"density": 0.02, "seed": 4}),
    ("compose", {"selector": "exact_topk", "corrector": "low_pass", "beta": 0.3, "value": "qsgd", "levels": 5}),
])
def test_a_restored_compressor_continues_byte_for_byte(method, options):
    n = 5003
    a = Compressor(n, method, **options)
    run(a, range(4))
    if a.density is not None:
        a.set_density(0.05)
    buffer = io.BytesIO()
    torch.save(a.state_dict(), buffer)
    buffer.seek(0)
    b = Compressor(n, method, **options)
    b.load_state_dict(torch.load(buffer))
    assert b.step == a.step == 4
    assert b.density == a.density
    for x, y in zip(run(a, range(4, 9)), run(b, range(4, 9))):
        assert torch.equal(x, y)


def test_other_size_method_or_damage_is_refused_and_changes_nothing():
    a = Compressor(1000, "topk_ef", density=0.01)
    run(a, range(2))
    saved = a.state_dict()
    target = Compressor(1000, "topk_ef", density=0.01)
    run(target, range(5, 6))
    before = bytes(target.state_dict()["state"].numpy())

    def refused(state, error, text):
        with pytest.raises(error, match=text):
            target.load_state_dict(state)
        assert bytes(target.state_dict()["state"].numpy()) == before

    refused(Compressor(999, "topk_ef", density=0.01).state_dict(), gradcomp.InvalidArgumentError,
            "the state is for numel = 999, this compressor has 1000")
    refused(Compressor(1000, "dgc").state_dict(), gradcomp.InvalidArgumentError, "the state is of method 'dgc'")
    other = Compressor(1000, "compose", selector="exact_topk", corrector="momentum").state_dict()
    other["method"] = "topk_ef"
    refused(other, gradcomp.CorruptMessageError, "the state was saved by a compressor of")
    damaged = dict(saved)
    damaged["state"] = saved["state"].clone()
    damaged["state"][len(damaged["state"]) // 2] ^= 0x10
    refused(damaged, gradcomp.CorruptMessageError, "checksum does not match")
    # a damaged byte of the policies' names, quoted by the message, is escaped, not lost
    garbled = dict(saved)
    garbled["state"] = saved["state"].clone()
    garbled["state"][12] ^= 0xFF
    refused(garbled, gradcomp.CorruptMessageError, r'saved by a compressor of "\\x..')
    cut = dict(saved)
    cut["state"] = saved["state"][:-3].clone()
    refused(cut, gradcomp.StateIOError, "the stream ended inside the state record")
    refused({"format": "something else"}, gradcomp.InvalidArgumentError, "not a gradcomp.torch.Compressor state_dict")
