"""gradcomp.torch.fsdp (FSDP2's custom reduce-scatter) on 2 and 4 gloo ranks. FSDP2
(``fully_shard``) is torch 2.x: under Debian's torch 1.13 these tests skip, and
scripts/test.sh runs them again in the torch 2.x environment it creates
(scripts/torch2_env.sh)."""
import pytest
import ranks
import torch

import gradcomp
from gradcomp.torch import fsdp

try:
    from torch.distributed.fsdp import fully_shard  # noqa: F401
    no_fsdp2 = None
except Exception:  # ImportError; torch 1.13's FSDP under Python 3.11 raises ValueError on import
    no_fsdp2 = f"torch {torch.__version__} has no FSDP2 (fully_shard); scripts/test.sh runs these tests under torch 2.x"
needs_fsdp2 = pytest.mark.skipif(no_fsdp2 is not None, reason=no_fsdp2 or "")


def spawn(world, names, tmp_path):
    ranks.spawn("fsdp_workers", world, names, tmp_path, timeout=300)


def test_a_torch_without_fsdp2_is_refused_when_made(monkeypatch):
    """Under a torch whose FSDP2 lacks the hooks (every torch 1.x) both classes refuse to
    be made, naming the torch version; under torch 2.x the same is simulated."""
    if no_fsdp2 is None:
        monkeypatch.setattr(fsdp, "_FSDPModule", None)
    for make, hook in ((lambda: fsdp.ReduceScatter(density=0.01), "set_custom_reduce_scatter"),
                       (lambda: fsdp.AllReduce(None, density=0.01), "set_all_reduce_hook")):
        with pytest.raises(gradcomp.InvalidArgumentError) as caught:
            make()
        assert f"needs FSDP2 with FSDPModule.{hook} (torch 2.x); this is torch {torch.__version__}" in str(caught.value)


@needs_fsdp2
@pytest.mark.parametrize("world", [2, 4])
def test_reduce_scatter_against_reference(world, tmp_path):
    spawn(world, ["reduce-scatter", "compressed-memory", "disagreement", "16-bit", "one-instance", "set-density",
                  "workspace", "settled-by-step", "all-reduce-settled-by-step"], tmp_path)


@needs_fsdp2
@pytest.mark.parametrize("world", [2, 4])
def test_fully_shard_training(world, tmp_path):
    spawn(world, ["training", "unused-parameters", "training-settled-by-step", "divide-factor", "compile"] +
          (["hsdp"] if world == 4 else []), tmp_path)
