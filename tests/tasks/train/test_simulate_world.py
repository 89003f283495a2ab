"""One rank of a large job on fake tensors and a fake process group (tasks/train/simulate_world.py): the rank is
the one asked for, the trainer's refusals stay refusals, and on small shapes the simulated peak is what a real
gloo run of the same rank allocates.

What is compared: torch has no allocator statistics for CPU tensors (no ``torch.cpu.memory_*``), so the real
run is measured with the same tracker (FSDPMemTracker) on real tensors, where each storage it counts is one
the CPU allocator was asked for. Equal peaks show the fake run replays the real step: the same tensors, of the
same sizes, alive at the same time.
"""

from __future__ import annotations

import json

import pytest

from tasks.config import from_dict
from tasks.train.config import TrainConfig
from tasks.train.simulate_world import CATEGORIES, measure_step, rank_at, simulate_rank
from tests.tasks.train.ranks import run_ranks

SHAPE = {"dim": 64, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 128, "vocab_size": 256,
         "max_seq_len": 64}


def config(**parallel) -> TrainConfig:
    return from_dict(TrainConfig, {"model_preset": "tiny", "model": SHAPE,
                                   "data": {"seq_len": 64, "global_batch": 8}, "parallel": parallel})


def test_the_rank_asked_for_is_the_one_built():
    cfg = config(tp=2, pp=2, pp_schedule="Interleaved1F1B", dp_shard=-1)
    from tasks.train.parallel_dims import ParallelDims

    dims = ParallelDims.from_config(cfg.parallel, 8)
    rank = rank_at(dims, pp=1, dp_shard=1, tp=1)
    assert rank == 7
    result = simulate_rank(cfg, 8, rank)
    assert result.coordinates == {"pp": 1, "dp_replicate": 0, "dp_shard": 1, "tp": 1}
    assert result.stages == [1, 3]  # the loop placement: stages pp_rank, pp_rank + pp
    assert result.dp_shard == 2 and result.batch["pp_microbatches"] == 4
    assert set(result.by_category) == set(CATEGORIES)
    assert result.peak == sum(result.by_category.values()) > 0
    assert result.by_category["parameters"] > 0 and result.by_category["optimizer"] > 0


def test_a_layout_the_trainer_refuses_is_refused():
    with pytest.raises(ValueError, match="divisible by parallel.tp"):
        simulate_rank(config(tp=8, dp_shard=-1), 16)  # 4 heads over 8 tensor-parallel ranks


def test_more_data_parallel_ranks_shard_the_model_states_further():
    small, large = (simulate_rank(config(dp_shard=-1, activation_checkpoint="full"), world) for world in (2, 8))
    for category in ("optimizer",):
        assert large.by_category[category] < small.by_category[category]


# -- against real gloo ranks ---------------------------------------------------------------------------

LAYOUTS = {
    "one": ({"activation_checkpoint": "full"}, 1, [0]),
    "tp2": ({"tp": 2, "activation_checkpoint": "full"}, 2, [0]),
    "fsdp2": ({"dp_shard": 2, "activation_checkpoint": "full"}, 2, [0]),
    "tp2_fsdp2_full": ({"tp": 2, "dp_shard": -1, "activation_checkpoint": "full"}, 4, [0, 1]),
    "tp2_fsdp2_fp8": ({"tp": 2, "dp_shard": -1, "activation_checkpoint": "none", "float8": "tensorwise"}, 4, [0]),
    "pp2_interleaved_fsdp2": ({"pp": 2, "dp_shard": -1, "pp_schedule": "Interleaved1F1B"}, 4, [0, 2]),
}


def _real_rank(rank: int, parallel: dict, out: str) -> None:
    result = measure_step(config(**parallel), fake=False)
    with open(f"{out}/{rank}.json", "w") as f:
        json.dump({"peak": result.peak, "tracker": result.tracker}, f)


@pytest.mark.slow
@pytest.mark.parametrize("name", LAYOUTS)
def test_the_simulated_peak_is_what_a_real_gloo_rank_allocates(name, tmp_path):
    parallel, world, ranks = LAYOUTS[name]
    run_ranks(world, _real_rank, parallel, str(tmp_path))
    for rank in ranks:
        real = json.loads((tmp_path / f"{rank}.json").read_text())
        simulated = simulate_rank(config(**parallel), world, rank)
        assert simulated.peak == pytest.approx(real["peak"], rel=0.05), (rank, simulated.tracker, real["tracker"])
