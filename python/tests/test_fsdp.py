"""gradcomp.torch.fsdp (FSDP2's custom reduce-scatter) on 2 and 4 gloo ranks. FSDP2
(``fully_shard``) is torch 2.x: under Debian's torch 1.13 these tests skip, and
scripts/test.sh runs them again in the torch 2.x environment it creates
(scripts/torch2_env.sh)."""
import pytest
import ranks
import torch

try:
    from torch.distributed.fsdp import fully_shard  # noqa: F401
except Exception:  # ImportError; torch 1.13's FSDP under Python 3.11 raises ValueError on import
    pytestmark = pytest.mark.skip(reason=f"torch {torch.__version__} has no FSDP2 (fully_shard); scripts/test.sh "
                                         "runs these tests under torch 2.x")


def spawn(world, names, tmp_path):
    ranks.spawn("fsdp_workers", world, names, tmp_path, timeout=300)


@pytest.mark.parametrize("world", [2, 4])
def test_reduce_scatter_against_reference(world, tmp_path):
    spawn(world, ["reduce-scatter"], tmp_path)


@pytest.mark.parametrize("world", [2, 4])
def test_fully_shard_training(world, tmp_path):
    spawn(world, ["training"], tmp_path)
