"""gradcomp.torch.lsgd (Leader SGD) on 2, 3 and 4 gloo ranks against the NumPy simulation
of all ranks in reference.py, bit for bit; errors alike on every rank; checkpoints."""
import pytest
import ranks


def spawn(world, names, tmp_path):
    ranks.spawn("lsgd_workers", world, names, tmp_path, timeout=240)


@pytest.mark.parametrize("world", [2, 4])
def test_whole_parameters_against_the_simulation(world, tmp_path):
    spawn(world, ["whole"], tmp_path)


@pytest.mark.parametrize("world", [2, 4])
def test_compressed_changes_against_the_simulation(world, tmp_path):
    spawn(world, ["compressed"], tmp_path)


@pytest.mark.parametrize("world", [2, 3])
def test_errors_alike_on_every_rank(world, tmp_path):
    spawn(world, ["errors"], tmp_path)


def test_checkpoint_resumes_bit_for_bit(tmp_path):
    spawn(2, ["checkpoint"], tmp_path)
