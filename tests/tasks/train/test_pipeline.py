"""Pipeline splitting: which stages a rank holds, how layers are cut, what each stage keeps."""

from __future__ import annotations

import pytest
import torch

from tasks.llama import Transformer
from tasks.model_config import preset
from tasks.train.pipeline_parallel import layer_split, split_model, stage_ids


def meta_model(**overrides) -> Transformer:
    with torch.device("meta"):
        return Transformer(preset("tiny", vocab_size=64, n_layers=8, **overrides))


def test_one_f_one_b_gives_each_rank_one_stage():
    assert [stage_ids("1F1B", r, 4) for r in range(4)] == [[0], [1], [2], [3]]


def test_interleaved_schedule_loops_stages_round_robin():
    assert [stage_ids("Interleaved1F1B", r, 2) for r in range(2)] == [[0, 2], [1, 3]]


def test_zero_bubble_v_schedule_folds_the_last_stage_back_to_rank_zero():
    assert [stage_ids("ZBVZeroBubble", r, 2) for r in range(2)] == [[0, 3], [1, 2]]


def test_unknown_schedule_names_the_choices():
    with pytest.raises(ValueError, match="1F1B, Interleaved1F1B, ZBVZeroBubble"):
        stage_ids("GPipe2", 0, 2)


def test_layers_are_split_contiguously_with_the_remainder_first():
    assert layer_split(10, 4) == [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]


def test_more_stages_than_layers_is_refused():
    with pytest.raises(ValueError, match="n_layers \\(2\\) is smaller than the number of pipeline stages \\(4\\)"):
        layer_split(2, 4)


def test_stages_keep_full_model_names_and_cover_every_parameter_once():
    whole = meta_model()
    names = []
    for rank in range(2):
        for stage, part in split_model(whole, "Interleaved1F1B", rank, 2):
            names += [n for n, _ in part.named_parameters()]
            assert (part.tok_embeddings is not None) == (stage == 0)
            assert (part.output is not None) == (stage == 3)
    assert sorted(names) == sorted(n for n, _ in whole.named_parameters())


def test_tied_embeddings_cannot_be_pipelined():
    with pytest.raises(ValueError, match="tie_embeddings cannot be used with pipeline parallelism"):
        split_model(meta_model(tie_embeddings=True), "1F1B", 0, 2)
