"""ParallelDims: degrees validated against the world size; the mesh and each rank's coordinates."""

from __future__ import annotations

import pytest
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from tasks.train.config import ParallelConfig
from tasks.train.parallel_dims import ParallelDims


def dims(world_size: int, **degrees) -> ParallelDims:
    return ParallelDims.from_config(ParallelConfig(**degrees), world_size)


def test_dp_shard_minus_one_takes_the_rest_of_the_world():
    d = dims(32, pp=2, tp=4)
    assert (d.pp, d.dp_replicate, d.dp_shard, d.tp) == (2, 1, 4, 4)
    assert d.dp_size == 4


def test_degrees_that_do_not_multiply_to_the_world_size_are_refused():
    with pytest.raises(ValueError, match="do not match the world size 8"):
        dims(8, dp_shard=2, tp=2)


def test_a_world_not_divisible_by_the_fixed_degrees_is_refused():
    with pytest.raises(ValueError, match="world size 6 is not divisible by pp×dp_replicate×tp = 4"):
        dims(6, pp=2, tp=2)


@pytest.mark.parametrize("field", ["pp", "dp_replicate", "tp"])
def test_non_positive_degrees_are_refused(field):
    with pytest.raises(ValueError, match=f"parallel.{field} must be at least 1"):
        dims(4, **{field: 0})


def test_enabled_flags_follow_the_degrees():
    single = dims(1)
    assert not (single.pp_enabled or single.tp_enabled or single.fsdp_enabled or single.hsdp_enabled)
    hsdp = dims(8, dp_replicate=2, tp=2)
    assert hsdp.fsdp_enabled and hsdp.hsdp_enabled and hsdp.tp_enabled and not hsdp.pp_enabled
    replicate_only = dims(2, dp_replicate=2, dp_shard=1)
    assert replicate_only.fsdp_enabled and replicate_only.dp_size == 2


def test_meshes_are_unavailable_before_they_are_built():
    with pytest.raises(RuntimeError, match="build_mesh"):
        dims(1).mesh


@pytest.fixture
def fake_world():
    """A process group of 16 ranks faked inside this process (this process plays rank 13)."""
    dist.init_process_group("fake", store=FakeStore(), rank=13, world_size=16)
    yield
    dist.destroy_process_group()


def test_mesh_names_every_dim_and_places_this_rank(fake_world):
    d = dims(16, pp=2, dp_replicate=2, tp=2)
    mesh = d.build_mesh("cpu")
    assert mesh.mesh_dim_names == ("pp", "dp_replicate", "dp_shard", "tp")
    assert tuple(mesh.shape) == (2, 2, 2, 2)
    # rank 13 = 1·8 + 1·4 + 0·2 + 1: pp 1, dp_replicate 1, dp_shard 0, tp 1
    assert (d.pp_rank, d.tp_rank) == (1, 1)
    assert d.dp_rank == 2  # (dp_replicate 1, dp_shard 0) flattened
    assert d.dp_mesh().size() == 4
    assert d.fsdp_mesh().mesh_dim_names == ("dp_replicate", "dp_shard")


def test_without_replication_fsdp_shards_over_dp_shard_only(fake_world):
    d = dims(16, tp=4)
    d.build_mesh("cpu")
    assert d.fsdp_mesh().mesh_dim_names == ("dp_shard",)
    assert d.fsdp_mesh().size() == 4
